// Seed plans: the plans a practitioner would write by hand, costed at once by
// the search's own cost model (PlanCostModel, the number `hetplan simulate`
// reports), so that a search holds a runnable plan, and a pruning threshold,
// within seconds on any cluster (planner/plan_search.md, "Seeds").
//
// The seeds are Megatron-style grids of the search space: per node order, per
// pipeline depth p, the nodes split into p contiguous runs of (nearly) equal
// node counts (or the ranks into p equal runs where stages may start on any
// rank), one tp for every stage (inside a node), dp = size / tp, every
// micro-batch count, and the layers split so that the stages' compute is
// balanced (each layer's least GPU-ms per sample on each type, over the
// stage's GPUs). The best few are then improved by moving one layer boundary
// at a time while that lowers the cost (or, for a plan out of memory, the
// bytes by which it overflows).
//
// Every seed is a plan of the search space, costed exactly as the depth-first
// search costs it (same cost, same PlanKey), so seeding never changes the
// search's result at gap 0: it only sets the threshold early.
// Thread-safety: seed_plans runs on the calling thread; it offers its plans to
// `shared` (which other threads may read). REQUIRES: the arguments outlive the call.
#pragma once

#include <vector>

#include "planner/plan_search.h"
#include "planner/search_control.h"
#include "planner/search_space.h"
#include "planner/shared_bound.h"
#include "planner/stage_search.h"
#include "sim/schedule.h"

namespace hetplan {

struct SeedStats {
  long long costed = 0;  // seed plans costed (hill-climbing's included)
  int feasible = 0;      // of the grid's plans, those that fit memory
  double seconds = 0;
};

// Costs the seed plans into `top` (the K best, each once) and offers them to `shared`; stops after
// `time_limit_s` or when control says so. `layer_cost[type][layer]`: the least GPU-ms per sample
// (least_gpu_ms_per_sample).
SeedStats seed_plans(const SearchSpace& space, const std::vector<std::vector<double>>& layer_cost,
                     const Cluster& cluster, const PlanSearchOptions& options, Schedule schedule,
                     double time_limit_s, SearchControl& control, SharedBound& shared, TopPlans* top);

// A plan given stage by stage (node order `order`, `micro_batches`, its stages in rank order, layers
// covering [0, layers)): costed as the depth-first search's leaf costs it, then improved by moving one
// layer boundary by one layer or changing one stage's tp (dp = size / tp) while that lowers the cost;
// every plan of the space met that fits is kept in `top` (if among its K best) and offered to `shared`.
// Returns the last plan's cost (infinity where it is not a plan of the space or none fits). Stops
// after `time_limit_s`. Thread-safety: as seed_plans; `top` belongs to the calling thread.
double polish_plan(const SearchSpace& space, const Cluster& cluster, const PlanSearchOptions& options,
                   Schedule schedule, int order, int micro_batches, const std::vector<StageChoice>& stages,
                   double time_limit_s, SearchControl& control, SharedBound& shared, TopPlans* top);

// Inserts (key, plan) into `top` unless a plan of the same key is there. True if inserted.
bool insert_unique(TopPlans* top, PlanKey key, SearchedPlan plan);

}  // namespace hetplan
