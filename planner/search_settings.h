// The search's training-setting dimensions beyond ZeRO and recomputation
// (planner/plan_search.h's search_setups): overlapped data-parallel
// communication as a dimension, and the label of the sequence-parallel,
// context-parallel and overlap parts of a setting.
//
// Overlap keeps the search exact: with it a stage's data-parallel collectives
// leave a non-negative exposed tail (sim/dp_overlap.h), which the search's
// lower bounds leave out as they leave out the collectives themselves.
// Context parallelism is not searched: the bounds price a replica's share of
// the micro-batch from its own profile, and a cp rank computes 1/cp of a
// larger share, which can cost less (sim/sequence_parallel.md).
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/memory_model.h"
#include "sim/plan.h"
#include "sim/plan_simulator.h"
#include "sim/profile.h"

namespace hetplan {

// `overlap`: "off" (setups unchanged), "on" (every setup overlaps its gradient reduction and, with ZeRO,
// its weight gather) or "auto" (each setup both ways, off first). Throws InputError naming --overlap.
std::vector<TrainingSetup> with_overlap_dimension(const std::vector<TrainingSetup>& setups,
                                                  const std::string& overlap);

// ", sequence parallel", ", cp N", ", overlapped communication" for what the setting turns on ("" for none).
std::string parallel_setup_suffix(const TrainingSetup& s);

// The parts PlanSearch searches the settings in, one after the other (PlanSearchOptions::setting_parts):
// indices into `setups`, the settings without full recomputation first (searched jointly: ZeRO and
// selective recomputation barely move the joint search's bounds), then those with it (whose plans the
// joint bounds, priced without the recomputed forward, cannot prune). Parts are never empty.
std::vector<std::vector<int>> setting_parts(const std::vector<TrainingSetup>& setups);

// Whether memory binds the settings' plans (PlanSearchOptions::SettingParts::kAuto then searches them in
// parts): no node can hold the model states of every layer (the least over `setups`, dp 1) at its largest
// tp, so pipelining, ZeRO and recomputation decide which plans fit, and the joint search, whose bounds
// price no recomputed forward, cannot prune the many plans only full recomputation lets fit (Llama-3.1-70B
// on 64 H100: no plan costed in 120 s). Where a node can, the joint search's one enumeration for every
// setting costs less than two searches.
bool settings_bind_memory(const Cluster& cluster, const ProfileSet& profiles, const PlanSimulator& sim,
                          const std::vector<TrainingSetup>& setups);

// A plan's place in the search's fixed order of plans (planner/stage_search.h, PlanKey::order): its node
// order's index, micro-batches, stages, then (GPUs, dp, layers) per stage.
std::vector<int> plan_key_order(const PlanResult& plan, const Cluster& cluster);

}  // namespace hetplan
