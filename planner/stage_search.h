// StageSearch: one worker's depth-first search of a work unit's plans, stage
// by stage (planner/plan_search.md): it prunes a partial plan when a lower
// bound on every completion is above the shared threshold, costs each
// complete plan with the fast cost model, and keeps its worker's K best.
// StageCache: a worker's fixed-size cache of stage costs.
// Thread-safety: one StageSearch serves every thread of a search; a Worker
// belongs to one thread at a time. The hot path allocates nothing but the
// kept plans and the first infeasibility reason.
// REQUIRES: everything a StageSearch is given outlives it; the suffix bound
// of a unit's group is built (build_last_stages, then finish; build_deeper
// too for units of three stages and more) before the unit runs.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "planner/kept_estimates.h"
#include "planner/plan_search.h"
#include "planner/search_control.h"
#include "planner/search_space.h"
#include "planner/shared_bound.h"
#include "planner/suffix_bound.h"
#include "base/top_k.h"
#include "sim/plan_cost.h"
#include "sim/schedule.h"

namespace hetplan {

// A plan's place in the results: cost, then a fixed order on plans, so that ties never depend on which
// thread found a plan first.
struct PlanKey {
  double cost = std::numeric_limits<double>::infinity();
  std::vector<int> order;  // node order, m, stages, then (size, dp, layers) per stage
  bool operator<(const PlanKey& o) const {
    if (cost != o.cost) return cost < o.cost;
    return order < o.order;
  }
};

using TopPlans = TopK<PlanKey, SearchedPlan>;

// A hash of a PlanKey's order: names a plan to SharedBound::offer.
inline unsigned long long plan_id(const std::vector<int>& order) {
  unsigned long long h = 0xcbf29ce484222325ull;
  for (int x : order) h = (h ^ static_cast<unsigned>(x)) * 0x100000001b3ull;
  return h;
}

// A lower bound on the iteration of a 1F1B plan from one stage x's multi-trip chain (sim/schedule.h,
// multi_trip_counts; planner/plan_search.md, "Multi-trip chains at every stage of the depth-first
// search"): micro-batch 0 arrives at x (`arrival`: the forward chain of the stages before it, their
// forwards and sends); x runs its ops on the chain (h's counts, at x's exact costs); each of h's trips
// leaves with x's forward send and crosses the stages after x and back, micro-batch 0's at least
// `first_trip`, each other at least `later_trip` (with accumulation); after x's last backward, x's own
// all-reduce and step, or its send back, then `back_chain` (the backwards, accumulations and sends back of
// the stages before it: micro-batch m - 1's way back to stage 0) and `tail0` (stage 0's all-reduce and
// step). Every step is an edge of the timeline's task graph, so the chain is at most the iteration.
// 0 where h counts no trip (GPipe, interleaving, or no stage after x).
inline double stage_trip_chain_ms(const MultiTripCounts& h, const FastStageCost& x, double arrival, double first_trip,
                                  double later_trip, double back_chain, double tail0) {
  if (h.trips < 1) return 0;
  const double back = std::max(x.allreduce_ms + x.optimizer_ms, x.send_backward_ms + back_chain + tail0);
  return arrival + h.forwards * x.forward_ms + h.backwards * x.backward_ms + h.accumulations * x.accumulation_ms +
         h.trips * x.send_forward_ms + first_trip + (h.trips - 1) * later_trip + back;
}

// The depth-first search keeps each chosen stage x's chain (stage_trip_chain_ms with no trip, `own`) as
// an offset: less micro-batch 0's passes through the stages up to x (`first_passes`: each stage's forward,
// backward and sends) and h - 1 times the passes with accumulation (`passes`), so that at a later frontier,
// adding back the frontier's sums gives x's chain through the stages from x + 1 to the frontier exact, and
// the trips through the stages after the frontier add `first_trip` once and `later_trip` h - 1 times.
inline double trip_chain_offset(double own, int trips, double first_passes, double passes) {
  return own - first_passes - (trips - 1) * passes;
}
inline double trip_chain_at(double offset, int trips, double first_passes, double passes, double first_trip,
                            double later_trip) {
  return offset + first_passes + first_trip + (trips - 1) * (passes + later_trip);
}

// A worker's cache of stage costs. A stage's costs (every setup's) depend only on the (node order, m)
// group, its ranks, (dp, tp), layers, whether it is the first and the last stage, and its in-flight
// micro-batches (which fix its op order, hence the memory of its activations; interleaved, with the
// pipeline depth): not on the stages around it, so the same stage met
// again under another pipeline depth or prefix is looked up. Direct-mapped, fixed size: a collision
// overwrites; no allocation after construction. Costs are a pure function of the key, so the cache
// never changes a result.
class StageCache {
 public:
  // Slots in zeroed memory from the system (calloc): a page is only backed once a stage is stored on
  // it, so a search that meets few stages does not pay for the whole table.
  StageCache(int setups, std::size_t bytes);
  // A stage's key; never all zero (s >= 1), the empty slot's.
  struct Key {
    unsigned long long a, b;
    bool operator==(const Key& o) const { return a == o.a && b == o.b; }
  };
  static_assert(std::is_trivially_copyable_v<Key> && std::is_trivially_copyable_v<FastStageCost>);
  // `pp`: the pipeline depth where the stage's op order depends on more than its in-flight count (interleaved:
  // the micro-batch groups are pp long; the memory model walks that order), else 0. REQUIRES: r < 2^20,
  // pp < 2^11.
  static Key key(int group, int r, int s, int tp, int l, int e, bool first, bool last, int in_flight, int pp = 0) {
    return Key{(static_cast<unsigned long long>(group) << 32) | (static_cast<unsigned long long>(pp) << 21) |
                   (static_cast<unsigned long long>(r) << 1) | (first ? 1u : 0u),
               (static_cast<unsigned long long>(s) << 40) | (static_cast<unsigned long long>(tp) << 32) |
                   (static_cast<unsigned long long>(l) << 22) | (static_cast<unsigned long long>(e) << 12) |
                   (static_cast<unsigned long long>(in_flight & 0x7ff) << 1) | (last ? 1u : 0u)};
  }
  // The slot for `k`: its costs if *hit, else where to store them.
  FastStageCost* slot(const Key& k, bool* hit) {
    const std::size_t i = index(k);
    *hit = keys_[i] == k;
    keys_[i] = k;
    return &vals_[i * setups_];
  }
  // Drops `k` (a stage that failed: not cached, so its reason is recomputed).
  void invalidate(const Key& k) { keys_[index(k)] = Key{0, 0}; }

 private:
  std::size_t index(const Key& k) const {
    unsigned long long h = k.a * 0x9e3779b97f4a7c15ull ^ (k.b + 0x632be59bd9b4e019ull + (k.a << 6));
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h & mask_;
  }
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  int setups_;
  std::size_t mask_ = 0;
  std::unique_ptr<Key[], Free> keys_;
  std::unique_ptr<FastStageCost[], Free> vals_;
};

// A worker's stage cache size for a cluster of `gpus`: 128 KiB a GPU, at least 2 MiB and at most 64 MiB.
// The stages a search meets grow with the positions a stage can start and end at; on 256 A100 + 256 H100
// (gbs 128) the depth-first search ran 1.85x the partial plans a second with 64 MiB as with 2 MiB (the
// stage cost model then dominated), while a small cluster's search touches few pages of it.
inline std::size_t stage_cache_bytes(int gpus) {
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::max(gpus, 0)) << 17, std::size_t{2} << 20,
                                 std::size_t{64} << 20);
}

// One thread's state: its cache, its best plans, its counts, the first infeasibility it met, and the
// depth-first search's state, indexed [stage * setups + setup] unless said.
struct Worker {
  // `cache_bytes`: stage_cache_bytes(gpus).
  Worker(int k, int setups, std::size_t cache_bytes) : cache(setups, cache_bytes), top(k), polished(k) {}
  StageCache cache;
  TopPlans top;
  TopPlans polished;  // the plans polish_plan met around new best plans (merged like the seeds: once each)
  WorkerCounters counters;
  long long first_infeasible_unit = -1;
  std::string first_infeasible_reason;
  PipelineScratch scratch;
  std::vector<FastStageCost> stage_costs;
  std::vector<double> forward_chain;  // the forward chain to reach the stage
  std::vector<double> passes;         // every stage before the stage: forward, sends, backward, accumulation
  std::vector<double> first_passes;   // passes without accumulation (micro-batch 0's passes)
  std::vector<double> lower_bound;    // best lower bound so far along the path
  std::vector<double> end_extra;      // max over the stages before of what micro-batch m - 1's path spends
                                      // on that stage beyond its forward + backward
  std::vector<double> start_extra;    // max over the stages before of their start path less first_passes
                                      // at the stage after them
  // [(stage * setups + setup) * kTripSlots + h - 1]: the max over the stages x before the stage of x's
  // multi-trip chain with h trips, less the passes of the stages from x + 1 to the stage (micro-batch 0's
  // once, with accumulation h - 1 times: added back at each frontier); -infinity where none.
  static constexpr int kTripSlots = 8;
  std::vector<double> trip_extra;
  std::vector<unsigned> feasible_setups;  // [stage]: setups still feasible, a bit each
  std::vector<StageChoice> choices;       // [stage]
  std::vector<FastStageCost> leaf_costs;  // [stage] for one setup
  std::vector<FastStageCost> chunk_costs;  // interleaved: [virtual stage * setups + setup] of the leaf
  std::vector<FastStageCost> leaf_chunks;  // interleaved: [virtual stage] for one setup
};

class StageSearch {
 public:
  StageSearch(const SearchSpace& space, const FeasibilityTables& tables, const std::vector<SuffixBound>& bounds,
              KeptEstimates& kept, SharedBound& shared, SearchControl& control, const Cluster& cluster,
              const PlanSearchOptions& options, Schedule schedule, int virtual_stages = 1);
  // Searches the unit's plans on `worker`.
  void run_unit(Worker& worker, const Unit& unit) const;

 private:
  friend class UnitSearch;
  const SearchSpace& space_;
  const FeasibilityTables& tables_;
  const std::vector<SuffixBound>& bounds_;
  KeptEstimates& kept_;
  SharedBound& shared_;
  SearchControl& control_;
  const Cluster& cluster_;
  const PlanSearchOptions& options_;
  const Schedule schedule_;
  const int virtual_stages_;  // > 1: interleaved 1F1B (see UnitSearch: the bounds it keeps)
  const bool use_bounds_;
  // Where the bounds pass runs (whole-node stages above bounds_pass_above_gpus, not interleaved): each new
  // best plan the depth-first search finds is polished (polish_plan).
  const bool polish_incumbents_;
};

}  // namespace hetplan
