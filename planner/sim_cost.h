// SimCostHook: the `search --cost-model sim` evaluation. It costs each
// candidate by its simulated iteration time (PlanSimulator, without the
// trace) and leaves out candidates that a profile is missing for or that run
// a rank out of memory. The Metis path does not go through here.
#pragma once

#include <memory>

#include "planner/search.h"
#include "sim/plan_simulator.h"

namespace hetplan {

// The returned hook keeps `simulator` by reference: it must outlive the search.
decltype(SearchOptions::cost_hook) make_sim_cost_hook(const PlanSimulator& simulator);

}  // namespace hetplan
