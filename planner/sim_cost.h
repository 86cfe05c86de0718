// SimCostHook: the `search --cost-model sim` evaluation. It costs each
// candidate by its simulated iteration time (PlanSimulator, without the
// trace) and leaves out candidates that a profile is missing for or that run
// a rank out of memory. The Metis path does not go through here.
#pragma once

#include <memory>
#include <vector>

#include "planner/search.h"
#include "sim/plan_simulator.h"

namespace hetplan {

// The returned hook keeps `simulator` by reference: it must outlive the search.
decltype(SearchOptions::cost_hook) make_sim_cost_hook(const PlanSimulator& simulator);

// Searches training settings as further dimensions (`search --zero auto`,
// `--recompute auto`): one simulator per setting; a candidate costs its
// fastest setting that fits every rank's memory. The simulators must outlive
// the search.
decltype(SearchOptions::cost_hook) make_sim_cost_hook(std::vector<const PlanSimulator*> simulators);

// Which of `simulators` gives `plan` its cost under that hook (the fastest
// that fits), or -1 if none fits.
int best_setting(const std::vector<const PlanSimulator*>& simulators, const PlanResult& plan, int gbs);

}  // namespace hetplan
