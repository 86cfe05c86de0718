// PlanSimulator's per-stage costs, from the fields `hetplan profile` adds to
// Metis's format (layer_forward_ms, layer_grad_accumulation_ms,
// communication.allreduce_busbw_gbs, each file's optimizer_time_ms), and the
// fallbacks it takes for files without them (Metis's own).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "sim/gpu_specs.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/model_shape.h"
#include "sim/plan_simulator.h"
#include "tests/fixtures.h"

namespace fs = std::filesystem;
using namespace hetplan;

namespace {

constexpr double kBusbwGbs = 100.0;

// The 10-layer analytic set, every file given forward = 1/4 of each layer's
// time, accumulation 0.1 x (layer + 1) ms and, for tp > 1, a measured
// all-reduce bus bandwidth of 100 GB/s.
std::string extended_profiles() {
  const auto dir = test::scratch_dir("stage-costs") / "p";
  if (fs::exists(dir)) return dir.string();
  fs::copy(test::analytic_dir(10), dir, fs::copy_options::recursive);
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("DeviceType.", 0) != 0) continue;
    ordered_json j = read_json_file(f.path().string());
    ordered_json fwd = ordered_json::array(), acc = ordered_json::array();
    const auto& layers = j["execution_time"]["layer_compute_total_ms"];
    for (std::size_t l = 0; l < layers.size(); ++l) {
      fwd.push_back(layers[l].get<double>() / 4);
      acc.push_back(0.1 * static_cast<double>(l + 1));
    }
    j["execution_time"]["layer_forward_ms"] = fwd;
    j["execution_time"]["layer_grad_accumulation_ms"] = acc;
    if (name.find("_tp1_") == std::string::npos) j["communication"] = {{"allreduce_busbw_gbs", kBusbwGbs}};
    write_json_file(f.path().string(), j);
  }
  return dir.string();
}

// extended_profiles() with `startup_ms` added to the first block's (layer 1's) forward and total in
// every file, as `hetplan profile`'s chained pass records its start-up latency; the whole pass
// (forward_backward_time_ms) does not have it.
std::string startup_profiles(double startup_ms) {
  const auto dir = test::scratch_dir("stage-costs-startup") / "p";
  fs::remove_all(dir);
  fs::copy(extended_profiles(), dir, fs::copy_options::recursive);
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().filename().string().rfind("DeviceType.", 0) != 0) continue;
    ordered_json j = read_json_file(f.path().string());
    auto& t = j["execution_time"];
    t["layer_forward_ms"][1] = t["layer_forward_ms"][1].get<double>() + startup_ms;
    t["layer_compute_total_ms"][1] = t["layer_compute_total_ms"][1].get<double>() + startup_ms;
    write_json_file(f.path().string(), j);
  }
  return dir.string();
}

// One node of four A100s; stage 0 = layers [0, 5) at (dp 2, tp 1), stage 1 =
// layers [5, 10) at (dp 1, tp 2); 8 micro-batches of a global batch of 32,
// so stage 0 runs bs 2 per replica and stage 1 bs 4.
struct TwoStagePlan {
  Cluster cluster = Cluster::from_parts({{"0.0.0.4", 4}}, parse_clusterfile(test::project_clusterfile()), "hostfile",
                                        test::project_clusterfile());
  std::vector<int> groups{2, 2};
  std::vector<Strategy> strategies{{2, 1}, {1, 2}};
  std::vector<int> partition{0, 5, 10};
  int batches = 8, gbs = 32;
  bool tied = true;  // the embedding and the LM head share their weights

  PlanSimulation run(const ProfileSet& profiles, SimulationOptions so = {}) const {
    const SearchOptions o = test::table1_search_options(10);
    ModelShape shape = shape_from_model_config(o.model);
    shape.tied_embeddings = tied;
    const PlanSimulator sim(cluster, profiles, shape, o.model.sequence_length, so);
    const RankLayout layout(cluster, {0});
    PlanSimulation out;
    std::string why;
    REQUIRE(sim.run(layout, groups, strategies.data(), partition.data(), batches, gbs, &out, &why));
    return out;
  }
};

double slice(const std::vector<double>& v, int s, int e) {
  double sum = 0;
  for (int i = s; i < e; ++i) sum += v[i];
  return sum;
}

// The profiled bytes of the tied embedding's word table (layer 0's bytes less the learned positions'), which
// the stage holding the head but not the embedding keeps a copy of.
double tied_table_copy_bytes(const ProfileSet& profiles) {
  const ModelShape shape = shape_from_model_config(test::table1_search_options(10).model);
  const double table = static_cast<double>(shape.vocab_size) * shape.hidden_size;
  return profiles.model().parameters_per_layer_bytes[0] * table / static_cast<double>(shape.embedding_params());
}

}  // namespace

TEST_CASE("profile extensions: forward split, accumulation, optimizer share", "[sim][profiles]") {
  const ProfileSet profiles = ProfileSet::load(extended_profiles(), 10);
  const int a100 = profiles.type_index("A100");
  const LayerProfile* s0 = profiles.find(a100, 1, 2);
  const LayerProfile* s1 = profiles.find(a100, 2, 4);
  REQUIRE(s0);
  REQUIRE(s1);
  REQUIRE(s0->has_forward());
  REQUIRE(s1->has_grad_accumulation());
  CHECK(profiles.allreduce_busbw_gbs(a100) == kBusbwGbs);

  const PlanSimulation sim = TwoStagePlan().run(profiles);
  REQUIRE(sim.stages.size() == 2);
  const double bg = profiles.model().batch_generator_ms;
  const double s0_layers = slice(s0->layer_ms, 0, 5), s1_layers = slice(s1->layer_ms, 5, 10);
  const auto& bytes = profiles.model().parameters_per_layer_bytes;
  const double total = slice(bytes, 0, 10);
  // The tied model's last stage holds a copy of the embedding's word table (tied_table_copy_bytes).
  const double copy = tied_table_copy_bytes(profiles);
  const double share0 = slice(bytes, 0, 5) / total, share1 = (slice(bytes, 5, 10) + copy) / total;
  // Each stage adds its parameter share of its file's fb_sync, stage 0 also the batch generator
  // (split 1/3 : 2/3).
  REQUIRE(s0->fb_sync_ms > 0);
  REQUIRE(s1->fb_sync_ms > 0);
  const double out0 = s0->fb_sync_ms * share0 + bg, out1 = s1->fb_sync_ms * share1;
  CHECK(sim.stages[0].forward_ms == Approx(s0_layers / 4 + out0 / 3).epsilon(1e-12));
  CHECK(sim.stages[0].backward_ms == Approx(s0_layers * 3 / 4 + out0 * 2 / 3).epsilon(1e-12));
  CHECK(sim.stages[1].forward_ms == Approx(s1_layers / 4 + out1 / 3).epsilon(1e-12));
  // Accumulation: 0.1 + ... + 0.5 and 0.6 + ... + 1.0, whatever the micro-batch.
  CHECK(sim.stages[0].accumulation_ms == Approx(1.5).epsilon(1e-12));
  CHECK(sim.stages[1].accumulation_ms == Approx(4.0).epsilon(1e-12));
  // Optimizer: each file's own step (once, not Metis's twice) times the stage's share of the parameter bytes.
  CHECK(sim.stages[0].optimizer_ms == Approx(s0->optimizer_ms * slice(bytes, 0, 5) / total).epsilon(1e-12));
  CHECK(sim.stages[1].optimizer_ms == Approx(s1->optimizer_ms * share1).epsilon(1e-12));
}

TEST_CASE("files without the extensions: 2/3 backward, datasheet HBM accumulation, Metis's optimizer", "[sim][profiles]") {
  const ProfileSet& profiles = test::analytic_profiles(10);
  const int a100 = profiles.type_index("A100");
  const LayerProfile* s0 = profiles.find(a100, 1, 2);
  REQUIRE(!s0->has_forward());
  const PlanSimulation sim = TwoStagePlan().run(profiles);
  const double bg = profiles.model().batch_generator_ms;
  const auto& bytes = profiles.model().parameters_per_layer_bytes;
  const double share0 = slice(bytes, 0, 5) / slice(bytes, 0, 10);
  CHECK(sim.stages[0].forward_ms ==
        Approx((slice(s0->layer_ms, 0, 5) + std::max(0.0, s0->fb_sync_ms) * share0 + bg) / 3).epsilon(1e-12));
  // Three passes (read old, read new, write sum) over the rank's bf16 gradients at 2039 GB/s.
  const SearchOptions o = test::table1_search_options(10);
  const ModelShape shape = shape_from_model_config(o.model);
  const GpuSpec* spec = find_gpu_spec("A100");
  REQUIRE(spec);
  const double grads0 = shard_params(shape, 0, 5, 2, TrainingSetup{}).on_rank(1) * 2;
  const double grads1 = shard_params(shape, 5, 10, 2, TrainingSetup{}).on_rank(2) * 2;
  CHECK(sim.stages[0].accumulation_ms == Approx(3 * grads0 / (spec->memory_bw_gbs * 1e9) * 1e3).epsilon(1e-12));
  CHECK(sim.stages[1].accumulation_ms == Approx(3 * grads1 / (spec->memory_bw_gbs * 1e9) * 1e3).epsilon(1e-12));
  CHECK(profiles.allreduce_busbw_gbs(a100) == -1);
}

TEST_CASE("measured all-reduce bandwidth replaces the clusterfile's inside a node", "[sim][network]") {
  const ProfileSet profiles = ProfileSet::load(extended_profiles(), 10);
  TwoStagePlan plan;
  plan.tied = false;  // only the data-parallel all-reduce (the tied ends' is the next test's)
  SimulationOptions clusterfile;
  clusterfile.measured_collectives = false;
  const PlanSimulation m = plan.run(profiles), c = plan.run(profiles, clusterfile);
  // Stage 0's all-reduce over 2 ranks: 2 latencies + bytes / bandwidth; only the bandwidth changes.
  const double lat = 2 * NetworkOptions{}.intra_latency_s * 1e3;
  const double intra = plan.cluster.clusterfile()[3].intra_bandwidth * 1e9;
  REQUIRE(plan.cluster.clusterfile()[3].instance_type == "A100");
  CHECK((m.stages[0].allreduce_ms - lat) == Approx((c.stages[0].allreduce_ms - lat) * intra / (kBusbwGbs * 1e9)));
  CHECK(m.stages[1].allreduce_ms == 0);  // dp 1
  // p2p keeps the clusterfile's link.
  CHECK(m.stages[0].send_forward_ms == c.stages[0].send_forward_ms);
}

namespace {

// extended_profiles() with its tp > 1 files' all-reduce recorded as `hetplan
// profile` writes it: 1e9 bytes in `calls` calls over 2 ranks in `ms`, so a
// gross bus bandwidth of 2 (n - 1) / n x 1e9 / ms = 1e9 / ms bytes per ms.
std::string profiles_with_calls(const std::string& name, double ms, int calls) {
  const auto dir = test::scratch_dir(name) / "p";
  fs::remove_all(dir);
  fs::copy(extended_profiles(), dir, fs::copy_options::recursive);
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string file = f.path().filename().string();
    if (file.rfind("DeviceType.", 0) != 0 || file.find("_tp1_") != std::string::npos) continue;
    ordered_json j = read_json_file(f.path().string());
    j["communication"] = {{"gradient_allreduce_ms", ms},   {"gradient_bytes", 1e9}, {"all_reduce_calls", calls},
                          {"ranks", 2},                    {"allreduce_busbw_gbs", 1e9 / (ms * 1e-3) / 1e9}};
    write_json_file(f.path().string(), j);
  }
  return dir.string();
}

}  // namespace

TEST_CASE("the measured all-reduce bandwidth is taken net of the measured calls' latency", "[sim][network][profiles]") {
  // 100 calls over 2 ranks at the network's 11 us per hop: 100 x 2 x 11 us = 2.2 ms of the 10.2 ms
  // measured are latency, which the network charges again per collective; net 1e9 bytes / 8 ms = 125 GB/s
  // (gross: 1e9 / 10.2 ms = 98.04 GB/s).
  const double hop = NetworkOptions{}.intra_latency_s;
  REQUIRE(hop == 11e-6);
  const ProfileSet profiles = ProfileSet::load(profiles_with_calls("stage-costs-calls", 10.2, 100), 10);
  const int a100 = profiles.type_index("A100");
  const LayerProfile* f = profiles.find(a100, 2, 4);
  REQUIRE(f);
  CHECK(f->has_allreduce_calls());
  CHECK(f->all_reduce_calls == 100);
  CHECK(f->allreduce_ranks == 2);
  CHECK(profiles.allreduce_busbw_gbs(a100) == Approx(1e9 / 10.2e-3 / 1e9).epsilon(1e-12));
  CHECK(profiles.allreduce_busbw_gbs(a100, hop) == Approx(125.0).epsilon(1e-12));

  // The simulator's dp all-reduce of stage 0 (2 ranks, one collective): 2 hops of latency + bytes at 125 GB/s.
  TwoStagePlan plan;
  plan.tied = false;
  SimulationOptions clusterfile;
  clusterfile.measured_collectives = false;
  const PlanSimulation m = plan.run(profiles), c = plan.run(profiles, clusterfile);
  const double lat = 2 * hop * 1e3;
  const double intra = plan.cluster.clusterfile()[3].intra_bandwidth * 1e9;
  CHECK((m.stages[0].allreduce_ms - lat) == Approx((c.stages[0].allreduce_ms - lat) * intra / 125e9));

  // Files without the calls (older profiles) keep the gross figure.
  const ProfileSet old = ProfileSet::load(extended_profiles(), 10);
  CHECK(!old.find(a100, 2, 4)->has_allreduce_calls());
  CHECK(old.allreduce_busbw_gbs(a100, hop) == kBusbwGbs);
}

TEST_CASE("calls whose latency alone reaches the measured time keep the gross bandwidth", "[sim][network][profiles]") {
  // 1000 calls x 22 us = 22 ms > 10.2 ms: no bandwidth makes the network's model give the measured time.
  const ProfileSet profiles = ProfileSet::load(profiles_with_calls("stage-costs-calls-slow", 10.2, 1000), 10);
  const int a100 = profiles.type_index("A100");
  CHECK(profiles.allreduce_busbw_gbs(a100, NetworkOptions{}.intra_latency_s) ==
        Approx(1e9 / 10.2e-3 / 1e9).epsilon(1e-12));
}

TEST_CASE("a profile with some of the all-reduce measurement's keys is refused, naming the missing one",
          "[sim][profiles][errors]") {
  const std::string dir = profiles_with_calls("stage-costs-calls-partial", 10.2, 100);
  const std::string f = (fs::path(dir) / "DeviceType.A100_tp2_bs4.json").string();
  ordered_json j = read_json_file(f);
  j["communication"].erase("all_reduce_calls");
  write_json_file(f, j);
  try {
    ProfileSet::load(dir, 10);
    FAIL("expected InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("DeviceType.A100_tp2_bs4.json") != std::string::npos);
    CHECK(std::string(e.what()).find("but not 'all_reduce_calls'") != std::string::npos);
  }
}

TEST_CASE("tied embeddings over a pipeline: both ends all-reduce the embedding gradient", "[sim][network]") {
  const ProfileSet profiles = ProfileSet::load(extended_profiles(), 10);
  TwoStagePlan untied;
  untied.tied = false;
  const PlanSimulation t = TwoStagePlan().run(profiles), u = untied.run(profiles);
  // Stage 0 (tp 1) and stage 1 (tp 2) share one node: a 2-rank all-reduce of the embedding's
  // gradient (vocab x hidden / tp, 2 bytes each without fp32 main gradients) at the measured bus
  // bandwidth, 2 hops of latency, added after each end's backward.
  const SearchOptions o = test::table1_search_options(10);
  const double vh = static_cast<double>(o.model.vocab_size) * o.model.hidden_size;
  const double lat = 2 * NetworkOptions{}.intra_latency_s * 1e3;
  CHECK(u.stages[1].allreduce_ms == 0);
  CHECK(t.stages[0].allreduce_ms - u.stages[0].allreduce_ms == Approx(lat + vh * 2 / (kBusbwGbs * 1e9) * 1e3));
  CHECK(t.stages[1].allreduce_ms == Approx(lat + vh / 2 * 2 / (kBusbwGbs * 1e9) * 1e3));
  CHECK(t.timeline.iteration_ms > u.timeline.iteration_ms);
}

TEST_CASE("tied embeddings over a pipeline: the head's stage accumulates and steps its copy of the table",
          "[sim][profiles]") {
  // Megatron's (and replay's) last stage keeps its own copy of a tied word table for the LM head: every
  // micro-batch adds its gradient into the fp32 main gradients, and the optimizer steps it, as the first
  // stage does its own. The profiles count the table once (layer 0), so the last stage's share of the
  // whole pass's outside time (fb_sync) and of the optimizer step grows by the copy's bytes; the first
  // stage's stays.
  const ProfileSet profiles = ProfileSet::load(extended_profiles(), 10);
  TwoStagePlan untied;
  untied.tied = false;
  const PlanSimulation t = TwoStagePlan().run(profiles), u = untied.run(profiles);
  const int a100 = profiles.type_index("A100");
  const LayerProfile* s1 = profiles.find(a100, 2, 4);  // stage 1: tp 2, the whole micro-batch of 4
  REQUIRE(s1);
  REQUIRE(s1->fb_sync_ms > 0);
  const auto& bytes = profiles.model().parameters_per_layer_bytes;
  const double copy_share = tied_table_copy_bytes(profiles) / slice(bytes, 0, 10);
  REQUIRE(copy_share > 0.05);  // the table is a large part of the analytic model
  CHECK(t.stages[1].forward_ms - u.stages[1].forward_ms == Approx(s1->fb_sync_ms * copy_share / 3).epsilon(1e-9));
  CHECK(t.stages[1].backward_ms - u.stages[1].backward_ms ==
        Approx(s1->fb_sync_ms * copy_share * 2 / 3).epsilon(1e-9));
  CHECK(t.stages[1].optimizer_ms - u.stages[1].optimizer_ms == Approx(s1->optimizer_ms * copy_share).epsilon(1e-9));
  CHECK(t.stages[0].forward_ms == u.stages[0].forward_ms);
  CHECK(t.stages[0].backward_ms == u.stages[0].backward_ms);
  CHECK(t.stages[0].optimizer_ms == u.stages[0].optimizer_ms);
}

TEST_CASE("the first block's profiled start-up latency is the whole pass's, not the first stage's", "[sim][profiles]") {
  // The chained layer-by-layer pass starts on an idle GPU: its first block's forward carries the wait
  // for the host's launches (0.26-1.0 ms in the H100/H200 profiles), which the whole pass and a
  // pipeline's first stage do not. The loader takes the first block's excess over the other blocks'
  // median forward out of layer 1 (its forward and total) before deriving fb_sync, so a stage of the
  // whole model still costs the whole pass, and the first stage no longer pays the latency alone.
  const double startup = 0.5;
  const ProfileSet clean = ProfileSet::load(extended_profiles(), 10);
  const ProfileSet late = ProfileSet::load(startup_profiles(startup), 10);
  const int a100 = clean.type_index("A100");
  const LayerProfile* c = clean.find(a100, 1, 2);
  const LayerProfile* l = late.find(a100, 1, 2);
  REQUIRE(c);
  REQUIRE(l);
  REQUIRE(c->forward_ms[1] == c->forward_ms[2]);  // the analytic blocks are alike
  CHECK(c->first_block_startup_ms == 0);
  CHECK(l->first_block_startup_ms == Approx(startup).epsilon(1e-12));
  CHECK(l->forward_ms[1] == Approx(c->forward_ms[1]).epsilon(1e-12));
  CHECK(l->layer_ms[1] == Approx(c->layer_ms[1]).epsilon(1e-12));
  CHECK(l->fb_sync_ms == Approx(c->fb_sync_ms).epsilon(1e-12));
  // The two-stage plan costs as if the latency had never been measured.
  const PlanSimulation a = TwoStagePlan().run(clean), b = TwoStagePlan().run(late);
  for (int s = 0; s < 2; ++s) {
    CHECK(b.stages[s].forward_ms == Approx(a.stages[s].forward_ms).epsilon(1e-12));
    CHECK(b.stages[s].backward_ms == Approx(a.stages[s].backward_ms).epsilon(1e-12));
  }
  CHECK(b.timeline.iteration_ms == Approx(a.timeline.iteration_ms).epsilon(1e-12));
}

TEST_CASE("recomputation adds the recomputed forward to the backward", "[sim][recompute]") {
  const ProfileSet profiles = ProfileSet::load(extended_profiles(), 10);
  const TwoStagePlan plan;
  SimulationOptions full, selective;
  full.setup.recompute = Recompute::kFull;
  selective.setup.recompute = Recompute::kSelective;
  const PlanSimulation none = plan.run(profiles), f = plan.run(profiles, full), s = plan.run(profiles, selective);
  // Blocks only (layers 1-4 of the stage's 0-4): the embedding is never recomputed.
  const double layers_forward = slice(profiles.find(0, 1, 2)->forward_ms, 1, 5);
  CHECK(f.stages[0].backward_ms - none.stages[0].backward_ms == Approx(layers_forward).epsilon(1e-12));
  CHECK(f.stages[0].forward_ms == none.stages[0].forward_ms);
  // Selective: the attention scores' share of the forward FLOPs, 4 s a d per token and layer.
  const SearchOptions o = test::table1_search_options(10);
  const ModelShape shape = shape_from_model_config(o.model);
  const double seq = o.model.sequence_length;
  const double share = 4 * seq * shape.num_heads * shape.head_dim / shape.block_forward_flops_per_token(seq);
  CHECK(recomputed_forward_fraction(shape, Recompute::kSelective, o.model.sequence_length) == Approx(share));
  CHECK(s.stages[0].backward_ms - none.stages[0].backward_ms == Approx(layers_forward * share).epsilon(1e-12));
  CHECK(f.timeline.iteration_ms > s.timeline.iteration_ms);
  CHECK(s.timeline.iteration_ms > none.timeline.iteration_ms);
}

TEST_CASE("a profile extension of the wrong length is an error naming file and key", "[sim][profiles][errors]") {
  const auto dir = test::scratch_dir("stage-costs-bad") / "p";
  fs::remove_all(dir);
  fs::copy(test::analytic_dir(10), dir, fs::copy_options::recursive);
  const std::string f = (dir / "DeviceType.V100_tp1_bs2.json").string();
  ordered_json j = read_json_file(f);
  j["execution_time"]["layer_forward_ms"] = {1.0, 2.0};
  write_json_file(f, j);
  try {
    ProfileSet::load(dir.string(), 10);
    FAIL("expected an InputError");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK(what.find(f) != std::string::npos);
    CHECK(what.find("execution_time.layer_forward_ms") != std::string::npos);
    CHECK(what.find("has 2 entries, expected one per layer (10)") != std::string::npos);
  }
}

TEST_CASE("the pace-setting stage computes at the sustained pace", "[sim][power]") {
  // Copy of the extended set where every file's sustained pass ran 10% (tp 1) or 4% (tp 2) slower than its burst.
  const auto dir = test::scratch_dir("stage-costs-sustained") / "p";
  fs::remove_all(dir);
  fs::copy(extended_profiles(), dir, fs::copy_options::recursive);
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("DeviceType.", 0) != 0) continue;
    ordered_json j = read_json_file(f.path().string());
    const double fb = j["execution_time"]["forward_backward_time_ms"].get<double>();
    j["execution_time"]["sustained_forward_backward_ms"] = fb * (name.find("_tp1_") != std::string::npos ? 1.10 : 1.04);
    write_json_file(f.path().string(), j);
  }
  const ProfileSet profiles = ProfileSet::load(dir.string(), 10);
  CHECK(profiles.find(0, 1, 2)->sustained_ratio() == Approx(1.10));
  const TwoStagePlan plan;
  SimulationOptions burst;
  burst.sustained_clocks = false;
  const PlanSimulation b = plan.run(profiles, burst), s = plan.run(profiles);
  auto compute = [&](const StageCosts& c) {
    return plan.batches * (c.forward_ms + c.backward_ms) + (plan.batches - 1) * c.accumulation_ms;
  };
  const int pace = compute(b.stages[1]) > compute(b.stages[0]) ? 1 : 0;
  const double factor = pace == 0 ? 1.10 : 1.04;
  for (int i = 0; i < 2; ++i) {
    INFO("stage " << i << ", pace-setter " << pace);
    CHECK(b.stages[i].power_limited == false);
    CHECK(s.stages[i].power_limited == (i == pace));
    const double f = i == pace ? factor : 1.0;
    CHECK(s.stages[i].forward_ms == Approx(b.stages[i].forward_ms * f).epsilon(1e-12));
    CHECK(s.stages[i].backward_ms == Approx(b.stages[i].backward_ms * f).epsilon(1e-12));
    CHECK(s.stages[i].accumulation_ms == b.stages[i].accumulation_ms);  // memory-bound: not stretched
  }
  CHECK(s.timeline.iteration_ms > b.timeline.iteration_ms);
  // Files without the measurement: no stretch at all.
  const PlanSimulation plain = plan.run(ProfileSet::load(extended_profiles(), 10));
  CHECK(plain.stages[0].forward_ms == b.stages[0].forward_ms);
  CHECK_FALSE(plain.stages[0].power_limited);
  CHECK_FALSE(plain.stages[1].power_limited);
}
