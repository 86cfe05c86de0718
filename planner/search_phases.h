// How the threads of one search share its work (planner/plan_search.md,
// "phases"): the (node order, m) groups' suffix bounds and the work units,
// either in phases that overlap (with the per-rank tables) or in the search's
// order of units (without them). Both run in the calling task arena and
// return when every unit is done or the search stops; a thread's exception
// stops the others and is rethrown.
// REQUIRES: nothing in the builder or the stage search waits in TBB (the
// phases' threads wait on each other's work); every part of SearchWork
// outlives the call.
#pragma once

#include <tbb/enumerable_thread_specific.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <vector>

#include "planner/search_control.h"
#include "planner/search_space.h"
#include "planner/seed_plans.h"
#include "planner/shared_bound.h"
#include "planner/stage_search.h"
#include "planner/suffix_bound.h"

namespace hetplan {

// A lower bound on the cost of every plan of each (node order, m) group that the search has not yet
// searched: `floor` (a bound on every plan of the space) until the group's deeper suffix table is built,
// then the least over the pipeline depths still to search of that table's bound, and infinity once every
// unit of the group is done. Any value written stays a valid bound for later (what is left only
// shrinks), so racing writers are harmless.
// Thread-safety: every member from any number of threads at once.
class OpenBounds {
 public:
  OpenBounds(int groups, double floor) : floor_(floor), lb_(new std::atomic<double>[groups]), groups_(groups) {
    for (int g = 0; g < groups; ++g) lb_[g].store(floor);
  }
  double floor() const { return floor_; }
  void set(int group, double lb) { lb_[group].store(std::max(lb, floor_), std::memory_order_relaxed); }
  void close(int group) { lb_[group].store(std::numeric_limits<double>::infinity(), std::memory_order_relaxed); }
  // The least over the groups.
  double least() const {
    double x = std::numeric_limits<double>::infinity();
    for (int g = 0; g < groups_; ++g) x = std::min(x, lb_[g].load(std::memory_order_relaxed));
    return x;
  }

 private:
  const double floor_;
  std::unique_ptr<std::atomic<double>[]> lb_;
  const int groups_;
};

// The primal heuristic run on each group's whole table (planner/plan_search.md, "Plans from the
// tables"): the dynamic program's argmin plans of a few depths, polished (polish_plan) and kept in the
// calling thread's `found`, which the search merges with the seeds.
struct ArgminSeeds {
  const Cluster& cluster;
  const PlanSearchOptions& options;
  Schedule schedule;
  tbb::enumerable_thread_specific<TopPlans>& found;
};

struct SearchWork {
  const SearchSpace& space;
  SearchControl& control;
  const SuffixBoundBuilder& builder;
  std::vector<SuffixBound>& bounds;  // [group]
  const StageSearch& stage_search;
  tbb::enumerable_thread_specific<Worker>& workers;
  OpenBounds& open;
  SharedBound& shared;  // (offered the plans from the tables)
  int bounds_pass_above_gpus;  // PlanSearchOptions::bounds_pass_above_gpus
  ArgminSeeds* argmin = nullptr;  // null: no plans from the tables
};

// No per-rank tables (exhaustive, or too large a cluster): every group's bound, then the units in the
// search's order, the threads starting far apart in it.
void run_in_search_order(SearchWork& work);
// The three phases as one pass of every thread.
void run_in_phases(SearchWork& work);

}  // namespace hetplan
