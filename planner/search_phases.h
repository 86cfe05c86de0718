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

#include <vector>

#include "planner/search_control.h"
#include "planner/search_space.h"
#include "planner/stage_search.h"
#include "planner/suffix_bound.h"

namespace hetplan {

struct SearchWork {
  const SearchSpace& space;
  SearchControl& control;
  const SuffixBoundBuilder& builder;
  std::vector<SuffixBound>& bounds;  // [group]
  const StageSearch& stage_search;
  tbb::enumerable_thread_specific<Worker>& workers;
};

// No per-rank tables (exhaustive, or too large a cluster): every group's bound, then the units in the
// search's order, the threads starting far apart in it.
void run_in_search_order(SearchWork& work);
// The three phases as one pass of every thread.
void run_in_phases(SearchWork& work);

}  // namespace hetplan
