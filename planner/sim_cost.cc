#include "planner/sim_cost.h"

#include <string>

namespace hetplan {

namespace {

std::string oom_reason(const PlanSimulation& sim) {
  const RankMemory& r = sim.ranks[sim.first_oom_rank];
  return "simulated memory: rank " + std::to_string(r.rank) + " (" + r.device + ") needs " +
         std::to_string(r.breakdown.gpu_total() / (1024.0 * 1024 * 1024)) + " GiB of " +
         std::to_string(r.capacity_bytes / (1024.0 * 1024 * 1024));
}

}  // namespace

decltype(SearchOptions::cost_hook) make_sim_cost_hook(const PlanSimulator& simulator) {
  return make_sim_cost_hook(std::vector<const PlanSimulator*>{&simulator});
}

decltype(SearchOptions::cost_hook) make_sim_cost_hook(std::vector<const PlanSimulator*> simulators) {
  return [simulators](const InterStagePlan& plan, const RankLayout& layout, const Strategy* strategies,
                      const int* layer_partition, double* cost, std::string* why) {
    bool any = false;
    for (const PlanSimulator* s : simulators) {
      PlanSimulation sim;
      if (!s->run(layout, *plan.device_groups, strategies, layer_partition, plan.batches, plan.gbs, &sim, why,
                  /*spans=*/false))
        return false;  // a missing profile is missing for every setting
      if (!sim.fits) {
        if (why && !any) *why = oom_reason(sim);
        continue;
      }
      if (!any || sim.timeline.iteration_ms < *cost) *cost = sim.timeline.iteration_ms;
      any = true;
    }
    return any;
  };
}

int best_setting(const std::vector<const PlanSimulator*>& simulators, const PlanResult& plan, int gbs) {
  int best = -1;
  double best_ms = 0;
  for (std::size_t i = 0; i < simulators.size(); ++i) {
    const PlanSimulation sim = simulators[i]->simulate(plan, gbs);
    if (!sim.fits) continue;
    if (best < 0 || sim.timeline.iteration_ms < best_ms) {
      best = static_cast<int>(i);
      best_ms = sim.timeline.iteration_ms;
    }
  }
  return best;
}

}  // namespace hetplan
