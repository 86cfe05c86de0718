// The default search (planner/plan_search.h): exact over its space, so the
// pruned, streamed search returns exactly what exhaustive enumeration of the
// same space returns; its plans are ones a practitioner can run; its cost is
// the simulator's iteration time.
#include <catch2/catch.hpp>

#include <random>

#include "fixtures.h"
#include "planner/plan_search.h"
#include "sim/analytic_profiles.h"
#include "sim/cluster.h"
#include "sim/parallel_layout.h"
#include "sim/plan_simulator.h"

namespace hetplan {
namespace {

// A small GPT (6 Metis layers: embedding, 4 blocks, head) estimated for three GPU types.
const ProfileSet& small_profiles() {
  static std::unique_ptr<ProfileSet> set;
  if (!set) {
    AnalyticOptions o;
    o.model.num_layers = 6;
    o.model.hidden_size = 2048;
    o.model.sequence_length = 1024;
    o.model.vocab_size = 32000;
    o.model.attention_heads = 16;
    o.device_types = {"A100", "H100", "V100"};
    o.max_tp = 4;
    o.max_bs = 8;
    const auto dir = test::scratch_dir("plan-search-profiles");
    generate_analytic_profiles(o, dir.string());
    set = std::make_unique<ProfileSet>(ProfileSet::load(dir.string(), 6));
  }
  return *set;
}

ModelConfig small_model() {
  ModelConfig m;
  m.num_layers = 6;
  m.hidden_size = 2048;
  m.sequence_length = 1024;
  m.vocab_size = 32000;
  m.attention_heads = 16;
  return m;
}

std::vector<ClusterfileEntry> clusterfile() {
  return {{"10.0.0.1", "A100", 25, 300, 80}, {"10.0.0.2", "H100", 50, 450, 80}, {"10.0.0.3", "V100", 10, 50, 32},
          {"10.0.0.4", "V100", 10, 50, 16}};
}

struct Case {
  std::vector<std::pair<std::string, int>> hosts;
  int gbs;
};

// 24 small clusters: 1-3 types, nodes of 1-4 GPUs of mixed sizes, odd totals.
std::vector<Case> cases() {
  std::vector<Case> out = {
      {{{"10.0.0.1", 3}}, 6},
      {{{"10.0.0.1", 2}, {"10.0.0.3", 3}}, 4},
      {{{"10.0.0.1", 1}, {"10.0.0.2", 2}, {"10.0.0.3", 2}}, 6},
      {{{"10.0.0.3", 4}, {"10.0.0.3", 1}}, 8},
      {{{"10.0.0.2", 2}, {"10.0.0.2", 2}, {"10.0.0.3", 3}}, 12},
      {{{"10.0.0.4", 2}, {"10.0.0.1", 1}}, 3},
  };
  std::mt19937 rng(20261122);
  const char* ips[] = {"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"};
  const int gbss[] = {2, 3, 4, 5, 6, 8, 9, 12};
  while (out.size() < 24) {
    Case c;
    const int nodes = 1 + static_cast<int>(rng() % 3);
    int total = 0;
    for (int n = 0; n < nodes; ++n) {
      const int slots = 1 + static_cast<int>(rng() % 4);
      c.hosts.emplace_back(ips[rng() % 4], slots);
      total += slots;
    }
    if (total > 7) continue;
    c.gbs = gbss[rng() % 8];
    out.push_back(c);
  }
  return out;
}

std::string describe(const Case& c) {
  std::string s = "gbs " + std::to_string(c.gbs) + ":";
  for (const auto& [ip, n] : c.hosts) s += " " + ip + "x" + std::to_string(n);
  return s;
}

SimulationOptions sim_options() {
  SimulationOptions o;
  o.setup.framework_bytes = 0;
  o.max_profiled_bs = 8;
  return o;
}

}  // namespace

TEST_CASE("the pruned search returns what exhaustive search returns, on 24 small clusters", "[plan_search]") {
  const ProfileSet& profiles = small_profiles();
  int compared = 0, with_plans = 0;
  for (const Case& c : cases()) {
    INFO(describe(c));
    const Cluster cluster = Cluster::from_parts(c.hosts, clusterfile(), "hosts", "clusterfile");
    const PlanSimulator sim(cluster, profiles, shape_from_model_config(small_model()), 1024, sim_options());
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.top_k = 3;
    // Two settings, so that the per-setting bounds are exercised too.
    TrainingSetup a = sim_options().setup, b = a;
    b.zero_stage = 1;
    b.recompute = Recompute::kFull;
    o.setups = {a, b};
    PlanSearchOptions ex = o;
    ex.exhaustive = true;
    const PlanSearchResult pruned = PlanSearch(cluster, profiles, sim, o).run();
    const PlanSearchResult full = PlanSearch(cluster, profiles, sim, ex).run();
    REQUIRE(pruned.top.size() == full.top.size());
    for (std::size_t i = 0; i < full.top.size(); ++i) {
      const PlanResult& x = pruned.top[i].plan;
      const PlanResult& y = full.top[i].plan;
      CHECK(x.cost == y.cost);
      CHECK(x.node_sequence == y.node_sequence);
      CHECK(x.device_groups == y.device_groups);
      CHECK(x.strategies == y.strategies);
      CHECK(x.layer_partition == y.layer_partition);
      CHECK(x.batches == y.batches);
      CHECK(pruned.top[i].setup == full.top[i].setup);
    }
    CHECK(pruned.costed <= full.costed);
    ++compared;
    if (!full.top.empty()) ++with_plans;
  }
  CHECK(compared == 24);
  CHECK(with_plans >= 20);
}

TEST_CASE("the default search's plans use every GPU, layer and sample, keep tp in a node, and fit", "[plan_search]") {
  const ProfileSet& profiles = small_profiles();
  for (const Case& c : cases()) {
    INFO(describe(c));
    const Cluster cluster = Cluster::from_parts(c.hosts, clusterfile(), "hosts", "clusterfile");
    const PlanSimulator sim(cluster, profiles, shape_from_model_config(small_model()), 1024, sim_options());
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.top_k = 5;
    const PlanSearchResult r = PlanSearch(cluster, profiles, sim, o).run();
    for (const SearchedPlan& sp : r.top) {
      const PlanResult& p = sp.plan;
      int gpus = 0;
      for (int g : p.device_groups) gpus += g;
      CHECK(gpus == cluster.num_devices());
      REQUIRE(p.layer_partition.size() == p.device_groups.size() + 1);
      CHECK(p.layer_partition.front() == 0);
      CHECK(p.layer_partition.back() == 6);
      for (std::size_t i = 0; i + 1 < p.layer_partition.size(); ++i) CHECK(p.layer_partition[i] < p.layer_partition[i + 1]);
      CHECK(c.gbs % p.batches == 0);
      std::vector<int> seq;
      for (const auto& n : p.node_sequence) seq.push_back(cluster.type_index(n));
      const RankLayout layout(cluster, seq);
      int begin = 0;
      for (std::size_t i = 0; i < p.device_groups.size(); ++i) {
        CHECK(p.strategies[i].dp * p.strategies[i].tp == p.device_groups[i]);
        CHECK(p.strategies[i].dp <= c.gbs / p.batches);
        CHECK(tp_groups_inside_nodes(layout, begin, p.strategies[i]));
        begin += p.device_groups[i];
      }
      // The cost is simulate's iteration time, and every rank fits its own GPU.
      const PlanSimulation s = sim.simulate(p, c.gbs);
      CHECK(s.fits);
      CHECK(std::abs(s.timeline.iteration_ms - p.cost) <= 1e-9 * p.cost);
    }
  }
}

TEST_CASE("the default search does not depend on the thread count", "[plan_search]") {
  const ProfileSet& profiles = small_profiles();
  const Cluster cluster = Cluster::from_parts({{"10.0.0.2", 2}, {"10.0.0.1", 3}, {"10.0.0.3", 2}}, clusterfile());
  const PlanSimulator sim(cluster, profiles, shape_from_model_config(small_model()), 1024, sim_options());
  PlanSearchOptions o;
  o.gbs = 12;
  o.top_k = 10;
  o.threads = 1;
  const PlanSearchResult one = PlanSearch(cluster, profiles, sim, o).run();
  o.threads = 2;
  const PlanSearchResult two = PlanSearch(cluster, profiles, sim, o).run();
  REQUIRE(one.top.size() == 10);
  REQUIRE(two.top.size() == 10);
  for (std::size_t i = 0; i < one.top.size(); ++i) {
    CHECK(one.top[i].plan.cost == two.top[i].plan.cost);
    CHECK(one.top[i].plan.device_groups == two.top[i].plan.device_groups);
    CHECK(one.top[i].plan.layer_partition == two.top[i].plan.layer_partition);
  }
}

TEST_CASE("a cancelled search returns what it found and says it was cut short", "[plan_search]") {
  const ProfileSet& profiles = small_profiles();
  const Cluster cluster = Cluster::from_parts({{"10.0.0.2", 4}, {"10.0.0.3", 3}}, clusterfile());
  const PlanSimulator sim(cluster, profiles, shape_from_model_config(small_model()), 1024, sim_options());
  std::atomic<bool> cancel{true};
  PlanSearchOptions o;
  o.gbs = 8;
  o.cancel = &cancel;
  const PlanSearchResult r = PlanSearch(cluster, profiles, sim, o).run();
  CHECK(r.cut_short);
  CHECK(r.cut_reason == "interrupted");
  cancel = false;
  const PlanSearchResult full = PlanSearch(cluster, profiles, sim, o).run();
  CHECK_FALSE(full.cut_short);
  CHECK_FALSE(full.top.empty());
}

}  // namespace hetplan
