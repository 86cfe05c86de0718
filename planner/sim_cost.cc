#include "planner/sim_cost.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "sim/plan_cost.h"

namespace hetplan {

namespace {

// One PlanCostModel per node sequence, built the first time a candidate on it is costed. The
// model keeps its own copy of the RankLayout, so it outlives the search's.
class CostModels {
 public:
  CostModels(const PlanSimulator& sim, std::vector<TrainingSetup> setups) : sim_(&sim), setups_(std::move(setups)) {}

  const PlanSimulator& simulator() const { return *sim_; }

  // Each thread remembers the model it used last (most calls stay on one node sequence), so the
  // lock is taken only on a change; `id_` tells this instance from a later one at the same address.
  const PlanCostModel& get(const RankLayout& layout) {
    struct Last {
      long long id = -1;
      const PlanCostModel* model = nullptr;
    };
    static thread_local Last last;
    if (last.id == id_ && last.model->grid().ranks().node_sequence() == layout.node_sequence()) return *last.model;
    const PlanCostModel& m = find(layout);
    last.id = id_;
    last.model = &m;
    return m;
  }

 private:
  const PlanCostModel& find(const RankLayout& layout) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(layout.node_sequence());
    if (it == models_.end()) {
      auto e = std::make_unique<Entry>(layout);
      e->model = std::make_unique<PlanCostModel>(*sim_, e->layout, setups_);
      it = models_.emplace(layout.node_sequence(), std::move(e)).first;
    }
    return *it->second->model;
  }

  struct Entry {
    explicit Entry(const RankLayout& l) : layout(l) {}
    RankLayout layout;
    std::unique_ptr<PlanCostModel> model;
  };
  static long long next_id() {
    static std::atomic<long long> n{0};
    return n++;
  }
  const long long id_ = next_id();
  const PlanSimulator* sim_;
  std::vector<TrainingSetup> setups_;
  std::mutex mu_;
  std::map<std::vector<int>, std::unique_ptr<Entry>> models_;
};

// Per-thread scratch of the hook: stage costs [stage * setups + setting], one setting's pipeline, the timeline's.
struct HookScratch {
  std::vector<FastStageCost> all;
  PipelineScratch pipeline;
};

}  // namespace

decltype(SearchOptions::cost_hook) make_sim_cost_hook(const PlanSimulator& simulator) {
  return make_sim_cost_hook(std::vector<const PlanSimulator*>{&simulator});
}

decltype(SearchOptions::cost_hook) make_sim_cost_hook(std::vector<const PlanSimulator*> simulators) {
  // The settings differ only in their TrainingSetup: one cost model costs them all at once.
  std::vector<TrainingSetup> setups;
  for (const PlanSimulator* s : simulators) setups.push_back(s->options().setup);
  auto models = std::make_shared<CostModels>(*simulators.front(), std::move(setups));
  return [models](const InterStagePlan& plan, const RankLayout& layout, const Strategy* strategies,
                  const int* layer_partition, double* cost, std::string* why) {
    const PlanCostModel& model = models->get(layout);
    static thread_local HookScratch scratch;
    const int p = plan.num_stages(), n = model.num_setups();
    if (plan.batches < 1 || plan.gbs % plan.batches != 0) {
      if (why) *why = "batches = " + std::to_string(plan.batches) + " does not divide the global batch " +
                      std::to_string(plan.gbs);
      return false;
    }
    const int micro_batch = plan.gbs / plan.batches;
    if (scratch.all.size() < static_cast<std::size_t>(p * n)) scratch.all.resize(p * n);
    int begin = 0;
    for (int i = 0; i < p; ++i) {
      const int size = (*plan.device_groups)[i];
      const StageChoice s{begin, size, strategies[i], layer_partition[i], layer_partition[i + 1]};
      // A missing profile is missing for every setting.
      if (!model.stage(s, i, p, plan.batches, micro_batch, &scratch.all[i * n], why)) return false;
      begin += size;
    }
    // The fastest setting that fits (settings another one dominates are never timed).
    if (model.best_setup(scratch.all.data(), p, plan.batches, model.schedule(), &scratch.pipeline, cost) >= 0)
      return true;
    if (why) {
      // Nothing fits: the last setting's first rank out of memory, as the per-setting simulators said.
      const FastStageCost* oom = nullptr;
      for (int i = 0; i < p && !oom; ++i)
        if (!scratch.all[i * n + n - 1].fits) oom = &scratch.all[i * n + n - 1];
      const int r = oom->first_oom_rank, type = layout.type_of(r);
      const Cluster& cluster = models->simulator().cluster();
      *why = "simulated memory: rank " + std::to_string(r) + " (" + cluster.device_types()[type] + ") needs " +
             std::to_string(oom->first_oom_total_bytes / (1024.0 * 1024 * 1024)) + " GiB of " +
             std::to_string(cluster.memory_mb(type) / 1024.0);
    }
    return false;
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
