#include "planner/sim_cost.h"

#include <string>

namespace hetplan {

decltype(SearchOptions::cost_hook) make_sim_cost_hook(const PlanSimulator& simulator) {
  return [&simulator](const InterStagePlan& plan, const RankLayout& layout, const Strategy* strategies,
                      const int* layer_partition, double* cost, std::string* why) {
    PlanSimulation sim;
    if (!simulator.run(layout, *plan.device_groups, strategies, layer_partition, plan.batches, plan.gbs, &sim, why,
                       /*spans=*/false))
      return false;
    if (!sim.fits) {
      const RankMemory& r = sim.ranks[sim.first_oom_rank];
      if (why)
        *why = "simulated memory: rank " + std::to_string(r.rank) + " (" + r.device + ") needs " +
               std::to_string(r.breakdown.gpu_total() / (1024.0 * 1024 * 1024)) + " GiB of " +
               std::to_string(r.capacity_bytes / (1024.0 * 1024 * 1024));
      return false;
    }
    *cost = sim.timeline.iteration_ms;
    return true;
  };
}

}  // namespace hetplan
