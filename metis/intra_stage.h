// IntraStageSearch: Metis's depth-first walk over (dp, tp) per stage, for one
// inter-stage plan.
//
// It starts every stage at (dp = group size, tp = 1). Each step halves dp and
// doubles tp of one stage: the first stage with dp > 1, in order of least
// memory headroom (the last partition's memory state, or 1/dp when there is
// none; with --use_strat, the state of the first attempt that ran out of
// memory takes precedence). A strategy whose micro-batch is 0 or above the
// profiled limits is skipped; a valid one is split into layers by the
// LayerLoadBalancer. Every partition that fits memory is a candidate plan;
// the walk ends when a partition fits at the first attempt or no stage can
// be halved. `count` reproduces the reference's search-step accounting.
#pragma once

#include <vector>

#include "metis/layer_balancer.h"
#include "sim/plan.h"
#include "sim/profile.h"
#include "sim/rank_layout.h"

namespace hetplan {

struct IntraStageOptions {
  int max_profiled_tp = 1;
  int max_profiled_bs = 1;
  bool use_strat = false;
};

// One candidate the walk yields.
struct IntraStageCandidate {
  const std::vector<Strategy>* strategies;
  const LayerPartitionResult* partition;
  long long count;  // search steps charged to this candidate
};

class IntraStageSearch {
 public:
  IntraStageSearch(const ProfileSet& profiles, const IntraStageOptions& options);

  // Walks the plan; calls on_candidate(const IntraStageCandidate&) for each
  // candidate in order. `rank_types` are profile type indices per rank.
  template <typename OnCandidate>
  void run(const InterStagePlan& plan, const RankLayout& layout, const std::vector<int>& rank_types,
           OnCandidate&& on_candidate);

  // The per-stage compute share (normalised 1 / profiled time), as Metis's
  // StagePerformance computes it. Exposed for tests.
  void compute_share(const InterStagePlan& plan, const std::vector<int>& rank_types, const Strategy* strategies,
                     double* share) const;

 private:
  bool valid(const InterStagePlan& plan) const;
  bool next_strategy();
  void prepare(const InterStagePlan& plan, const RankLayout& layout);

  const ProfileSet* profiles_;
  IntraStageOptions opt_;
  LayerLoadBalancer balancer_;
  // Scratch, reused across plans.
  std::vector<Strategy> strategies_;
  std::vector<double> capacity_, share_, order_key_;
  std::vector<int> order_;
  std::vector<double> memory_state_, failed_memory_stage_;
  LayerPartitionResult partition_;
};

template <typename OnCandidate>
void IntraStageSearch::run(const InterStagePlan& plan, const RankLayout& layout, const std::vector<int>& rank_types,
                           OnCandidate&& on_candidate) {
  prepare(plan, layout);
  const int stages = plan.num_stages();
  bool started = false;
  int num_repartition = 0;
  // Each iteration of the outer loop is one call of the reference's has_next.
  while (num_repartition != 1) {
    long long count = 0;
    bool found = false;
    while (true) {
      if (!started) {
        for (int s = 0; s < stages; ++s) strategies_[s] = Strategy{(*plan.device_groups)[s], 1};
        started = true;
      } else {
        ++count;
        if (!next_strategy()) return;
      }
      if (!valid(plan)) continue;
      compute_share(plan, rank_types, strategies_.data(), share_.data());
      balancer_.partition_layer(plan, rank_types, strategies_.data(), share_.data(), capacity_.data(), &partition_);
      count += partition_.new_partition_count;
      failed_memory_stage_ = partition_.failed_memory_stage;
      if (partition_.ok) {
        memory_state_ = partition_.memory_state;
        num_repartition = partition_.num_repartition;
        found = true;
        break;
      }
      memory_state_.clear();  // the reference's None
    }
    if (found) on_candidate(IntraStageCandidate{&strategies_, &partition_, count});
  }
}

}  // namespace hetplan
