// The default search (planner/plan_search.h): exact over its space, so the
// pruned, streamed search returns exactly what exhaustive enumeration of the
// same space returns; its plans are ones a practitioner can run; its cost is
// the simulator's iteration time.
#include <catch2/catch.hpp>

#include "planner/search_settings.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <functional>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "fixtures.h"
#include "planner/plan_search.h"
#include "planner/shared_bound.h"
#include "planner/stage_estimator.h"
#include "planner/stage_search.h"
#include "planner/suffix_bound.h"
#include "base/thread_limit.h"
#include "sim/analytic_profiles.h"
#include "sim/cluster.h"
#include "base/input_error.h"
#include "sim/parallel_layout.h"
#include "sim/plan_cost.h"
#include "sim/plan_simulator.h"
#include "sim/timeline.h"
#include "sim/rank_layout.h"

namespace hetplan {
namespace {

// A small GPT (6 Metis layers: embedding, 4 blocks, head) estimated for three GPU types.
const ProfileSet& small_profiles() {
  static std::unique_ptr<ProfileSet> set;
  if (!set)
    set = std::make_unique<ProfileSet>(
        ProfileSet::load(test::six_layer_profile_dir({"A100", "H100", "V100"}, "plan-search-profiles"), 6));
  return *set;
}

std::vector<ClusterfileEntry> clusterfile() {
  return {{"10.0.0.1", "A100", 25, 300, 80}, {"10.0.0.2", "H100", 50, 450, 80}, {"10.0.0.3", "V100", 10, 50, 32},
          {"10.0.0.4", "V100", 10, 50, 16}};
}

struct Case {
  std::vector<std::pair<std::string, int>> hosts;
  int gbs;
};

// 24 small clusters: 1-3 types, nodes of 1-4 GPUs of mixed sizes, odd totals; `uneven`: 6 more whose
// micro-batches split unevenly over the replicas (7, 10 and 11 samples).
std::vector<Case> cases(bool uneven = false) {
  std::vector<Case> extra = {
      {{{"10.0.0.1", 2}}, 7},
      {{{"10.0.0.3", 3}}, 10},
      {{{"10.0.0.1", 4}, {"10.0.0.1", 3}}, 11},
      {{{"10.0.0.2", 3}, {"10.0.0.1", 2}}, 10},
      {{{"10.0.0.4", 2}, {"10.0.0.3", 3}}, 7},
      {{{"10.0.0.1", 3}, {"10.0.0.3", 1}}, 11},
  };
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
  if (uneven) out.insert(out.end(), extra.begin(), extra.end());
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

// Runs body(c, cluster, sim) for each of cases(uneven): the case's cluster on the test clusterfile and the
// six-layer model's simulator over `profiles`, with the case named in every failure. A body returns early
// where a loop would continue.
template <typename Body>
void for_each_case(bool uneven, const ProfileSet& profiles, Body body) {
  for (const Case& c : cases(uneven)) {
    INFO(describe(c));
    const Cluster cluster = Cluster::from_parts(c.hosts, clusterfile(), "hosts", "clusterfile");
    const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
    body(c, cluster, sim);
  }
}

// `x` is the same plan as `y`, at the same cost to the bit: node order, device groups, (dp, tp) per stage,
// layers per stage and micro-batches.
void check_same_plan(const PlanResult& x, const PlanResult& y) {
  CHECK(x.cost == y.cost);
  CHECK(x.node_sequence == y.node_sequence);
  CHECK(x.device_groups == y.device_groups);
  CHECK(x.strategies == y.strategies);
  CHECK(x.layer_partition == y.layer_partition);
  CHECK(x.batches == y.batches);
}

// `p` is a plan of the default search's space for `cluster` (the six-layer model) and global batch `gbs`: its
// stages use every GPU once and the layers in order, each stage at least one; its micro-batches divide `gbs`,
// each stage has dp x tp GPUs with dp at most a micro-batch's samples and every tp group inside a node; every
// rank fits its own GPU, and its cost is simulate's iteration time.
// Exhaustive search under the options `o` names otherwise: what the pruned search must return.
PlanSearchResult exhaustive_search(const Cluster& cluster, const ProfileSet& profiles, const PlanSimulator& sim,
                                   PlanSearchOptions o) {
  o.exhaustive = true;
  return PlanSearch(cluster, profiles, sim, o).run();
}

void check_plan_of_the_space(const Cluster& cluster, const PlanSimulator& sim, const PlanResult& p, int gbs) {
  int gpus = 0;
  for (int g : p.device_groups) gpus += g;
  CHECK(gpus == cluster.num_devices());
  REQUIRE(p.layer_partition.size() == p.device_groups.size() + 1);
  CHECK(p.layer_partition.front() == 0);
  CHECK(p.layer_partition.back() == 6);
  for (std::size_t i = 0; i + 1 < p.layer_partition.size(); ++i) CHECK(p.layer_partition[i] < p.layer_partition[i + 1]);
  CHECK(gbs % p.batches == 0);
  const RankLayout layout(cluster, cluster.type_indices(p.node_sequence));
  int begin = 0;
  for (std::size_t i = 0; i < p.device_groups.size(); ++i) {
    CHECK(p.strategies[i].dp * p.strategies[i].tp == p.device_groups[i]);
    CHECK(p.strategies[i].dp <= gbs / p.batches);
    CHECK(tp_groups_inside_nodes(layout, begin, p.strategies[i]));
    begin += p.device_groups[i];
  }
  const PlanSimulation s = sim.simulate(p, gbs);
  CHECK(s.fits);
  CHECK(std::abs(s.timeline.iteration_ms - p.cost) <= 1e-9 * p.cost);
}

}  // namespace

// The pruned search against exhaustive enumeration on the 24 clusters: same best plans, same costs,
// same settings, in the same order. `cross_node_tp` also lets tp groups span nodes.
// `table_limit`: PlanSearchOptions::suffix_table_limit (0: the throughput bound instead of the table).
// `gpus`: the clusterfile (its GPU memory); `min_with_plans`: clusters that must have a feasible plan.
// `cps`: the context-parallel sizes searched (with_context_parallel_dimension); `top_k` and `seed_time_s`:
// PlanSearchOptions' (no seeds and one plan: the threshold is the best cost, which the bounds alone must
// reach). Returns how many of the plans returned run at a context-parallel size above 1.
int expect_pruned_equals_exhaustive(const ProfileSet& profiles, const SimulationOptions& so, bool cross_node_tp,
                                    bool uneven = false, double table_limit = PlanSearchOptions().suffix_table_limit,
                                    const std::vector<ClusterfileEntry>& gpus = clusterfile(), int min_with_plans = 20,
                                    StageBoundaries boundaries = StageBoundaries::kRank,
                                    double mixed_limit = PlanSearchOptions().mixed_table_limit,
                                    const std::string& overlap = "off", const std::vector<int>& cps = {1},
                                    int top_k = 3, double seed_time_s = PlanSearchOptions().seed_time_s) {
  int compared = 0, with_plans = 0, with_cp = 0;
  long long pruned_costed = 0, full_costed = 0;
  const std::vector<Case> all = cases(uneven);
  for (const Case& c : all) {
    INFO(describe(c));
    const Cluster cluster = Cluster::from_parts(c.hosts, gpus, "hosts", "clusterfile");
    const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, so);
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.top_k = top_k;
    o.seed_time_s = seed_time_s;
    o.allow_cross_node_tp = cross_node_tp;
    o.suffix_table_limit = table_limit;
    o.stage_boundaries = boundaries;
    o.mixed_table_limit = mixed_limit;
    // Two settings, so that the per-setting bounds are exercised too.
    TrainingSetup a = so.setup, b = a;
    b.zero_stage = 1;
    b.recompute = Recompute::kFull;
    o.setups = with_context_parallel_dimension(with_overlap_dimension({a, b}, overlap),  // "auto": overlap too
                                               cps);
    const PlanSearchResult pruned = PlanSearch(cluster, profiles, sim, o).run();
    const PlanSearchResult full = exhaustive_search(cluster, profiles, sim, o);
    REQUIRE(pruned.top.size() == full.top.size());
    for (std::size_t i = 0; i < full.top.size(); ++i) {
      const PlanResult& x = pruned.top[i].plan;
      const PlanResult& y = full.top[i].plan;
      check_same_plan(x, y);
      CHECK(pruned.top[i].setup == full.top[i].setup);
      const int cp = o.setups[full.top[i].setup].context_parallel;
      if (cp > 1) {  // a cp plan: cp divides every stage's dp, each cp group takes a sample, simulate's cost
        ++with_cp;
        for (const Strategy& st : y.strategies) {
          CHECK(st.dp % cp == 0);
          CHECK(st.dp / cp <= c.gbs / y.batches);
        }
        SimulationOptions cs = so;
        cs.setup = o.setups[full.top[i].setup];
        const PlanSimulator csim(cluster, profiles, test::six_layer_shape(), 1024, cs);
        CHECK(csim.simulate(y, c.gbs).timeline.iteration_ms == Approx(y.cost).epsilon(1e-9));
      }
      if (boundaries == StageBoundaries::kNode) {  // every stage starts on a node boundary
        const RankLayout layout(cluster, cluster.type_indices(x.node_sequence));
        int r = 0;
        for (int size : x.device_groups) {
          CHECK((r == 0 || layout.node_of(r) != layout.node_of(r - 1)));
          r += size;
        }
      }
    }
    CHECK(pruned.costed <= full.costed);
    pruned_costed += pruned.costed;
    full_costed += full.costed;
    ++compared;
    if (!full.top.empty()) ++with_plans;
  }
  CHECK(compared == static_cast<int>(all.size()));
  CHECK(with_plans >= min_with_plans);
  // The bounds prune: a search that costs every plan would pass the checks above too.
  CHECK(pruned_costed * (table_limit > 0 ? 2 : 1) < full_costed);
  return with_cp;
}

// small_profiles() with what the analytic files leave out, as a profiler measures it: each layer's
// forward (a share of its time that varies by layer, tp and bs), its gradient accumulation, a
// sustained (power-limited) pace on the A100, and a bs-4 file faster than its bs-2 and bs-1 slices
// together (so a replica with a sample less than another can be the slower one).
const ProfileSet& measured_profiles() {
  static std::unique_ptr<ProfileSet> set;
  if (!set) {
    small_profiles();
    const auto from = test::scratch_dir("plan-search-profiles");
    const auto dir = test::scratch_dir("plan-search-measured");
    for (const auto& entry : std::filesystem::directory_iterator(from)) {
      const std::string name = entry.path().filename().string();
      if (entry.path().extension() != ".json") continue;
      std::ifstream in(entry.path());
      nlohmann::json j = nlohmann::json::parse(in);
      nlohmann::json& et = j["execution_time"];
      const int bs = std::stoi(name.substr(name.rfind("_bs") + 3));
      const int tp = std::stoi(name.substr(name.rfind("_tp") + 3));
      std::vector<double> layers = et["layer_compute_total_ms"].get<std::vector<double>>();
      if (bs == 4)
        for (double& v : layers) v *= 0.55;
      std::vector<double> forward, accumulation;
      for (std::size_t i = 0; i < layers.size(); ++i) {
        forward.push_back(layers[i] * (0.25 + 0.05 * static_cast<double>((i * 7 + tp * 3 + bs) % 5)));
        accumulation.push_back(layers[i] * 0.03);
      }
      et["layer_compute_total_ms"] = layers;
      et["layer_forward_ms"] = forward;
      et["layer_grad_accumulation_ms"] = accumulation;
      if (name.find("A100") != std::string::npos)
        et["sustained_forward_backward_ms"] = et["forward_backward_time_ms"].get<double>() * 1.15;
      std::ofstream(dir / name) << j.dump();
    }
    set = std::make_unique<ProfileSet>(ProfileSet::load(dir.string(), 6));
  }
  return *set;
}

TEST_CASE("the pruned search returns what exhaustive search returns, on 24 small clusters", "[plan_search]") {
  expect_pruned_equals_exhaustive(small_profiles(), sim_options(), false);
}

// Each bound the search prunes with, exercised where it differs: the forward and backward bounded
// apart (measured forwards, or the backward share), measured accumulation, a sustained pace, uneven
// shares, GPipe's paths and 1F1B's, and tp groups across nodes (where f and b are not bounded apart).
TEST_CASE("the pruned search returns what exhaustive search returns: measured profiles, GPipe, cross-node tp",
          "[plan_search]") {
  SimulationOptions gpipe = sim_options();
  gpipe.schedule = Schedule::kGpipe;
  SECTION("measured, 1F1B") { expect_pruned_equals_exhaustive(measured_profiles(), sim_options(), false, true); }
  SECTION("measured, GPipe") { expect_pruned_equals_exhaustive(measured_profiles(), gpipe, false, true); }
  SECTION("analytic, GPipe") { expect_pruned_equals_exhaustive(small_profiles(), gpipe, false); }
  SECTION("measured, 1F1B, tp across nodes") {
    expect_pruned_equals_exhaustive(measured_profiles(), sim_options(), true, true);
  }
  SECTION("analytic, GPipe, tp across nodes") { expect_pruned_equals_exhaustive(small_profiles(), gpipe, true); }
  // The throughput bound that stands in for the table on clusters too large for it.
  SECTION("measured, 1F1B, throughput bound") {
    expect_pruned_equals_exhaustive(measured_profiles(), sim_options(), false, true, 0);
  }
  SECTION("analytic, GPipe, throughput bound") { expect_pruned_equals_exhaustive(small_profiles(), gpipe, false, true, 0); }
  // Mixed stages' estimates by the whole-sample capacity bound, as on hundreds of GPUs: with the table
  // and with the throughput bound.
  SECTION("measured, 1F1B, capacity bound of mixed stages") {
    expect_pruned_equals_exhaustive(measured_profiles(), sim_options(), false, true, 4e9, clusterfile(), 20,
                                    StageBoundaries::kRank, 0);
  }
  SECTION("analytic, GPipe, throughput bound, capacity bound of mixed stages") {
    expect_pruned_equals_exhaustive(small_profiles(), gpipe, false, true, 0, clusterfile(), 20, StageBoundaries::kRank, 0);
  }
}

// GPUs of 2-3.5 GB, below the small model's ~5 GB of model states: most stages cannot hold their layers,
// which the suffix tables leave out by PlanCostModel::state_bytes_lower_bound.
TEST_CASE("the pruned search returns what exhaustive search returns with overlap as a dimension",
          "[plan_search][seqpar]") {
  expect_pruned_equals_exhaustive(small_profiles(), sim_options(), false, true, PlanSearchOptions().suffix_table_limit,
                                  clusterfile(), 20, StageBoundaries::kRank, PlanSearchOptions().mixed_table_limit,
                                  "auto");
}

// Context parallelism as a dimension (cp 1, 2 and 4, each size searched apart: context_parallel_parts): the
// search with its bounds, each size's estimates priced per cp group, returns what exhaustive enumeration
// returns, plan for plan and setting for setting (cp included), on the 30 clusters: with the per-rank
// tables on measured profiles (a replica's share from slices, uneven splits), with the throughput bound
// in their place, and with mixed stages' whole-sample capacity bound. cp plans are among the best.
TEST_CASE("the pruned search returns what exhaustive search returns with cp as a dimension", "[plan_search][cp]") {
  const PlanSearchOptions d;
  const std::vector<int> cps{1, 2, 4};
  const int tables = expect_pruned_equals_exhaustive(measured_profiles(), sim_options(), false, true,
                                                     d.suffix_table_limit, clusterfile(), 20, StageBoundaries::kRank,
                                                     d.mixed_table_limit, "off", cps);
  CHECK(tables > 0);  // the dimension is searched, not ignored
  CHECK(expect_pruned_equals_exhaustive(small_profiles(), sim_options(), false, true, 0, clusterfile(), 20,
                                        StageBoundaries::kRank, 0, "off", cps) > 0);
  WARN("cp plans in the top 3s: " << tables << " (measured profiles, per-rank tables)");
}

// The six-layer GPT at 32768 tokens, A100 profiles at tp 1, micro-batches 1-4.
ModelConfig long_sequence_model() {
  ModelConfig m = test::six_layer_model();
  m.sequence_length = 32768;
  return m;
}
const ProfileSet& long_sequence_profiles() {
  static std::unique_ptr<ProfileSet> set;
  if (!set) {
    AnalyticOptions a;
    a.model = long_sequence_model();
    a.device_types = {"A100"};
    a.max_tp = 2;
    a.max_bs = 4;
    const std::string dir = test::scratch_dir("plan-search-32k").string();
    generate_analytic_profiles(a, dir);
    set = std::make_unique<ProfileSet>(ProfileSet::load(dir, 6));
  }
  return *set;
}

// The 32k-token model on 12 small clusters of A100s (1-4 GPUs, nodes of 1-2, 20-40 GB) at gbs 2-8, where
// memory binds and cp plans are often the best: the search at gap 0 returns exhaustive search's plans with
// cp 1, 2 and 4 as a dimension, every ZeRO and recomputation setting, the best plan alone without seeds
// (the bounds alone must reach the best cost: a cp estimate above its stage's cost prunes a best cp plan)
// and the top 3 with them; stages on any rank, and of whole nodes with the bounds pass (the tails, the coupled
// entries and the tables' own plans at each size).
TEST_CASE("32k tokens on small clusters: the search returns exhaustive search's plans with cp as a dimension",
          "[plan_search][cp]") {
  const ProfileSet& profiles = long_sequence_profiles();
  const ModelShape shape = shape_from_model_config(long_sequence_model());
  const std::vector<Case> long_cases = {
      {{{"10.0.0.1", 1}, {"10.0.0.2", 1}}, 4}, {{{"10.0.0.1", 2}}, 2},  {{{"10.0.0.3", 2}}, 4},
      {{{"10.0.0.1", 2}, {"10.0.0.2", 2}}, 8}, {{{"10.0.0.3", 2}, {"10.0.0.4", 1}}, 6},
      {{{"10.0.0.1", 1}, {"10.0.0.2", 1}, {"10.0.0.3", 1}, {"10.0.0.4", 1}}, 4}, {{{"10.0.0.2", 2}}, 8},
      {{{"10.0.0.4", 2}, {"10.0.0.4", 2}}, 4}, {{{"10.0.0.3", 1}, {"10.0.0.4", 2}}, 2},
      {{{"10.0.0.1", 2}, {"10.0.0.3", 2}}, 2}, {{{"10.0.0.2", 1}, {"10.0.0.4", 1}}, 8}, {{{"10.0.0.1", 4}}, 4}};
  const std::vector<ClusterfileEntry> gpus = {{"10.0.0.1", "A100", 25, 300, 20}, {"10.0.0.2", "A100", 25, 300, 24},
                                              {"10.0.0.3", "A100", 25, 300, 32}, {"10.0.0.4", "A100", 25, 300, 40}};
  const std::vector<TrainingSetup> setups =
      with_context_parallel_dimension(search_setups(sim_options().setup, "auto", "auto"), {1, 2, 4});
  int cp_best = 0, with_plans = 0;
  for (const Case& c : long_cases) {
    INFO(describe(c));
    const Cluster cluster = Cluster::from_parts(c.hosts, gpus, "hosts", "clusterfile");
    const PlanSimulator sim(cluster, profiles, shape, 32768, sim_options());
    for (const int k : {1, 3, 4}) {
      INFO("top " << (k == 4 ? 3 : k) << (k == 4 ? ", whole nodes, bounds pass" : ""));
      PlanSearchOptions o;
      o.gbs = c.gbs;
      o.top_k = k == 4 ? 3 : k;
      o.seed_time_s = k == 1 ? 0 : o.seed_time_s;
      if (k == 4) {
        o.stage_boundaries = StageBoundaries::kNode;
        o.bounds_pass_above_gpus = 0;
      }
      o.setups = setups;
      const PlanSearchResult pruned = PlanSearch(cluster, profiles, sim, o).run();
      const PlanSearchResult full = exhaustive_search(cluster, profiles, sim, o);
      REQUIRE(pruned.top.size() == full.top.size());
      for (std::size_t i = 0; i < full.top.size(); ++i) {
        check_same_plan(pruned.top[i].plan, full.top[i].plan);
        CHECK(pruned.top[i].setup == full.top[i].setup);
      }
      CHECK(pruned.costed <= full.costed);
      if (k == 1 && !full.top.empty()) {
        ++with_plans;
        cp_best += setups[full.top[0].setup].context_parallel > 1;
      }
    }
  }
  CHECK(with_plans >= 10);
  CHECK(cp_best >= 4);  // cp is best on many of them: the equality above covers the cp bounds
  WARN("cp plans best on " << cp_best << " of " << with_plans << " clusters");
}

// A 32k-token sequence on two nodes of one A100 each, kLongSequenceGiB of memory: without context
// parallelism no plan fits (one GPU cannot hold a whole sequence's activations, dp 2 gives each GPU a whole
// sequence, tp stays inside a node, and a pipeline of two keeps two sequences' activations on stage 0);
// at cp 2 each GPU holds half of every sequence, and the search finds that plan, as exhaustive search does.
// With every ZeRO and recomputation setting (where recomputation lets cp 1 fit), cp 2 is still the fastest.
constexpr int kLongSequenceGiB = 20;
TEST_CASE("a 32k-token sequence on two GPUs: no plan fits without cp, the search finds the cp 2 plan",
          "[plan_search][cp]") {
  const std::vector<ClusterfileEntry> gpus = {{"10.0.0.1", "A100", 25, 300, kLongSequenceGiB},
                                              {"10.0.0.2", "A100", 25, 300, kLongSequenceGiB}};
  const Cluster cluster = Cluster::from_parts({{"10.0.0.1", 1}, {"10.0.0.2", 1}}, gpus, "hosts", "clusterfile");
  const ProfileSet& profiles = long_sequence_profiles();
  const ModelShape shape = shape_from_model_config(long_sequence_model());
  const PlanSimulator sim(cluster, profiles, shape, 32768, sim_options());
  auto search = [&](const std::vector<TrainingSetup>& setups, const std::vector<int>& cps, bool exhaustive) {
    PlanSearchOptions o;
    o.gbs = 4;
    o.top_k = 3;
    o.setups = with_context_parallel_dimension(setups, cps);
    o.exhaustive = exhaustive;
    return PlanSearch(cluster, profiles, sim, o).run();
  };
  const TrainingSetup plain = sim_options().setup;  // ZeRO-0, no recomputation
  const PlanSearchResult without = search({plain}, {1}, false);
  CHECK(without.top.empty());
  CHECK(without.space_empty);
  CHECK(search({plain}, {1}, true).top.empty());

  const std::vector<TrainingSetup> at_cp = with_context_parallel_dimension({plain}, {1, 2});
  const PlanSearchResult with = search({plain}, {1, 2}, false), full = search({plain}, {1, 2}, true);
  REQUIRE(!with.top.empty());
  CHECK(with.proven);
  REQUIRE(with.top.size() == full.top.size());
  for (std::size_t i = 0; i < full.top.size(); ++i) {
    check_same_plan(with.top[i].plan, full.top[i].plan);
    CHECK(with.top[i].setup == full.top[i].setup);
    CHECK(at_cp[with.top[i].setup].context_parallel == 2);
  }
  // One stage of both GPUs, one cp group of two ranks: a sample per micro-batch, half of it per GPU.
  const PlanResult& best = with.top[0].plan;
  CHECK(best.device_groups == std::vector<int>{2});
  CHECK(best.strategies == std::vector<Strategy>{Strategy{2, 1}});
  CHECK(best.batches == 4);
  SimulationOptions cs = sim_options();
  cs.setup = at_cp[with.top[0].setup];
  const PlanSimulation simulated = PlanSimulator(cluster, profiles, shape, 32768, cs).simulate(best, 4);
  CHECK(simulated.fits);
  CHECK(simulated.timeline.iteration_ms == Approx(best.cost).epsilon(1e-9));

  // Every ZeRO stage and recomputation: recomputation fits cp 1, and cp 2 is faster still.
  const std::vector<TrainingSetup> settings = search_setups(plain, "auto", "auto");
  const PlanSearchResult one = search(settings, {1}, false);
  REQUIRE(!one.top.empty());
  CHECK(settings[one.top[0].setup].recompute != Recompute::kNone);
  const std::vector<TrainingSetup> both = with_context_parallel_dimension(settings, {1, 2});
  const PlanSearchResult any = search(settings, {1, 2}, false), any_full = search(settings, {1, 2}, true);
  REQUIRE(!any.top.empty());
  CHECK(both[any.top[0].setup].context_parallel == 2);
  CHECK(any.top[0].plan.cost < one.top[0].plan.cost);
  REQUIRE(any.top.size() == any_full.top.size());
  for (std::size_t i = 0; i < any.top.size(); ++i) {
    check_same_plan(any.top[i].plan, any_full.top[i].plan);
    CHECK(any.top[i].setup == any_full.top[i].setup);
  }
}

TEST_CASE("search --cp is 1, N or auto (powers of two that split the sequence into 2 cp chunks), bad values name --cp",
          "[plan_search][cp]") {
  CHECK(parse_context_parallel("1", 1024, 8) == std::vector<int>{1});
  CHECK(parse_context_parallel("2", 1024, 8) == std::vector<int>{2});
  CHECK(parse_context_parallel("auto", 1024, 8) == std::vector<int>{1, 2, 4, 8});
  CHECK(parse_context_parallel("auto", 1024, 6) == std::vector<int>{1, 2, 4});
  CHECK(parse_context_parallel("auto", 24, 64) == std::vector<int>{1, 2, 4});  // 24 = 2 x 12: not 2 x 8
  CHECK_THROWS_WITH(parse_context_parallel("3", 1024, 8), Catch::Contains("--cp 3") && Catch::Contains("2 x cp = 6"));
  CHECK_THROWS_WITH(parse_context_parallel("two", 1024, 8), Catch::StartsWith("--cp: 'two'"));
  CHECK_THROWS_WITH(parse_context_parallel("0", 1024, 8), Catch::StartsWith("--cp: '0'"));
  // The dimension: every setting at each size, size-major; the parts by size, smallest first.
  TrainingSetup a, b;
  b.zero_stage = 1;
  const std::vector<TrainingSetup> s = with_context_parallel_dimension({a, b}, {1, 4});
  REQUIRE(s.size() == 4);
  CHECK(s[1].zero_stage == 1);
  CHECK(s[2].context_parallel == 4);
  CHECK(context_parallel_parts(s) == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  CHECK(context_parallel_parts({a, b}) == std::vector<std::vector<int>>{{0, 1}});
}

// Virtual stages as a dimension (search_virtual_stages over v = 1 and 2): the search with its bounds
// returns what exhaustive enumeration returns, plan for plan, and interleaved plans are among the best.
TEST_CASE("the pruned search returns what exhaustive search returns with v as a dimension", "[plan_search][interleaved]") {
  int compared = 0, interleaved_best = 0, interleaved_top = 0;
  for (const Case& c : cases(true)) {
    INFO(describe(c));
    const Cluster cluster = Cluster::from_parts(c.hosts, clusterfile(), "hosts", "clusterfile");
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.top_k = 3;
    TrainingSetup a = sim_options().setup, b = a;
    b.zero_stage = 1;
    b.recompute = Recompute::kFull;
    o.setups = {a, b};
    PlanSearchOptions ex = o;
    ex.exhaustive = true;
    const ModelShape shape = test::six_layer_shape();
    const PlanSearchResult pruned = search_virtual_stages(cluster, measured_profiles(), shape, 1024, sim_options(), o, {1, 2});
    const PlanSearchResult full = search_virtual_stages(cluster, measured_profiles(), shape, 1024, sim_options(), ex, {1, 2});
    REQUIRE(pruned.top.size() == full.top.size());
    for (std::size_t i = 0; i < full.top.size(); ++i) {
      const PlanResult& x = pruned.top[i].plan;
      const PlanResult& y = full.top[i].plan;
      check_same_plan(x, y);
      CHECK(pruned.top[i].setup == full.top[i].setup);
      CHECK(pruned.top[i].virtual_stages == full.top[i].virtual_stages);
      if (full.top[i].virtual_stages > 1) {
        ++interleaved_top;
        // Megatron's rule and every chunk a layer.
        CHECK(y.batches % static_cast<int>(y.device_groups.size()) == 0);
        for (std::size_t s = 0; s + 1 < y.layer_partition.size(); ++s)
          CHECK(stage_blocks(y.layer_partition[s], y.layer_partition[s + 1], 6) >= 2);
        // Its cost is the simulator's for that plan.
        SimulationOptions so = sim_options();
        so.schedule = Schedule::kInterleaved1F1B;
        so.virtual_stages = 2;
        so.setup = o.setups[full.top[i].setup];
        const PlanSimulator sim(cluster, measured_profiles(), shape, 1024, so);
        CHECK(sim.simulate(y, c.gbs).timeline.iteration_ms == y.cost);
      }
    }
    if (!full.top.empty() && full.top[0].virtual_stages > 1) ++interleaved_best;
    CHECK(pruned.costed <= full.costed);
    ++compared;
  }
  CHECK(compared == 30);
  CHECK(interleaved_top > 0);  // the dimension is searched, not ignored
  WARN("interleaved plans best on " << interleaved_best << " of 30 clusters, " << interleaved_top << " in the top 3s");
}

TEST_CASE("the pruned search returns what exhaustive search returns when model states overflow the GPUs",
          "[plan_search][memory]") {
  const std::vector<ClusterfileEntry> small_gpus = {{"10.0.0.1", "A100", 25, 300, 3.5}, {"10.0.0.2", "H100", 50, 450, 3},
                                                    {"10.0.0.3", "V100", 10, 50, 2.5}, {"10.0.0.4", "V100", 10, 50, 2}};
  // GPUs this small are sized against the allocated peak: the device-memory model's NCCL buffers (1-3 GB,
  // sim/device_memory.h) would leave no plan, so it is off here; the other tests search with it.
  SimulationOptions plain = sim_options();
  plain.device_memory.enabled = false;
  plain.device_memory.headroom_fraction = 0;
  SimulationOptions gpipe = plain;
  gpipe.schedule = Schedule::kGpipe;
  SECTION("analytic, 1F1B") { expect_pruned_equals_exhaustive(small_profiles(), plain, false, true, 4e9, small_gpus, 12); }
  SECTION("measured, GPipe") { expect_pruned_equals_exhaustive(measured_profiles(), gpipe, false, true, 4e9, small_gpus, 12); }
  // Without the table, the depth-first search's own test of the states (before stage()) does the work.
  SECTION("measured, 1F1B, throughput bound") {
    expect_pruned_equals_exhaustive(measured_profiles(), plain, false, true, 0, small_gpus, 12);
  }
}

// Stages of whole nodes (StageBoundaries::kNode, the default above kWholeNodeStagesAbove GPUs): the pruned
// search against exhaustive enumeration of the same space, with the table and with the throughput bound;
// every stage of every plan starts a node.
TEST_CASE("the pruned search returns what exhaustive search returns with stages of whole nodes", "[plan_search]") {
  SimulationOptions gpipe = sim_options();
  gpipe.schedule = Schedule::kGpipe;
  // 28 of the 30 clusters have plans of whole nodes.
  SECTION("measured, 1F1B") {
    expect_pruned_equals_exhaustive(measured_profiles(), sim_options(), false, true, 4e9, clusterfile(), 28,
                                    StageBoundaries::kNode);
  }
  SECTION("analytic, GPipe, throughput bound") {
    expect_pruned_equals_exhaustive(small_profiles(), gpipe, false, true, 0, clusterfile(), 28, StageBoundaries::kNode);
  }
  SECTION("measured, 1F1B, capacity bound of mixed stages (as above 256 GPUs)") {
    expect_pruned_equals_exhaustive(measured_profiles(), sim_options(), false, true, 4e9, clusterfile(), 28,
                                    StageBoundaries::kNode, 0);
  }
  CHECK(whole_node_stages(StageBoundaries::kAuto, kWholeNodeStagesAbove + 1));
  CHECK_FALSE(whole_node_stages(StageBoundaries::kAuto, kWholeNodeStagesAbove));
  CHECK(whole_node_stages(StageBoundaries::kNode, 2));
  CHECK_FALSE(whole_node_stages(StageBoundaries::kRank, 1024));
  CHECK(parse_stage_boundaries("node") == StageBoundaries::kNode);
  CHECK(parse_stage_boundaries("rank") == StageBoundaries::kRank);
  CHECK(parse_stage_boundaries("auto") == StageBoundaries::kAuto);
  CHECK_THROWS_WITH(parse_stage_boundaries("nodes"), "--stage-boundaries: 'nodes': expected auto, node or rank");
}

TEST_CASE("the default search's plans use every GPU, layer and sample, keep tp in a node, and fit", "[plan_search]") {
  const ProfileSet& profiles = small_profiles();
  for_each_case(false, profiles, [&](const Case& c, const Cluster& cluster, const PlanSimulator& sim) {
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.top_k = 5;
    const PlanSearchResult r = PlanSearch(cluster, profiles, sim, o).run();
    for (const SearchedPlan& sp : r.top) check_plan_of_the_space(cluster, sim, sp.plan, c.gbs);
  });
}

// The thread tests' cluster: 7 GPUs of three types in nodes of 2, 3 and 2, with the small model.
struct SevenGpus {
  const ProfileSet& profiles = small_profiles();
  const Cluster cluster = Cluster::from_parts({{"10.0.0.2", 2}, {"10.0.0.1", 3}, {"10.0.0.3", 2}}, clusterfile());
  const PlanSimulator sim{cluster, profiles, test::six_layer_shape(), 1024, sim_options()};
};

TEST_CASE("the default search does not depend on the thread count", "[plan_search]") {
  const SevenGpus c;
  PlanSearchOptions o;
  o.gbs = 12;
  o.top_k = 10;
  o.threads = 1;
  const PlanSearchResult one = PlanSearch(c.cluster, c.profiles, c.sim, o).run();
  o.threads = 2;
  const PlanSearchResult two = PlanSearch(c.cluster, c.profiles, c.sim, o).run();
  // A caller's arena of 3 slots (PlanSearchOptions::arena), o.threads then ignored; 3 threads run even on
  // fewer cores.
  const auto limit_of_three = allow_threads_beyond_cores(3, tbb::info::default_concurrency());
  tbb::task_arena arena(3);
  o.arena = &arena;
  o.threads = 1;
  const PlanSearchResult three = PlanSearch(c.cluster, c.profiles, c.sim, o).run();
  REQUIRE(one.top.size() == 10);
  REQUIRE(two.top.size() == 10);
  REQUIRE(three.top.size() == 10);
  for (std::size_t i = 0; i < one.top.size(); ++i)
    for (const PlanSearchResult* other : {&two, &three}) {
      CHECK(one.top[i].plan.cost == other->top[i].plan.cost);
      CHECK(one.top[i].plan.device_groups == other->top[i].plan.device_groups);
      CHECK(one.top[i].plan.layer_partition == other->top[i].plan.layer_partition);
    }
  CHECK(one.enumerated > 0);
}

TEST_CASE("a cancelled search returns what it found and says it was cut short", "[plan_search]") {
  const ProfileSet& profiles = small_profiles();
  const Cluster cluster = Cluster::from_parts({{"10.0.0.2", 4}, {"10.0.0.3", 3}}, clusterfile());
  const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
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
  // Stopped as the parallel work starts (a time budget already spent), on two threads: no thread waits
  // for ever on work that the other has dropped.
  o.threads = 2;
  o.time_budget_s = 1e-9;
  const PlanSearchResult late = PlanSearch(cluster, profiles, sim, o).run();
  CHECK(late.cut_short);
  CHECK(late.cut_reason.rfind("time budget", 0) == 0);
}

TEST_CASE("a --gbs whose micro-batches need too many profile slicings is refused, naming --gbs", "[plan_search]") {
  const ProfileSet& profiles = small_profiles();
  const Cluster cluster = Cluster::from_parts({{"10.0.0.2", 4}, {"10.0.0.3", 3}}, clusterfile());
  const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
  PlanSearchOptions o;
  o.gbs = 1 << 20;  // micro-batches of up to 2^20 sequences: 3 types x 5 tp x (2^20 + 1) slicings
  try {
    (void)PlanSearch(cluster, profiles, sim, o).run();
    FAIL("expected an InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).rfind("--gbs 1048576: ", 0) == 0);
    CHECK(std::string(e.what()).find("(use a smaller --gbs)") != std::string::npos);
  }
  o.max_micro_batch = 1 << 10;  // within the limit: searched
  o.time_budget_s = 1e-9;
  CHECK(PlanSearch(cluster, profiles, sim, o).run().cut_short);
}

TEST_CASE("stage estimates: span_index lays layer spans out row by row, the budget and the slot keep their word",
          "[plan_search][estimates]") {
  using namespace stage_estimates;
  // span_index is a bijection of {(l, e): 0 <= l < e <= L} onto [0, L (L + 1) / 2), contiguous in e.
  for (int L : {1, 2, 7, 42}) {
    std::vector<int> seen(spans(L), 0);
    std::size_t next = 0;
    for (int l = 0; l < L; ++l)
      for (int e = l + 1; e <= L; ++e) {
        const std::size_t i = span_index(L, l, e);
        REQUIRE(i == next++);
        ++seen[i];
      }
    CHECK(next == spans(L));
    CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<long>(spans(L)));
  }
  // The budget gives what is left and no more.
  EstimateBudget budget(100);
  CHECK(budget.take(60));
  CHECK_FALSE(budget.take(60));
  CHECK(budget.take(40));
  CHECK_FALSE(budget.take(1));
  // A slot is filled once; within the budget it keeps the estimates, past it every caller gets nullptr.
  EstimateBudget roomy(10 * sizeof(StageEstimate)), tight(sizeof(StageEstimate));
  EstimateSlot slot, over;
  int fills = 0;
  auto fill = [&](StageEstimate* v) {
    ++fills;
    for (int i = 0; i < 3; ++i) v[i] = StageEstimate{1.0 + i, 0.5, 0.5, 0.25};
  };
  const StageEstimate* a = slot.get(3, roomy, fill);
  const StageEstimate* b = slot.get(3, roomy, fill);
  REQUIRE(a != nullptr);
  CHECK(a == b);
  CHECK(fills == 1);
  CHECK(a[2].t == 3.0);
  CHECK(over.get(3, tight, fill) == nullptr);
  CHECK(over.get(3, tight, fill) == nullptr);
  CHECK(fills == 1);  // past the budget nothing is filled
  // A fill that throws (out of memory) leaves the slot empty and ready: its exception reaches its caller,
  // and a later caller gets nullptr instead of waiting for ever on a fill that will not end.
  EstimateSlot failed;
  auto throwing = [&](StageEstimate*) { throw std::bad_alloc(); };
  EstimateBudget exact(3 * sizeof(StageEstimate));
  CHECK_THROWS_AS(failed.get(3, exact, throwing), std::bad_alloc);
  CHECK(failed.get(3, exact, fill) == nullptr);
  CHECK(fills == 1);
  CHECK(exact.take(3 * sizeof(StageEstimate)));  // what the failed fill took is given back
}

// Where the mixed-stage table is too large (hundreds of GPUs), a mixed stage's estimate is the whole-sample
// capacity bound: the least T at which the replicas, each computing at most floor(T / w) samples (w its
// type's least time per sample), cover the micro-batch; its replicas counted per run of one type. Checked
// against that T found replica by replica over every breakpoint k w, and against the table's exact
// estimate (its slowest replica's profile time), which it must never exceed.
TEST_CASE("stage estimates: a mixed stage's capacity bound counts its replicas and stays below the exact estimate",
          "[plan_search][estimates]") {
  using namespace stage_estimates;
  const ProfileSet& profiles = small_profiles();
  const int L = profiles.num_layers(), max_tp = 4;
  const Cluster cluster = Cluster::from_parts({{"10.0.0.1", 4}, {"10.0.0.2", 2}, {"10.0.0.3", 4}, {"10.0.0.3", 2}},
                                              clusterfile(), "hosts", "clusterfile");
  const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
  const int types = static_cast<int>(cluster.device_types().size());
  int mixed = 0;
  for (const std::vector<int>& perm : {std::vector<int>{0, 1, 2}, std::vector<int>{2, 0, 1}}) {
    const RankLayout layout(cluster, perm);
    const PlanCostModel cost(sim, layout, {sim.options().setup});
    const std::vector<double> unmeasured(static_cast<std::size_t>(types) * (max_tp + 1) * (L + 1) * (L + 1), 0.0);
    for (int b : {1, 3, 8}) {
      const ShareSlices slices(profiles, cluster, max_tp, b, sim.options().max_profiled_bs);
      EstimateBudget budget(std::size_t{64} << 20);
      MixedLists lists(budget);
      const StageEstimator exact(profiles, cluster, layout, cost, slices, lists, b, max_tp, true, 2.0 / 3, unmeasured, L);
      const StageEstimator capacity(profiles, cluster, layout, cost, slices, lists, b, max_tp, true, 2.0 / 3, unmeasured,
                                    L, 0);
      const int R = layout.num_ranks();
      for (int r = 0; r < R; ++r)
        for (int s = 2; r + s <= R; ++s) {
          if (layout.homogeneous(r, r + s)) continue;
          for (int tp = 1; tp <= std::min(s, max_tp); ++tp) {
            const int dp = s / tp;
            if (s % tp != 0 || dp > b) continue;
            for (int l = 0; l < L; ++l)
              for (int e = l + 1; e <= L; ++e) {
                // Replica by replica: each type's least time per sample over its files of bs <= b.
                std::vector<double> w;
                for (int d = 0; d < dp; ++d) {
                  const int pt = profiles.type_index(cluster.device_types()[layout.type_of(r + d * tp)]);
                  double best = std::numeric_limits<double>::infinity();
                  for (int bs = 1; bs <= b; ++bs)
                    if (const LayerProfile* lp = profiles.find(pt, tp, bs)) best = std::min(best, lp->time(l, e) / bs);
                  if (std::isfinite(best)) w.push_back(best);
                }
                // The least breakpoint k w_d (k <= b) at which the replicas finish b samples.
                double least = w.empty() ? 0 : std::numeric_limits<double>::infinity();
                for (double wd : w)
                  for (int k = 1; k <= b; ++k) {
                    long long done = 0;
                    for (double v : w) done += static_cast<long long>(std::floor(k * wd / v * (1 + 1e-12)));
                    if (done >= b) least = std::min(least, k * wd);
                  }
                const StageEstimate x = capacity.estimate(r, s, tp, l, e, false, true);
                INFO("ranks " << r << "+" << s << " tp " << tp << " b " << b << " layers " << l << "-" << e);
                CHECK(x.t == Approx(least).epsilon(1e-9));
                const StageEstimate y = exact.estimate(r, s, tp, l, e, false, true);
                if (std::isfinite(y.t)) CHECK(x.t <= y.t * (1 + 1e-12));
                ++mixed;
              }
          }
        }
    }
  }
  CHECK(mixed > 1000);
}

// Anytime search with a proof (issue 33): seed plans, the global lower bound, --gap.

TEST_CASE("at gap 0 the search returns exhaustive search's best plan and cost, and proves it, on 30 small clusters",
          "[plan_search][anytime]") {
  const ProfileSet& profiles = small_profiles();
  int with_plans = 0, seeded = 0;
  const std::vector<Case> all = cases(true);
  REQUIRE(all.size() >= 30);
  for (const Case& c : all) {
    INFO(describe(c));
    const Cluster cluster = Cluster::from_parts(c.hosts, clusterfile(), "hosts", "clusterfile");
    const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.gap = 0;
    // With the bounds pass too (every group's table and root bound first, groups above the threshold
    // closed), as above 256 GPUs.
    PlanSearchOptions pass = o;
    pass.bounds_pass_above_gpus = 0;
    const PlanSearchResult r = PlanSearch(cluster, profiles, sim, o).run();
    const PlanSearchResult full = exhaustive_search(cluster, profiles, sim, o);
    const PlanSearchResult with_pass = PlanSearch(cluster, profiles, sim, pass).run();
    REQUIRE(r.top.size() == full.top.size());
    REQUIRE(with_pass.top.size() == full.top.size());
    if (!full.top.empty()) {
      CHECK(with_pass.top[0].plan.cost == full.top[0].plan.cost);
      CHECK(with_pass.top[0].plan.device_groups == full.top[0].plan.device_groups);
      CHECK(with_pass.top[0].plan.layer_partition == full.top[0].plan.layer_partition);
      CHECK(with_pass.lower_bound_ms == full.top[0].plan.cost);
    }
    CHECK_FALSE(r.cut_short);
    CHECK(r.proven);
    if (full.top.empty()) {  // the space is proven empty: no plan, no bound
      CHECK(r.space_empty);
      CHECK(r.best_ms == -1);
      CHECK(std::isinf(r.lower_bound_ms));
      continue;
    }
    ++with_plans;
    seeded += r.seeds_costed > 0;
    const PlanResult& x = r.top[0].plan;
    const PlanResult& y = full.top[0].plan;
    check_same_plan(x, y);
    CHECK_FALSE(r.space_empty);
    CHECK(r.best_ms == y.cost);
    CHECK(r.lower_bound_ms == y.cost);  // proven optimal: the bound meets the best
    CHECK(r.gap == 0);
    CHECK(r.first_plan_s >= 0);
  }
  CHECK(with_plans >= 25);
  CHECK(seeded == with_plans);
}

TEST_CASE("the seed plans are plans of the space, costed as simulate costs them, and never below the optimum",
          "[plan_search][anytime]") {
  const ProfileSet& profiles = small_profiles();
  int with_seeds = 0, optimal_seeds = 0;
  for_each_case(true, profiles, [&](const Case& c, const Cluster& cluster, const PlanSimulator& sim) {
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.top_k = 4;
    o.seeds_only = true;
    const PlanSearchResult seeds = PlanSearch(cluster, profiles, sim, o).run();
    o.seeds_only = false;
    o.top_k = 1;
    const PlanSearchResult best = PlanSearch(cluster, profiles, sim, o).run();
    CHECK(seeds.seeds_costed > 0);
    if (seeds.top.empty()) return;
    ++with_seeds;
    REQUIRE_FALSE(best.top.empty());
    optimal_seeds += seeds.top[0].plan.cost == best.top[0].plan.cost;
    for (const SearchedPlan& sp : seeds.top) {
      CHECK(sp.plan.cost >= best.top[0].plan.cost);
      check_plan_of_the_space(cluster, sim, sp.plan, c.gbs);
    }
  });
  CHECK(with_seeds >= 20);
  CHECK(optimal_seeds > 0);
}

TEST_CASE("a gap G: the best plan is within 1 + G of the optimum, and the lower bound is below the optimum",
          "[plan_search][anytime]") {
  const ProfileSet& profiles = small_profiles();
  for_each_case(true, profiles, [&](const Case& c, const Cluster& cluster, const PlanSimulator& sim) {
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.gap = 0.25;
    const PlanSearchResult r = PlanSearch(cluster, profiles, sim, o).run();
    PlanSearchOptions pass = o;  // the bounds pass's root bounds, and its groups closed by them
    pass.bounds_pass_above_gpus = 0;
    const PlanSearchResult with_pass = PlanSearch(cluster, profiles, sim, pass).run();
    o.gap = 0;
    const PlanSearchResult exact = PlanSearch(cluster, profiles, sim, o).run();
    REQUIRE(r.top.empty() == exact.top.empty());
    if (exact.top.empty()) return;
    const double opt = exact.top[0].plan.cost;
    CHECK(r.best_ms >= opt);
    CHECK(r.best_ms <= opt * 1.25 * (1 + 1e-12));
    CHECK(r.lower_bound_ms <= opt * (1 + 1e-12));
    CHECK(r.gap <= 0.25 + 1e-9);
    CHECK(r.proven);
    CHECK(with_pass.best_ms <= opt * 1.25 * (1 + 1e-12));
    CHECK(with_pass.lower_bound_ms <= opt * (1 + 1e-12));
  });
}

TEST_CASE("a search stopped before it starts reports no plan, not an empty space, and a bound below the optimum",
          "[plan_search][anytime]") {
  const ProfileSet& profiles = small_profiles();
  int bounded = 0;
  for_each_case(true, profiles, [&](const Case& c, const Cluster& cluster, const PlanSimulator& sim) {
    std::atomic<bool> cancel{true};
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.cancel = &cancel;
    const PlanSearchResult stopped = PlanSearch(cluster, profiles, sim, o).run();
    CHECK(stopped.cut_short);
    CHECK(stopped.top.empty());
    CHECK_FALSE(stopped.space_empty);  // not searched: no claim that no plan exists
    CHECK_FALSE(stopped.proven);
    cancel = false;
    const PlanSearchResult exact = PlanSearch(cluster, profiles, sim, o).run();
    if (exact.top.empty()) return;
    // The throughput floor: positive, and below every plan.
    CHECK(stopped.lower_bound_ms <= exact.top[0].plan.cost);
    bounded += stopped.lower_bound_ms > 0;
  });
  CHECK(bounded >= 20);
}


TEST_CASE("the search never proposes a tp that does not split the attention heads (12 heads: no tp 8)",
          "[plan_search][heads]") {
  // tp 1, 2, 4 and 8 profiles of one model on one 8-GPU H100 node; the search's model has 16 heads (every tp
  // splits them) or 12 (tp 8 does not: Megatron-LM needs the heads a multiple of tp).
  static std::unique_ptr<ProfileSet> profiles;
  if (!profiles) {
    AnalyticOptions a;
    a.model = test::six_layer_model();
    a.device_types = {"H100"};
    a.max_tp = 8;
    a.max_bs = 8;
    const auto dir = test::scratch_dir("plan-search-heads");
    generate_analytic_profiles(a, dir.string());
    profiles = std::make_unique<ProfileSet>(ProfileSet::load(dir.string(), 6));
  }
  const Cluster cluster = Cluster::from_parts({{"10.0.0.2", 8}}, clusterfile(), "hosts", "clusterfile");
  auto largest_tp = [&](int heads, int kv_heads) {
    ModelShape shape = test::six_layer_shape();
    shape.num_heads = heads;
    shape.num_kv_heads = kv_heads;
    shape.head_dim = shape.hidden_size / heads;
    const PlanSimulator sim(cluster, *profiles, shape, 1024, sim_options());
    PlanSearchOptions o;
    o.gbs = 8;
    o.gap = 0;
    o.top_k = 400;  // every plan of the space, or nearly
    const PlanSearchResult r = PlanSearch(cluster, *profiles, sim, o).run();
    REQUIRE_FALSE(r.top.empty());
    int tp = 0;
    for (const SearchedPlan& sp : r.top)
      for (const Strategy& st : sp.plan.strategies) {
        CHECK(tp_splits_heads(shape, st.tp));
        tp = std::max(tp, st.tp);
      }
    return tp;
  };
  CHECK(largest_tp(16, 16) == 8);  // the space has tp 8 plans where the heads split
  CHECK(largest_tp(12, 12) == 4);  // and none where they do not
  CHECK(largest_tp(16, 2) == 8);   // GQA: 2 key/value heads divide tp 8 (Megatron replicates them)
  CHECK(largest_tp(16, 4) == 8);
  CHECK_FALSE(tp_splits_heads(test::six_layer_shape(), 3));
  ModelShape gqa = test::six_layer_shape();
  gqa.num_heads = 24;
  gqa.num_kv_heads = 6;
  CHECK(tp_splits_heads(gqa, 2));
  CHECK(tp_splits_heads(gqa, 6));
  CHECK_FALSE(tp_splits_heads(gqa, 4));  // 6 key/value heads: neither a multiple nor a divisor of 4
  CHECK(heads_split_problem(gqa, 4).find("key/value heads") != std::string::npos);
  CHECK(heads_split_problem(gqa, 6).empty());
}

TEST_CASE("stage estimates add the recomputed forward of a search's settings, and stay below the stage's cost",
          "[plan_search][estimates][settings]") {
  using namespace stage_estimates;
  const ProfileSet& profiles = small_profiles();
  const int L = profiles.num_layers(), max_tp = 4;
  const Cluster cluster = Cluster::from_parts({{"10.0.0.1", 4}, {"10.0.0.2", 2}, {"10.0.0.3", 3}}, clusterfile(),
                                              "hosts", "clusterfile");
  const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
  const int types = static_cast<int>(cluster.device_types().size());
  TrainingSetup none = sim.options().setup, full = none, selective = none;
  full.recompute = Recompute::kFull;
  selective.recompute = Recompute::kSelective;
  const RankLayout layout(cluster, {0, 1, 2});
  const PlanCostModel plain(sim, layout, {none});
  const PlanCostModel recomputing(sim, layout, {full, selective});  // the least: selective
  const PlanCostModel both(sim, layout, {none, full});               // the least: none
  CHECK(plain.least_recompute_fraction() == 0);
  CHECK(both.least_recompute_fraction() == 0);
  CHECK(recomputing.least_recompute_fraction() > 0);
  const std::vector<double> unmeasured(static_cast<std::size_t>(types) * (max_tp + 1) * (L + 1) * (L + 1), 0.0);
  int compared = 0, raised = 0;
  for (int b : {1, 3, 4}) {
    const ShareSlices slices(profiles, cluster, max_tp, b, sim.options().max_profiled_bs);
    EstimateBudget budget(std::size_t{64} << 20);
    MixedLists lists(budget);
    const StageEstimator est_plain(profiles, cluster, layout, plain, slices, lists, b, max_tp, true, 2.0 / 3, unmeasured, L);
    const StageEstimator est_both(profiles, cluster, layout, both, slices, lists, b, max_tp, true, 2.0 / 3, unmeasured, L);
    const StageEstimator est_rec(profiles, cluster, layout, recomputing, slices, lists, b, max_tp, true, 2.0 / 3,
                                 unmeasured, L);
    const int R = layout.num_ranks();
    for (int r = 0; r < R; ++r)
      for (int s = 1; r + s <= R; ++s)
        for (int tp = 1; tp <= std::min(s, max_tp); ++tp) {
          const int dp = s / tp;
          if (s % tp != 0 || dp > b || !tp_groups_inside_nodes(layout, r, Strategy{dp, tp})) continue;
          const bool homo = layout.homogeneous(r, r + s);
          for (int l = 0; l < L; ++l)
            for (int e = l + 1; e <= L; ++e) {
              INFO("ranks " << r << "+" << s << " tp " << tp << " b " << b << " layers " << l << "-" << e);
              const StageEstimate x0 = est_plain.estimate(r, s, tp, l, e, homo, true);
              const StageEstimate xb = est_both.estimate(r, s, tp, l, e, homo, true);
              const StageEstimate xr = est_rec.estimate(r, s, tp, l, e, homo, true);
              if (!std::isfinite(x0.t)) continue;
              CHECK(xb.t == x0.t);  // a setting without recomputation in the search: nothing added
              CHECK(xb.b == x0.b);
              CHECK(xr.t >= x0.t);
              CHECK(xr.b >= x0.b);
              CHECK(xr.f == x0.f);
              CHECK(xr.f + xr.b <= xr.t * (1 + 1e-12));
              const bool blocks = std::min(e, L - 1) > std::max(l, 1);
              CHECK((xr.t > x0.t) == blocks);  // only the blocks are recomputed
              raised += xr.t > x0.t;
              // Below what the cost model charges the stage under each recomputing setting (a middle stage).
              StageChoice c;
              c.begin = r;
              c.size = s;
              c.st = Strategy{dp, tp};
              c.layer_begin = l;
              c.layer_end = e;
              FastStageCost fc[2];
              REQUIRE(recomputing.stage(c, 1, 3, 4, b, fc));
              for (const FastStageCost& q : fc) {
                CHECK(xr.t <= (q.forward_ms + q.backward_ms) * (1 + 1e-12));
                CHECK(xr.b <= q.backward_ms * (1 + 1e-12));
              }
              ++compared;
            }
        }
  }
  CHECK(compared > 500);
  CHECK(raised > 200);
}

TEST_CASE("a plan offered again at a lower cost counts once in the pruning threshold", "[plan_search][settings]") {
  SharedBound shared(2);
  shared.offer(10, 1);
  shared.offer(11, 2);
  CHECK(shared.threshold() == Approx(11).epsilon(1e-8));
  shared.offer(9, 1);  // plan 1 again, under another setting: still two plans, 9 and 11
  CHECK(shared.best() == 9);
  CHECK(shared.threshold() == Approx(11).epsilon(1e-8));
  shared.offer(12, 1);  // and at a higher cost: ignored
  CHECK(shared.threshold() == Approx(11).epsilon(1e-8));
  shared.offer(10.5, 3);
  CHECK(shared.threshold() == Approx(10.5).epsilon(1e-8));
}

TEST_CASE("with --zero auto --recompute auto the search in setting parts returns exhaustive search's plans",
          "[plan_search][settings]") {
  const ProfileSet& profiles = small_profiles();
  int with_plans = 0, differ_from_plain = 0;
  // V100s of 16 GiB too, where memory makes the settings matter.
  for_each_case(true, profiles, [&](const Case& c, const Cluster& cluster, const PlanSimulator& sim) {
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.gap = 0;
    o.top_k = 3;
    o.setups = search_setups(sim.options().setup, "auto", "auto");
    REQUIRE(o.setups.size() == 12);
    PlanSearchOptions ex = o, joint = o;
    ex.exhaustive = true;
    o.setting_parts = PlanSearchOptions::SettingParts::kAlways;
    joint.setting_parts = PlanSearchOptions::SettingParts::kNever;
    const PlanSearchResult parts = PlanSearch(cluster, profiles, sim, o).run();
    const PlanSearchResult jointly = PlanSearch(cluster, profiles, sim, joint).run();
    const PlanSearchResult full = PlanSearch(cluster, profiles, sim, ex).run();
    REQUIRE(parts.top.size() == full.top.size());
    REQUIRE(jointly.top.size() == full.top.size());
    for (std::size_t i = 0; i < full.top.size(); ++i)
      for (const PlanSearchResult* r : {&parts, &jointly}) {
        const PlanResult& x = r->top[i].plan;
        const PlanResult& y = full.top[i].plan;
        check_same_plan(x, y);
        CHECK(r->top[i].setup == full.top[i].setup);
      }
    CHECK_FALSE(parts.cut_short);
    CHECK(parts.proven);
    if (full.top.empty()) {
      CHECK(parts.space_empty);
      return;
    }
    CHECK(parts.lower_bound_ms == full.top[0].plan.cost);
    ++with_plans;
    differ_from_plain += full.top[0].setup != 0;
  });
  CHECK(with_plans >= 25);
  CHECK(differ_from_plain >= 1);  // some best plans need a setting other than ZeRO-0 without recomputation
}

TEST_CASE("the search takes the settings in parts where memory binds: no node holds every layer's model states",
          "[plan_search][settings]") {
  const ProfileSet& profiles = small_profiles();
  const std::vector<TrainingSetup> setups = search_setups(sim_options().setup, "auto", "auto");
  // The small model's states: about 0.27 billion parameters at 16 bytes each, over 1 GB a rank at tp 4, far
  // below 80 GB at tp 1.
  std::vector<ClusterfileEntry> tiny = clusterfile();
  for (ClusterfileEntry& e : tiny) e.memory_gb = 1;
  for (const auto& [hosts, gpus, binds] :
       {std::make_tuple(std::vector<std::pair<std::string, int>>{{"10.0.0.1", 4}}, clusterfile(), false),
        std::make_tuple(std::vector<std::pair<std::string, int>>{{"10.0.0.1", 4}}, tiny, true),
        std::make_tuple(std::vector<std::pair<std::string, int>>{{"10.0.0.1", 1}, {"10.0.0.2", 1}}, clusterfile(), false)}) {
    const Cluster cluster = Cluster::from_parts(hosts, gpus, "hosts", "clusterfile");
    const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
    CHECK(settings_bind_memory(cluster, profiles, sim, setups) == binds);
  }
  // The parts: without full recomputation, then with it.
  const std::vector<std::vector<int>> parts = setting_parts(setups);
  REQUIRE(parts.size() == 2);
  CHECK(parts[0].size() == 8);
  CHECK(parts[1].size() == 4);
  for (int k : parts[1]) CHECK(setups[k].recompute == Recompute::kFull);
  CHECK(setting_parts({setups[0], setups[3]}).size() == 1);  // no full recomputation: one part
}

// The search over whole-node stages with the bounds pass at any size (as above 256 GPUs), at gap 0, keeping
// `top_k` plans.
PlanSearchOptions whole_node_bounds_pass(int gbs, int top_k) {
  PlanSearchOptions o;
  o.gbs = gbs;
  o.gap = 0;
  o.top_k = top_k;
  o.stage_boundaries = StageBoundaries::kNode;
  o.bounds_pass_above_gpus = 0;
  return o;
}

// Whole-node stages with the bounds pass (as above 256 GPUs): the tables' tail chains and multi-trip
// chains, the root bounds with them, and the plans built from the tables' argmins (polished) all run.
// At gap 0 the search still returns exhaustive search's best plan; at gap 0.25 its lower bound never
// exceeds the optimum; the plans from the tables alone are plans of the space costed as simulate costs them.
TEST_CASE("whole-node stages with the bounds pass: exact at gap 0, bounds below the optimum, table plans valid",
          "[plan_search][anytime]") {
  const ProfileSet& profiles = small_profiles();
  int with_plans = 0;
  for_each_case(true, profiles, [&](const Case& c, const Cluster& cluster, const PlanSimulator& sim) {
    const PlanSearchOptions o = whole_node_bounds_pass(c.gbs, 1);
    const PlanSearchResult r = PlanSearch(cluster, profiles, sim, o).run();
    const PlanSearchResult full = exhaustive_search(cluster, profiles, sim, o);
    REQUIRE(r.top.size() == full.top.size());
    if (full.top.empty()) return;
    ++with_plans;
    const PlanResult& x = r.top[0].plan;
    const PlanResult& y = full.top[0].plan;
    check_same_plan(x, y);
    CHECK(r.lower_bound_ms == y.cost);
    PlanSearchOptions g = o;
    g.gap = 0.25;
    const PlanSearchResult loose = PlanSearch(cluster, profiles, sim, g).run();
    CHECK(loose.lower_bound_ms <= y.cost * (1 + 1e-12));
    CHECK(loose.best_ms <= y.cost * 1.25 * (1 + 1e-12));
    // Every plan the search keeps (seeds, plans from the tables, the search's own) is a plan of the space at
    // simulate's cost.
    g.top_k = 8;
    for (const SearchedPlan& sp : PlanSearch(cluster, profiles, sim, g).run().top) {
      check_plan_of_the_space(cluster, sim, sp.plan, c.gbs);
      CHECK(sp.plan.cost >= y.cost);
    }
  });
  CHECK(with_plans >= 25);
}

TEST_CASE("whole-node stages with the bounds pass: the top 40 plans at gap 0 are exhaustive search's",
          "[plan_search][anytime]") {
  // With K plans kept, the pruning threshold is the K-th cost: the stages the deeper entries leave out by
  // their own chains (busy time, busy time and tail) sit near plans that are kept, so a chain counted too
  // long there drops one of them.
  const ProfileSet& profiles = small_profiles();
  int compared = 0;
  for_each_case(true, profiles, [&](const Case& c, const Cluster& cluster, const PlanSimulator& sim) {
    const PlanSearchOptions o = whole_node_bounds_pass(c.gbs, 40);
    const PlanSearchResult r = PlanSearch(cluster, profiles, sim, o).run();
    const PlanSearchResult full = exhaustive_search(cluster, profiles, sim, o);
    REQUIRE(r.top.size() == full.top.size());
    for (std::size_t i = 0; i < r.top.size(); ++i) {
      INFO("plan " << i);
      CHECK(r.top[i].plan.cost == full.top[i].plan.cost);
      CHECK(r.top[i].plan.device_groups == full.top[i].plan.device_groups);
      CHECK(r.top[i].plan.layer_partition == full.top[i].plan.layer_partition);
      CHECK(r.top[i].plan.strategies == full.top[i].plan.strategies);
      ++compared;
    }
  });
  CHECK(compared >= 400);
}

TEST_CASE("least_sync_ms couples the settings: ZeRO-2/3's collectives in the passes count with their all-reduce",
          "[plan_search][anytime]") {
  const ProfileSet& profiles = small_profiles();
  // Two A100 nodes of 4: a data-parallel group of 8 crosses the nodes, so every collective costs time.
  const Cluster cluster =
      Cluster::from_parts({{"10.0.0.1", 4}, {"10.0.0.1", 4}}, clusterfile(), "hosts", "clusterfile");
  const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
  const std::vector<TrainingSetup> setups = search_setups(sim.options().setup, "auto", "auto");
  const RankLayout layout(cluster, {0});
  const PlanCostModel model(sim, layout, setups);
  const int n = static_cast<int>(setups.size());
  int checked = 0;
  for (const int tp : {1, 2}) {
    StageChoice c;
    c.begin = 0;
    c.size = 8;
    c.st = Strategy{8 / tp, tp};
    c.layer_begin = 1;
    c.layer_end = 5;
    std::vector<FastStageCost> costs(n);
    REQUIRE(model.stage(c, 1, 3, 2, 16, costs.data()));
    // By hand: a ZeRO-2/3 setting's forward + backward less the ZeRO-0 setting's of its recomputation.
    double coupled = std::numeric_limits<double>::infinity(), apart = coupled;
    for (int k = 0; k < n; ++k) {
      double passes = 0;
      for (int j = 0; j < n; ++j)
        if (setups[j].zero_stage == 0 && setups[j].recompute == setups[k].recompute && setups[k].zero_stage >= 2)
          passes = costs[k].forward_ms + costs[k].backward_ms - costs[j].forward_ms - costs[j].backward_ms;
      if (setups[k].zero_stage >= 2) CHECK(passes > 0);  // the collectives ZeRO-2/3 put in the passes
      CHECK(zero_pass_sync_ms(model, costs.data(), n, k) == Approx(passes).epsilon(1e-12).margin(1e-12));
      coupled = std::min(coupled, costs[k].allreduce_ms + costs[k].optimizer_ms + passes);
      apart = std::min(apart, costs[k].allreduce_ms + costs[k].optimizer_ms);
    }
    CHECK(least_sync_ms(model, costs.data(), n, false) == Approx(coupled).epsilon(1e-12));
    // Without the coupling, ZeRO-3's empty all-reduce would stand for every setting: the coupled bound is
    // above that (it fails if the passes' collectives are left out).
    CHECK(least_sync_ms(model, costs.data(), n, false) > apart * (1 + 1e-6));
    ++checked;
  }
  CHECK(checked == 2);
}

// The tails coupled over the settings (least_sync_ms in the tables, the root bounds and the depth-first
// search) with every setting searched: at gap 0 the search with whole-node stages and the bounds pass still
// returns exhaustive search's plans, jointly and in setting parts.
TEST_CASE("whole-node stages with --zero auto --recompute auto: exact at gap 0 with the coupled tails",
          "[plan_search][anytime][settings]") {
  const ProfileSet& profiles = small_profiles();
  int with_plans = 0, zero_plans = 0;
  for_each_case(true, profiles, [&](const Case& c, const Cluster& cluster, const PlanSimulator& sim) {
    PlanSearchOptions o;
    o.gbs = c.gbs;
    o.gap = 0;
    o.top_k = 2;
    o.stage_boundaries = StageBoundaries::kNode;
    o.bounds_pass_above_gpus = 0;
    o.setups = search_setups(sim.options().setup, "auto", "auto");
    PlanSearchOptions ex = o, parts = o;
    ex.exhaustive = true;
    o.setting_parts = PlanSearchOptions::SettingParts::kNever;
    parts.setting_parts = PlanSearchOptions::SettingParts::kAlways;
    const PlanSearchResult full = PlanSearch(cluster, profiles, sim, ex).run();
    for (const PlanSearchOptions* opt : {&o, &parts}) {
      const PlanSearchResult r = PlanSearch(cluster, profiles, sim, *opt).run();
      REQUIRE(r.top.size() == full.top.size());
      for (std::size_t i = 0; i < full.top.size(); ++i) {
        const PlanResult& x = r.top[i].plan;
        const PlanResult& y = full.top[i].plan;
        CHECK(x.cost == y.cost);
        CHECK(x.device_groups == y.device_groups);
        CHECK(x.strategies == y.strategies);
        CHECK(x.layer_partition == y.layer_partition);
        CHECK(x.batches == y.batches);
        CHECK(r.top[i].setup == full.top[i].setup);
      }
      if (!full.top.empty()) CHECK(r.lower_bound_ms == full.top[0].plan.cost);
    }
    if (full.top.empty()) return;
    ++with_plans;
    zero_plans += o.setups[full.top[0].setup].zero_stage >= 1;
  });
  CHECK(with_plans >= 25);
  CHECK(zero_plans >= 1);  // some best plans use ZeRO, whose collectives the coupled tails count
}

TEST_CASE("stage estimates count the pass's time outside the layers: a stage of even shares is estimated at its cost",
          "[plan_search][estimates]") {
  using namespace stage_estimates;
  const ProfileSet& profiles = small_profiles();
  const int L = profiles.num_layers(), max_tp = 4;
  const Cluster cluster = Cluster::from_parts({{"10.0.0.1", 4}, {"10.0.0.2", 4}}, clusterfile(), "hosts", "clusterfile");
  const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
  const int types = static_cast<int>(cluster.device_types().size());
  const RankLayout layout(cluster, {0, 1});
  const PlanCostModel plain(sim, layout, {sim.options().setup});
  const std::vector<double> unmeasured(static_cast<std::size_t>(types) * (max_tp + 1) * (L + 1) * (L + 1), 0.0);
  int exact = 0, with_outside = 0;
  for (int b : {1, 2, 4}) {
    const ShareSlices slices(profiles, cluster, max_tp, b, sim.options().max_profiled_bs);
    EstimateBudget budget(std::size_t{64} << 20);
    MixedLists lists(budget);
    const StageEstimator est(profiles, cluster, layout, plain, slices, lists, b, max_tp, true, 2.0 / 3, unmeasured, L);
    for (int r : {0, 4})
      for (int s = 1; r + s <= r + 4; ++s)
        for (int tp = 1; tp <= s; ++tp) {
          const int dp = s / tp;
          if (s % tp != 0 || b % dp != 0) continue;  // even shares: every replica the one estimated
          const Slices& sl = slices.at(layout.type_of(r), tp, b / dp);
          if (sl.files.size() != 1) continue;  // the share's own file: its time is the stage's profile time
          for (int l = 0; l < L; ++l)
            for (int e = l + 1; e <= L; ++e) {
              INFO("ranks " << r << "+" << s << " tp " << tp << " b " << b << " layers " << l << "-" << e);
              const StageEstimate x = est.estimate(r, s, tp, l, e, true, true);
              StageChoice c;
              c.begin = r;
              c.size = s;
              c.st = Strategy{dp, tp};
              c.layer_begin = l;
              c.layer_end = e;
              FastStageCost fc;
              REQUIRE(plain.stage(c, 1, 3, 4, b, &fc));  // a middle stage: no batch generator
              CHECK(x.t <= (fc.forward_ms + fc.backward_ms) * (1 + 1e-12));
              CHECK(x.t == Approx(fc.forward_ms + fc.backward_ms).epsilon(1e-9));
              CHECK(x.f + x.b <= x.t * (1 + 1e-12));
              with_outside += sl.fb_sync > 0;
              ++exact;
            }
        }
  }
  CHECK(exact > 50);
  CHECK(with_outside > 50);  // the profiles measure time outside the layers: the check above needs it
}

// Under context parallelism (cp 2) the estimates price a stage as PlanCostModel::stage does: the micro-batch
// split over the dp / cp groups, each rank the profile of its group's share / cp whole sequences (1/cp of
// the share's profile where cp does not divide it), the sends per cp chunk. A
// homogeneous stage of even group shares is estimated at its cost less the ring's exchange and merge (which
// the estimate leaves out); its sends are exact; mixed-type stages (the replica lists and, past
// mixed_table_limit, the whole-sample capacity bound) stay below their cost; a dp that cp does not divide
// has no estimate (the simulator refuses it).
TEST_CASE("stage estimates under context parallelism: 1/cp of the group's share, exact for even shares",
          "[plan_search][estimates][cp]") {
  using namespace stage_estimates;
  const ProfileSet& profiles = small_profiles();
  const int L = profiles.num_layers(), max_tp = 4;
  const Cluster cluster = Cluster::from_parts({{"10.0.0.1", 4}, {"10.0.0.2", 4}}, clusterfile(), "hosts", "clusterfile");
  TrainingSetup cp2 = sim_options().setup;
  cp2.context_parallel = 2;
  const PlanSimulator sim(cluster, profiles, test::six_layer_shape(), 1024, sim_options());
  const int types = static_cast<int>(cluster.device_types().size());
  const RankLayout layout(cluster, {0, 1});
  const PlanCostModel model(sim, layout, {cp2});
  const std::vector<double> unmeasured(static_cast<std::size_t>(types) * (max_tp + 1) * (L + 1) * (L + 1), 0.0);
  int exact = 0, mixed = 0, whole = 0;
  for (int b : {1, 2, 4}) {
    const ShareSlices slices(profiles, cluster, max_tp, b, sim.options().max_profiled_bs, 2);
    EstimateBudget budget(std::size_t{64} << 20);
    MixedLists lists(budget);
    const StageEstimator est(profiles, cluster, layout, model, slices, lists, b, max_tp, true, 2.0 / 3, unmeasured, L);
    // Slices of another cp: refused.
    const ShareSlices plain_slices(profiles, cluster, max_tp, b, sim.options().max_profiled_bs);
    CHECK_THROWS_AS(StageEstimator(profiles, cluster, layout, model, plain_slices, lists, b, max_tp, true, 2.0 / 3,
                                   unmeasured, L),
                    std::invalid_argument);
    const StageEstimator capacity(profiles, cluster, layout, model, slices, lists, b, max_tp, true, 2.0 / 3, unmeasured,
                                  L, 0);
    CHECK(est.cp() == 2);
    for (int r = 0; r < 8; ++r)
      for (int s = 1; r + s <= 8; ++s)
        for (int tp = 1; tp <= std::min(s, max_tp); ++tp) {
          const int dp = s / tp;
          if (s % tp != 0 || dp / 2 > b) continue;
          const bool homo = layout.homogeneous(r, r + s);
          if (dp % 2 != 0) {  // no cp groups
            CHECK(std::isinf(est.estimate(r, s, tp, 0, L, homo, true).t));
            continue;
          }
          StageChoice c;
          c.begin = r;
          c.size = s;
          c.st = Strategy{dp, tp};
          for (int l = 0; l < L; ++l)
            for (int e = l + 1; e <= L; ++e) {
              INFO("ranks " << r << "+" << s << " tp " << tp << " b " << b << " layers " << l << "-" << e);
              c.layer_begin = l;
              c.layer_end = e;
              FastStageCost fc;
              StageDetail d;
              std::string why;
              if (!model.explain_stage(c, 1, 3, 4, b, 0, &fc, &d, &why)) continue;  // a middle stage
              const double cost = fc.forward_ms + fc.backward_ms;
              const StageEstimate x = est.estimate(r, s, tp, l, e, homo, true);
              CHECK(x.t <= cost * (1 + 1e-12));
              CHECK(x.f + x.b <= x.t * (1 + 1e-12));
              CHECK(capacity.estimate(r, s, tp, l, e, homo, true).t <= cost * (1 + 1e-12));
              double sf = 0, sb = 0;
              est.sends(r, s, tp, homo, &sf, &sb);
              if (!homo) {
                ++mixed;
                continue;
              }
              // The bare sends; at tp > 1 the cost model adds the receiver's scatter/gather all-gather
              // (PlanCostModel::scatter_gather_ms), which the estimate leaves out.
              CHECK(sf <= fc.send_forward_ms);
              CHECK(sb <= fc.send_backward_ms);
              if (tp == 1) {
                CHECK(sf == fc.send_forward_ms);
                CHECK(sb == fc.send_backward_ms);
              }
              const Slices& sl = slices.at(layout.type_of(r), tp, b / (dp / 2));
              if (b % (dp / 2) != 0 || sl.files.size() != 1) continue;  // even shares, the ranks' own file
              whole += sl.divisor == 1;
              const double ring = d.cp_exchange_forward_ms + d.cp_exchange_backward_ms + d.cp_merge_forward_ms +
                                  d.cp_merge_backward_ms;
              CHECK(x.t == Approx(cost - ring).epsilon(1e-9));
              ++exact;
            }
        }
  }
  CHECK(exact > 30);
  CHECK(whole > 10);  // shares cp divides: the ranks run share / cp whole sequences
  CHECK(exact > whole);
  CHECK(mixed > 30);
}

// The mixed-type stages' whole-sample walk (stage_estimates::whole_sample_walk) recomputes a run's samples
// only near a tie; this is the walk that divides every run at every step, which it must equal bit for bit.
static double walk_dividing_every_step(double t, const double* w, const int* n, int runs, int b) {
  for (int step = 0; step < 64; ++step) {
    long long done = 0;
    double next = std::numeric_limits<double>::infinity();
    for (int i = 0; i < runs; ++i) {
      const double k = std::floor(t / w[i] * (1 + 1e-12));
      done += static_cast<long long>(k) * n[i];
      next = std::min(next, (k + 1) * w[i]);
    }
    if (done >= b) break;
    t = next;
  }
  return t;
}

TEST_CASE("whole-sample walk equals the walk that divides every run at every step", "[estimates]") {
  using hetplan::stage_estimates::kMaxWalkRuns;
  using hetplan::stage_estimates::whole_sample_walk;
  std::mt19937_64 rng(33);
  std::uniform_real_distribution<double> time(0.05, 40.0);
  std::uniform_int_distribution<int> replicas(1, 64), samples(1, 2048), run_count(1, kMaxWalkRuns);
  std::uniform_int_distribution<int> tie(0, 3), ratio(1, 6);
  int walked = 0, capped = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    const int runs = run_count(rng), b = samples(rng);
    double w[kMaxWalkRuns];
    int n[kMaxWalkRuns];
    double capacity = 0;
    for (int i = 0; i < runs; ++i) {
      // A quarter of the runs tie with run 0 (a rational multiple of its time: equal breakpoints).
      w[i] = i > 0 && tie(rng) == 0 ? w[0] * ratio(rng) / ratio(rng) : time(rng);
      n[i] = replicas(rng);
      capacity += n[i] / w[i];
    }
    const double t0 = b / capacity;
    const double expected = walk_dividing_every_step(t0, w, n, runs, b);
    const double got = whole_sample_walk(t0, w, n, runs, b);
    if (got != expected) FAIL("trial " << trial << ": " << got << " != " << expected);
    walked += expected > t0;
    capped += walk_dividing_every_step(expected, w, n, runs, b) != expected;  // 64 steps did not finish
  }
  // The trials exercise the walk (most leave the fractional bound) and its 64-step cap.
  CHECK(walked > 100000);
  CHECK(capped > 0);
}

// The coupled entries' set (add_coupled): after every candidate, each candidate so far is covered (some kept
// tuple is at most it in all four values), at most kPairs are kept, and two incomparable tuples are both
// kept as they are. Merging by anything but the componentwise least (or dropping a tuple not dominated)
// fails the cover.
TEST_CASE("coupled entries: add_coupled keeps every candidate covered with at most kPairs tuples", "[plan_search]") {
  using C = SuffixBound::Coupled;
  C set[SuffixBound::kPairs];
  unsigned char n = 0;
  add_coupled(set, &n, {10, 1, 1, 12});
  add_coupled(set, &n, {5, 4, 2, 9});
  REQUIRE(n == 2);
  CHECK((set[0].h == 10 && set[0].g == 1 && set[1].h == 5 && set[1].g == 4));
  add_coupled(set, &n, {11, 2, 1, 12});  // at least {10, 1, 1, 12}: dropped
  CHECK(n == 2);
  add_coupled(set, &n, {4, 1, 1, 9});  // at most both: the only one left
  REQUIRE(n == 1);
  CHECK((set[0].h == 4 && set[0].g == 1 && set[0].g0 == 1 && set[0].t == 9));
  std::mt19937 rng(33);
  std::uniform_real_distribution<double> u(1.0, 100.0);
  n = 0;
  std::vector<C> seen;
  bool filled = false;
  for (int i = 0; i < 400; ++i) {
    const double h = u(rng);
    const C c{h, 200 - h + u(rng) * 0.1, u(rng), h + u(rng)};  // h and g traded off, as the paths and trips
    add_coupled(set, &n, c);
    seen.push_back(c);
    REQUIRE(n >= 1);
    REQUIRE(n <= SuffixBound::kPairs);
    filled = filled || n == SuffixBound::kPairs;
    for (const C& s : seen) {
      bool covered = false;
      for (int k = 0; k < n; ++k)
        covered = covered || (set[k].h <= s.h && set[k].g <= s.g && set[k].g0 <= s.g0 && set[k].t <= s.t);
      REQUIRE(covered);
    }
  }
  CHECK(filled);
}


// The depth-first search's multi-trip chain at any stage x (stage_trip_chain_ms, planner/plan_search.md):
// with the stages before x exact (micro-batch 0's forward chain to x, micro-batch m - 1's backward chain
// back) and the trips through the stages after x at their exact round trips, every chain, for every trip
// count h, is at most the timeline's iteration (simulate_timeline), on uneven random stages with random
// all-reduces and steps; somewhere a chain at a stage other than stage 0 is the timeline's longest path,
// so a count, a term or its back chain scaled up fails the first check. The offset the search keeps for
// the chain (trip_chain_offset) read at every later frontier (trip_chain_at) gives the same chain.
TEST_CASE("the search's multi-trip chains at every stage are paths of the timeline", "[plan_search][bounds]") {
  std::mt19937 rng(20261126);
  std::uniform_real_distribution<double> u(0.1, 10.0);
  int middle_tight = 0, checked = 0;
  for (int p = 2; p <= 7; ++p)
    for (int m = 1; m <= 12; ++m)
      for (int trial = 0; trial < 6; ++trial) {
        TimelineInput in;
        in.microbatches = m;
        in.schedule = Schedule::k1F1B;
        std::vector<FastStageCost> fc(p);
        for (int j = 0; j < p; ++j) {
          FastStageCost& c = fc[j];
          c.forward_ms = u(rng);
          c.backward_ms = 2 * u(rng);
          c.accumulation_ms = u(rng) / 4;
          c.send_forward_ms = j + 1 < p ? u(rng) / 8 : 0;
          c.send_backward_ms = j > 0 ? u(rng) / 8 : 0;
          c.allreduce_ms = trial % 2 ? u(rng) * 3 : u(rng) / 10;
          c.optimizer_ms = u(rng) / 5;
          in.stages.push_back(timeline_stage_times(c));
        }
        const double iteration = simulate_timeline(in).iteration_ms;
        const double acc = m > 1 ? 1.0 : 0.0;
        for (int x = 0; x + 1 < p; ++x) {
          // What the search holds when it has chosen stage x: the stages before it exact.
          double arrival = 0, passes = 0;
          for (int j = 0; j < x; ++j) {
            arrival += fc[j].forward_ms + fc[j].send_forward_ms;
            passes += fc[j].forward_ms + fc[j].send_forward_ms + fc[j].backward_ms + fc[j].send_backward_ms +
                      acc * fc[j].accumulation_ms;
          }
          // The round trips through the stages after x (here exact; the search's table bounds them).
          double first_trip = 0, later_trip = 0;
          for (int j = x + 1; j < p; ++j) {
            const double pass = fc[j].forward_ms + fc[j].backward_ms + fc[j].send_backward_ms +
                                (j + 1 < p ? fc[j].send_forward_ms : 0.0);
            first_trip += pass;
            later_trip += pass + fc[j].accumulation_ms;
          }
          const double tail0 = fc[0].allreduce_ms + fc[0].optimizer_ms;
          for (int h = 1; h <= most_trips(Schedule::k1F1B, p - 1 - x, m); ++h) {
            const MultiTripCounts counts = multi_trip_counts(Schedule::k1F1B, p - 1 - x, m, h);
            REQUIRE(counts.trips >= 1);
            const double chain = stage_trip_chain_ms(counts, fc[x], arrival, first_trip, later_trip, passes - arrival, tail0);
            INFO("p " << p << " m " << m << " trial " << trial << " stage " << x << " h " << h);
            CHECK(chain <= iteration * (1 + 1e-12));
            ++checked;
            middle_tight += x > 0 && chain >= iteration * (1 - 1e-9);
            // The same chain kept as an offset when x is chosen and read at every later frontier f (the
            // stages from x + 1 to f exact, the trips through those after f exact too here): the same value.
            const double own = stage_trip_chain_ms(counts, fc[x], arrival, 0, 0, passes - arrival, tail0);
            double fp = 0, pp = 0;  // micro-batch 0's passes, and with accumulation, through stage f
            for (int j = 0; j <= x; ++j) {
              const double pass = fc[j].forward_ms + fc[j].send_forward_ms + fc[j].backward_ms + fc[j].send_backward_ms;
              fp += pass;
              pp += pass + acc * fc[j].accumulation_ms;
            }
            const double offset = trip_chain_offset(own, counts.trips, fp, pp);
            for (int front = x; front < p; ++front) {
              if (front > x) {
                const double pass = fc[front].forward_ms + fc[front].send_forward_ms + fc[front].backward_ms +
                                    fc[front].send_backward_ms;
                fp += pass;
                pp += pass + acc * fc[front].accumulation_ms;
              }
              double g0 = 0, g = 0;  // the trips through the stages after the frontier
              for (int j = front + 1; j < p; ++j) {
                const double pass = fc[j].forward_ms + fc[j].backward_ms + fc[j].send_backward_ms +
                                    (j + 1 < p ? fc[j].send_forward_ms : 0.0);
                g0 += pass;
                g += pass + fc[j].accumulation_ms;
              }
              const double at = trip_chain_at(offset, counts.trips, fp, pp, g0, g);
              CHECK(at == Approx(chain).epsilon(1e-12));
              CHECK(at <= iteration * (1 + 1e-12));
            }
          }
        }
        // No stage after the last: no chain claimed.
        CHECK(stage_trip_chain_ms(multi_trip_counts(Schedule::k1F1B, 0, m), fc[p - 1], 1e9, 0, 0, 0, 0) == 0);
      }
  CHECK(checked > 1000);
  CHECK(middle_tight > 10);
}

}  // namespace hetplan
