// Issue 33 items 4 and 5: `search --uniform` keeps plans Megatron-LM and DeepSpeed run (and they export),
// and `--objective cost` / `--deadline-ms` pick the cheapest plan per iteration over sub-clusters of whole
// nodes per type, on a mixed A100 / V100 / H100 cluster, with a choice that follows the prices.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>

#include "fixtures.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "planner/export_plan.h"
#include "planner/objective.h"
#include "planner/plan_search.h"
#include "sim/gpu_specs.h"
#include "sim/plan_file.h"
#include "sim/plan_simulator.h"

namespace fs = std::filesystem;

namespace hetplan {
namespace {

std::string profile_dir() {
  static std::string dir;
  if (dir.empty()) dir = test::six_layer_profile_dir({"A100", "H100", "V100"}, "objective-profiles");
  return dir;
}

const ProfileSet& profiles() {
  static std::unique_ptr<ProfileSet> set;
  if (!set) set = std::make_unique<ProfileSet>(ProfileSet::load(profile_dir(), 6));
  return *set;
}

// One clusterfile entry per type; prices < 0 are left out (the catalogue's then).
std::vector<ClusterfileEntry> entries(double a100, double v100, double h100) {
  std::vector<ClusterfileEntry> e = {{"10.0.0.1", "A100", 25, 300, 80}, {"10.0.0.2", "V100", 10, 50, 32},
                                     {"10.0.0.3", "H100", 50, 450, 80}};
  e[0].price_per_gpu_hour = a100;
  e[1].price_per_gpu_hour = v100;
  e[2].price_per_gpu_hour = h100;
  return e;
}

// Two nodes of 2 GPUs of each type.
Cluster mixed(double a100, double v100, double h100) {
  return Cluster::from_parts({{"10.0.0.1", 2}, {"10.0.0.1", 2}, {"10.0.0.2", 2}, {"10.0.0.2", 2}, {"10.0.0.3", 2},
                              {"10.0.0.3", 2}},
                             entries(a100, v100, h100), "hosts", "clusterfile");
}

SimulationOptions sim_options() {
  SimulationOptions o;
  o.setup.framework_bytes = 0;
  o.max_profiled_bs = 8;
  return o;
}

PlanSearchOptions search_options(int gbs) {
  PlanSearchOptions o;
  o.gbs = gbs;
  o.top_k = 3;
  return o;
}

// What --objective cost must find, by brute force: each sub-cluster's fastest plan, priced.
double cheapest_by_brute_force(const Cluster& cluster, int gbs, double deadline_ms, std::string* label) {
  bool reduced = false;
  double best = -1;
  for (const NodeSubset& s : node_subsets(cluster, 1000, &reduced)) {
    const Cluster sub = subset_cluster(cluster, s);
    const PlanSimulator sim(sub, profiles(), test::six_layer_shape(), 1024, sim_options());
    PlanSearchOptions o = search_options(gbs);
    o.top_k = 1000;  // every plan under the deadline counts, not only the fastest
    const PlanSearchResult r = PlanSearch(sub, profiles(), sim, o).run();
    for (const SearchedPlan& p : r.top) {
      if (deadline_ms > 0 && p.plan.cost > deadline_ms) continue;
      const double usd = cost_per_iteration_usd(p.plan.cost, cluster_price_per_hour(sub, "test"));
      if (best < 0 || usd < best) {
        best = usd;
        *label = s.label;
      }
    }
  }
  return best;
}

PlanFile plan_file(const PlanResult& p, int gbs, int zero_stage) {
  PlanFile f;
  f.plan = p;
  f.model = test::six_layer_model();
  f.shape = shape_from_model_config(f.model);
  f.gbs = gbs;
  f.zero_stage = zero_stage;
  f.recompute = "none";
  return f;
}

}  // namespace

TEST_CASE("GPU prices: the catalogue's defaults, a clusterfile's override", "[objective][cost]") {
  const GpuSpec* h100 = find_gpu_spec("H100");
  REQUIRE(h100);
  CHECK(h100->price_per_gpu_hour == 12.29);  // p5.48xlarge $98.32/h over 8 GPUs
  CHECK(h100->price_source.find("p5.48xlarge") != std::string::npos);
  CHECK(find_gpu_spec("V100")->price_per_gpu_hour == 3.9015);
  const Cluster catalogue = mixed(-1, -1, -1);
  const Cluster priced = mixed(1.5, 0.5, 2.5);
  const int h = catalogue.type_index("H100"), v = catalogue.type_index("V100"), a = catalogue.type_index("A100");
  CHECK(catalogue.price_per_gpu_hour(h) == 12.29);
  CHECK(catalogue.price_source(h).find("GPU catalogue") == 0);
  CHECK(priced.price_per_gpu_hour(h) == 2.5);
  CHECK(priced.price_per_gpu_hour(v) == 0.5);
  CHECK(priced.price_per_gpu_hour(a) == 1.5);
  CHECK(cluster_price_per_hour(priced, "test") == 4 * 1.5 + 4 * 0.5 + 4 * 2.5);
  CHECK(cost_per_iteration_usd(3600.0, 10.0) == Approx(0.01));
  // A clusterfile that prices one type twice, differently, is refused naming the key.
  const auto dir = test::scratch_dir("prices");
  const std::string cf = (dir / "clusterfile.json").string();
  std::ofstream(cf) << R"({"10.0.0.1": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300,
    "memory": 80, "price_per_gpu_hour": 2},
    "10.0.0.2": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 80,
    "price_per_gpu_hour": 3}})";
  try {
    parse_clusterfile(cf);
    FAIL("accepted two prices for A100");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("10.0.0.2.price_per_gpu_hour") != std::string::npos);
  }
  // An unpriced type (the catalogue has none for T4) is named when the cost objective needs it.
  const Cluster t4 = Cluster::from_parts({{"10.0.0.9", 2}}, {{"10.0.0.9", "T4", 10, 50, 16}}, "hosts", "cf");
  CHECK(cluster_price_per_hour(t4, "") == -1);
  CHECK_THROWS_AS(cluster_price_per_hour(t4, "cf"), InputError);
}

TEST_CASE("sub-clusters of whole nodes per type", "[objective][cost]") {
  const Cluster c = mixed(1, 1, 1);
  bool reduced = true;
  const std::vector<NodeSubset> all = node_subsets(c, 1000, &reduced);
  CHECK_FALSE(reduced);
  REQUIRE(all.size() == 3 * 3 * 3 - 1);
  CHECK(all[0].hosts.size() == 6);  // the whole cluster first
  for (const NodeSubset& s : all) CHECK(subset_cluster(c, s).num_devices() == 2 * static_cast<int>(s.hosts.size()));
  const std::vector<NodeSubset> few = node_subsets(c, 10, &reduced);
  CHECK(reduced);
  CHECK(few.size() == 3 * 3 * 3 - 1);  // 0, 1, 2 per type are already the powers of two
}

TEST_CASE("search --objective cost picks the cheapest plan per iteration, and the choice follows the prices",
          "[objective][cost]") {
  const int gbs = 8;
  ObjectiveOptions cost;
  cost.objective = Objective::kCost;
  std::string label_h100_cheap, label_h100_dear;
  struct Prices {
    double a100, v100, h100;
  };
  std::vector<std::string> chosen;
  for (const Prices& p : {Prices{4.0, 3.0, 1.0}, Prices{4.0, 0.2, 40.0}, Prices{0.5, 3.0, 40.0}}) {
    const Cluster c = mixed(p.a100, p.v100, p.h100);
    const ObjectiveSearchResult r = search_objective(c, profiles(), test::six_layer_shape(), 1024,
                                                     sim_options(), search_options(gbs), cost);
    REQUIRE(!r.top.empty());
    const PricedPlan& best = r.top[0];
    INFO(r.subsets[best.subset].label);
    // Its cost is its time x its GPUs' price, and no plan of any sub-cluster is cheaper.
    CHECK(best.usd_per_hour == cluster_price_per_hour(r.clusters[best.subset], "test"));
    CHECK(best.usd_per_iteration == cost_per_iteration_usd(best.searched.plan.cost, best.usd_per_hour));
    std::string label;
    CHECK(best.usd_per_iteration == Approx(cheapest_by_brute_force(c, gbs, 0, &label)).epsilon(1e-12));
    for (std::size_t i = 1; i < r.top.size(); ++i) CHECK(r.top[i - 1].usd_per_iteration <= r.top[i].usd_per_iteration);
    chosen.push_back(r.subsets[best.subset].label);
  }
  // Cheap H100s: only H100 nodes; cheap V100s: V100s; cheap A100s: A100s.
  CHECK(chosen[0].find("H100") != std::string::npos);
  CHECK(chosen[0].find("V100") == std::string::npos);
  CHECK(chosen[1].find("V100") != std::string::npos);
  CHECK(chosen[1].find("H100") == std::string::npos);
  CHECK(chosen[2].find("A100") != std::string::npos);
  CHECK(chosen[2].find("H100") == std::string::npos);
  CHECK(chosen[0] != chosen[1]);
  CHECK(chosen[1] != chosen[2]);
}

TEST_CASE("search --deadline-ms: the cheapest plan whose iteration meets the bound", "[objective][cost]") {
  const int gbs = 8;
  const Cluster c = mixed(4.0, 0.2, 12.0);
  // The fastest plan of the whole cluster, and the cheapest plan without a bound.
  const PlanSimulator sim(c, profiles(), test::six_layer_shape(), 1024, sim_options());
  const PlanSearchResult fastest = PlanSearch(c, profiles(), sim, search_options(gbs)).run();
  REQUIRE(!fastest.top.empty());
  ObjectiveOptions free_cost;
  free_cost.objective = Objective::kCost;
  const ObjectiveSearchResult cheapest = search_objective(c, profiles(), test::six_layer_shape(), 1024,
                                                          sim_options(), search_options(gbs), free_cost);
  REQUIRE(!cheapest.top.empty());
  const double slow = cheapest.top[0].searched.plan.cost, fast = fastest.top[0].plan.cost;
  REQUIRE(slow > fast);  // the cheapest plan is not the fastest here (V100s are cheap and slow)
  const double deadline = 0.5 * (slow + fast);
  ObjectiveOptions o;
  o.deadline_ms = deadline;
  const ObjectiveSearchResult r =
      search_objective(c, profiles(), test::six_layer_shape(), 1024, sim_options(), search_options(gbs), o);
  REQUIRE(!r.top.empty());
  for (const PricedPlan& p : r.top) CHECK(p.searched.plan.cost <= deadline);
  std::string label;
  CHECK(r.top[0].usd_per_iteration == Approx(cheapest_by_brute_force(c, gbs, deadline, &label)).epsilon(1e-12));
  CHECK(r.top[0].usd_per_iteration >= cheapest.top[0].usd_per_iteration);
  // Tighter than the fastest plan: nothing, and the fastest time is reported.
  o.deadline_ms = 0.5 * fast;
  const ObjectiveSearchResult none =
      search_objective(c, profiles(), test::six_layer_shape(), 1024, sim_options(), search_options(gbs), o);
  CHECK(none.top.empty());
  CHECK(none.fastest_ms > o.deadline_ms);  // reported: the fastest plan of any sub-cluster
  CHECK(none.fastest_ms <= fast);           // (a sub-cluster without the V100s is faster than the whole cluster)
}

TEST_CASE("search --uniform: plans are Megatron-LM's and DeepSpeed's, and export to both", "[objective][uniform][export]") {
  int differ = 0;
  for (int gbs : {8, 12, 16}) {
    const Cluster c = Cluster::from_parts({{"10.0.0.1", 4}, {"10.0.0.2", 2}, {"10.0.0.3", 2}}, entries(-1, -1, -1),
                                          "hosts", "clusterfile");
    const PlanSimulator sim(c, profiles(), test::six_layer_shape(), 1024, sim_options());
    PlanSearchOptions o = search_options(gbs);
    TrainingSetup plain = sim_options().setup, z2 = plain;
    z2.zero_stage = 2;
    o.setups = {plain, z2};
    const PlanSearchResult any = PlanSearch(c, profiles(), sim, o).run();
    o.uniform = true;
    const PlanSearchResult uni = PlanSearch(c, profiles(), sim, o).run();
    PlanSearchOptions ex = o;
    ex.exhaustive = true;
    const PlanSearchResult full = PlanSearch(c, profiles(), sim, ex).run();
    REQUIRE(!uni.top.empty());
    REQUIRE(uni.top.size() == full.top.size());
    for (std::size_t i = 0; i < uni.top.size(); ++i) {  // exact over the uniform space
      CHECK(uni.top[i].plan.cost == full.top[i].plan.cost);
      CHECK(uni.top[i].plan.strategies == full.top[i].plan.strategies);
    }
    CHECK(uni.top[0].plan.cost >= any.top[0].plan.cost);
    const PlanResult& b = any.top[0].plan;
    if (std::any_of(b.strategies.begin(), b.strategies.end(), [&](const Strategy& s) { return !(s == b.strategies[0]); }))
      ++differ;
    for (const SearchedPlan& p : uni.top) {
      INFO("gbs " << gbs << ": " << p.plan.strategies.size() << " stages");
      const PlanFile f = plan_file(p.plan, gbs, o.setups[p.setup].zero_stage);
      for (const Strategy& s : p.plan.strategies) CHECK(s == p.plan.strategies[0]);
      CHECK((gbs / p.plan.batches) % p.plan.strategies[0].dp == 0);
      const RankLayout rl(c, c.type_indices(p.plan.node_sequence));
      const ParallelLayout placement(c, rl);
      CHECK_NOTHROW(export_megatron(f, *f.shape, &placement, "plan"));
      CHECK_NOTHROW(export_deepspeed(f, *f.shape, &placement, "plan"));
      CHECK(accepting_exporters(f, *f.shape, placement) == std::vector<std::string>{"megatron", "deepspeed", "torchrun"});
    }
  }
  CHECK(differ > 0);  // without --uniform, some best plan runs stages at different (dp, tp)
}

TEST_CASE("search --json says which exporters take each plan", "[objective][uniform][export][cli]") {
  const auto dir = test::scratch_dir("exporters-json");
  const std::string hosts = (dir / "hostfile").string(), cf = (dir / "clusterfile.json").string();
  std::ofstream(hosts) << "10.0.0.1 slots=4\n10.0.0.2 slots=2\n10.0.0.3 slots=2\n";
  std::ofstream(cf) << R"({"10.0.0.1": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 80},
    "10.0.0.2": {"instance_type": "V100", "inter_bandwidth": 10, "intra_bandwidth": 50, "memory": 32},
    "10.0.0.3": {"instance_type": "H100", "inter_bandwidth": 50, "intra_bandwidth": 450, "memory": 80}})";
  const std::string common = "search -q --hostfile " + hosts + " --clusterfile " + cf + " --profiles " + profile_dir() +
                             " --num_layers 6 --hidden_size 2048 --sequence_length 1024 --vocab_size 32000 --heads 16 "
                             "--max-profiled-batch-size 8 --top 5 --gbs 12 --json ";
  for (const bool uniform : {false, true}) {
    const std::string out = (dir / (uniform ? "uniform.json" : "any.json")).string();
    const auto r = test::run_hetplan(common + out + (uniform ? " --uniform" : ""));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const ordered_json j = read_json_file(out);
    REQUIRE(j["top"].size() > 0);
    int megatron = 0;
    for (const auto& p : j["top"]) {
      const auto ex = p["exporters"].get<std::vector<std::string>>();
      bool same = true;
      for (const auto& s : p["strategies"]) same = same && s == p["strategies"][0];
      const int micro = 12 / p["batches"].get<int>(), dp = p["strategies"][0][0].get<int>();
      const bool mg = std::find(ex.begin(), ex.end(), "megatron") != ex.end();
      CHECK(mg == (same && micro % dp == 0));
      CHECK(std::find(ex.begin(), ex.end(), "torchrun") != ex.end());
      if (!mg) CHECK(p["exporters_refused"].contains("megatron"));
      megatron += mg;
      if (uniform) CHECK(mg);
    }
    if (!uniform) CHECK(megatron < static_cast<int>(j["top"].size()));  // some plan only torchrun takes
  }
}

}  // namespace hetplan
