// The data load balancer (partition_data): splits a mixed-type stage's
// micro-batch over its data-parallel replicas in proportion to each
// replica's speed, as Metis does.
//
// Replica i's speed is 1 / (sum of its device type's tp<tp>_bs1 layer times);
// each replica gets floor(bs * share) samples and the remainder goes, one by
// one, to the replicas with the largest fractional parts (ties: lower index).
// A replica's type is its first rank's: StageGrid::rank(i, 0)
// (sim/parallel_layout.h) for the simulator, the search and the executor;
// replica_types_of below for Metis's reference paths.
//
// REQUIRES: strategy.dp <= kMaxReplicas (else std::length_error).
// Thread-safety: pure functions of their arguments; nothing is stored.
#pragma once

#include <vector>

#include "base/limits.h"
#include "sim/plan.h"
#include "sim/profile.h"

namespace hetplan {

// The most data-parallel replicas a stage may have: kMaxReplicas (base/limits.h).

// The profile type of each data-parallel replica of the `size` ranks from
// `begin`, by the Metis reference's rule: replica i starts at rank
// begin + i * (size / dp), the first rank of replica i of a StageGrid of
// tp = size / dp (Metis also calls it with the whole cluster's ranks). Throws
// std::length_error beyond kMaxReplicas.
void replica_types_of(const int* rank_types, int begin, int size, int dp, int* replica_types);

// `replica_types[i]` is the profile type index of replica i's first rank.
// Writes strategy.dp sample counts to `out`. Returns false, with `missing_type`
// set, when a tp<tp>_bs1 profile is absent.
bool partition_data(const ProfileSet& profiles, const int* replica_types, Strategy strategy, int bs, int* out,
                    int* missing_type = nullptr);

// Convenience form over a per-rank list of profile type indices (the whole
// group, dp * tp ranks or more): replica i starts at rank i * (n / dp).
std::vector<int> partition_data(const ProfileSet& profiles, const std::vector<int>& rank_types, Strategy strategy,
                                int bs);

}  // namespace hetplan
