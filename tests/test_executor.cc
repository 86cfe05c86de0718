// The executor on the CPU: plans replayed by 4 Gloo processes train exactly
// like one process on the same global batch (losses and parameters after 2
// Adam steps within 1e-4 relative), and a failing rank ends the run with a
// clear error instead of a hang.

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>

#include <sys/wait.h>

#include "executor/pipeline_layout.h"
#include "executor/pipeline_runtime.h"
#include "executor/zero_optimizer.h"
#include "profiler/distributed.h"
#include "profiler/mixed_precision.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "tests/fixtures.h"

// After the LibTorch headers: glog defines a CHECK macro that Catch's must replace.
#undef CHECK
#include <catch2/catch.hpp>

namespace fs = std::filesystem;
using namespace hetplan;
using namespace hetplan::executor;

namespace {

constexpr int kLayers = 4, kHidden = 32, kSeq = 8, kVocab = 64, kHeads = 4, kGbs = 8;
constexpr double kLr = 1e-3;

ordered_json plan_json(std::vector<int> groups, std::vector<std::pair<int, int>> strategies, std::vector<int> lp,
                       int batches, int layers = kLayers) {
  ordered_json st = ordered_json::array();
  for (auto [dp, tp] : strategies) st.push_back({dp, tp});
  return {{"node_sequence", {"CPU"}}, {"device_groups", groups}, {"strategies", st}, {"batches", batches},
          {"layer_partition", lp},   {"gbs", kGbs},           {"cost", 1.0},
          {"model", {{"num_layers", layers}, {"hidden_size", kHidden}, {"sequence_length", kSeq},
                     {"vocab_size", kVocab}, {"attention_heads", kHeads}}}};
}

// The plans' model: Metis's GPT (tied embeddings, learned positions).
ModelShape plan_shape() { return gpt2_shape(kVocab, kHidden, kLayers - 2, kHeads, kSeq); }

// A Llama of the plans' layer count and hidden size: GQA (4 heads, 2
// key/value heads), SwiGLU, RMSNorm, RoPE, untied embeddings.
constexpr const char* kLlamaConfig = R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
  "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "hidden_act": "silu"})";

ReplayConfig config(const ModelShape& shape = plan_shape()) {
  ReplayConfig c;
  c.model.shape = shape;
  c.model.seq_len = kSeq;
  c.gbs = kGbs;
  c.lr = kLr;
  return c;
}

// Single-process training on the same global batches.
struct Reference {
  std::vector<double> losses;
  std::map<std::pair<int64_t, std::string>, torch::Tensor> params;
};

const Reference& reference(int steps, const ModelShape& shape) {
  static std::map<std::pair<int, std::string>, Reference> cache;
  const std::pair<int, std::string> key{steps, shape.name + "/" + std::to_string(shape.num_layers)};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const ReplayConfig c = config(shape);
  profiler::GPT model(c.model, profiler::TensorParallelGroup());
  torch::optim::Adam adam(model.parameters(), torch::optim::AdamOptions(kLr));
  Reference r;
  for (int step = 0; step < steps; ++step) {
    const auto [ids, targets] = global_batch(c, step);
    adam.zero_grad();
    torch::Tensor loss = model.loss(ids, targets);
    r.losses.push_back(loss.item<double>());
    loss.backward();
    adam.step();
  }
  for (int64_t l = 0; l < shape.metis_num_layers(); ++l)
    for (const auto& p : model.layers()[l]->named_parameters()) r.params[{l, p.key()}] = p.value().detach().clone();
  return cache[key] = r;
}

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-12);
}

// How far a replay ended from single-process training: the largest relative loss error over the steps,
// and the relative error of all parameters as one vector.
struct Deviation {
  double loss = 0, params = 0;
};

// Losses of the 2 steps and the dumped parameters (--dump-params) equal single-process training's
// (`expect_same`; else only measured, for runs with a mechanism taken out). Returns the deviation.
Deviation check_trains_like_reference(const Reference& ref, const std::vector<double>& losses,
                                      const fs::path& params_dir, bool expect_same = true) {
  Deviation dev;
  REQUIRE(losses.size() == 2);
  for (int k = 0; k < 2; ++k) {
    dev.loss = std::max(dev.loss, std::abs(losses[k] - ref.losses[k]) / ref.losses[k]);
    if (expect_same) CHECK(std::abs(losses[k] - ref.losses[k]) <= 1e-4 * ref.losses[k]);
  }

  // Reassemble every parameter from the ranks of replica 0 (all replicas must agree).
  std::map<std::pair<int64_t, std::string>, std::vector<std::pair<int, torch::Tensor>>> shards;
  std::map<std::pair<int64_t, std::string>, std::vector<torch::Tensor>> replicas;
  for (const auto& f : fs::directory_iterator(params_dir)) {
    if (f.path().extension() != ".json") continue;
    const ordered_json meta = read_json_file(f.path().string());
    std::vector<torch::Tensor> tensors;
    torch::load(tensors, fs::path(f.path()).replace_extension(".pt").string());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const std::pair<int64_t, std::string> key{meta["params"][i]["layer"], meta["params"][i]["name"]};
      if (meta["replica"] == 0) shards[key].emplace_back(meta["tp_index"].get<int>(), tensors[i]);
      if (meta["tp_index"] == 0) replicas[key].push_back(tensors[i]);
    }
  }
  // Parameters are compared as one vector: Adam turns the rounding noise of a
  // gradient that is zero in exact arithmetic (the attention key bias) into
  // updates of ~lr * 1e-2, so a single such tensor is no fair measure. A
  // head stage's copy of the tied embedding ("tied_wte") must equal the
  // embedding.
  std::vector<torch::Tensor> all_got, all_want;
  std::size_t matched = 0;
  for (const auto& [key, parts_unused] : shards) {
    INFO("layer " << key.first << " " << key.second);
    const bool copy = key.second == "tied_wte";
    const torch::Tensor want = ref.params.at(copy ? std::make_pair(int64_t{0}, std::string("wte.weight")) : key);
    if (!copy) ++matched;
    auto parts = shards.at(key);
    std::sort(parts.begin(), parts.end(), [](auto& a, auto& b) { return a.first < b.first; });
    torch::Tensor got = parts[0].second;
    if (!got.sizes().equals(want.sizes())) {
      int64_t dim = 0;
      while (got.size(dim) == want.size(dim)) ++dim;
      std::vector<torch::Tensor> ts;
      for (auto& p : parts) ts.push_back(p.second);
      got = torch::cat(ts, dim);
    }
    REQUIRE(got.sizes().equals(want.sizes()));
    all_got.push_back(got.flatten());
    all_want.push_back(want.flatten());
    if (expect_same)
      for (const auto& other : replicas.at(key)) CHECK(rel(other, replicas.at(key)[0]) <= 1e-6);
  }
  CHECK(matched == ref.params.size());
  dev.params = rel(torch::cat(all_got), torch::cat(all_want));
  INFO("relative parameter error " << dev.params);
  if (expect_same) CHECK(dev.params <= 1e-4);
  return dev;
}

// Replays `plan` (2 steps, fp32, parameters dumped) with `env` set (e.g. the test hook
// HETPLAN_TEST_DISABLE=...); returns the result and, through `dev`, its deviation from one process
// (checked to be within tolerance where `expect_same`).
ordered_json replay_against_one_process(const std::string& name, const ordered_json& plan, const std::string& schedule,
                                        const std::string& hf_config, const std::string& extra,
                                        const ModelShape& shape, const std::string& env, bool expect_same,
                                        Deviation* dev) {
  const auto dir = test::scratch_dir("replay-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_json_file((dir / "plan.json").string(), plan);
  const test::CommandResult r = test::run_hetplan("replay --device cpu --dtype fp32 --iters 2 --warmup 0 --lr 0.001 --schedule " + schedule +
                            " --plan " + (dir / "plan.json").string() + " --out " + (dir / "result.json").string() +
                            " --dump-params " + (dir / "params").string() +
                            (hf_config.empty() ? "" : " --hf-config " + hf_config) + " " + extra, env);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const Reference& ref = reference(2, hf_config.empty() ? shape : read_hf_config(hf_config));
  const ordered_json result = read_json_file((dir / "result.json").string());
  REQUIRE(result["losses"].size() == 2);
  std::vector<double> losses;
  for (const auto& l : result["losses"]) losses.push_back(l.get<double>());
  if (const auto z = extra.find("--zero "); z != std::string::npos)
    CHECK(result["zero_stage_executed"] == std::stoi(extra.substr(z + 7)));
  *dev = check_trains_like_reference(ref, losses, dir / "params", expect_same);
  return result;
}

ordered_json check_plan_trains_like_one_process(const std::string& name, const ordered_json& plan,
                                        const std::string& schedule = "1f1b", const std::string& hf_config = "",
                                        const std::string& extra = "", const ModelShape& shape = plan_shape()) {
  Deviation dev;
  return replay_against_one_process(name, plan, schedule, hf_config, extra, shape, "", true, &dev);
}

// The deviation of `plan`'s replay with `mechanism` taken out (the test hook HETPLAN_TEST_DISABLE).
Deviation deviation_without(const std::string& mechanism, const std::string& name, const ordered_json& plan,
                            const std::string& hf_config = "") {
  Deviation dev;
  replay_against_one_process(name + "-without-" + mechanism, plan, "1f1b", hf_config, "", plan_shape(),
                             "HETPLAN_TEST_DISABLE=" + mechanism, false, &dev);
  return dev;
}

}  // namespace

TEST_CASE("replay (pp=2, dp=2) trains like one process", "[executor]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("pp2dp2", plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 2, 4}, 2));
}

TEST_CASE("replay (pp=2, tp=2) trains like one process", "[executor]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("pp2tp2", plan_json({2, 2}, {{1, 2}, {1, 2}}, {0, 2, 4}, 2));
}

TEST_CASE("replay (1 stage, tp=2, dp=2) trains like one process", "[executor]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("tp2dp2", plan_json({4}, {{2, 2}}, {0, 4}, 2));
}

TEST_CASE("replay with different dp per stage re-shards activations", "[executor]") {
  REQUIRE_CPU_COLLECTIVES();
  // Stage 0: dp 2; stage 1: one replica of tp 2.
  check_plan_trains_like_one_process("dp2-tp2", plan_json({2, 2}, {{2, 1}, {1, 2}}, {0, 2, 4}, 2));
  // Stage 0: one GPU; stage 1: dp 3 (micro-batch 4 splits 2, 1, 1), under GPipe.
  check_plan_trains_like_one_process("dp1-dp3", plan_json({1, 3}, {{1, 1}, {3, 1}}, {0, 1, 4}, 2), "gpipe");
}

// Interleaved 1F1B, pp 2 x v 2 over 7 layers (embedding, 5 blocks, head) on stages of uneven size:
// stage 0 keeps 3 layers (chunks of 2 and 1), stage 1 keeps 4 (2 and 2), so the model runs
// [0, 2) on stage 0, [2, 4) on stage 1, [4, 5) on stage 0, [5, 7) on stage 1. Besides training
// like one process, each rank must hold exactly its chunks' layers and run its forwards and
// backwards in Megatron's interleaved order (so a replay that ran plain 1F1B on contiguous
// stages fails here).
void check_interleaved(const std::string& name, std::vector<int> groups, std::vector<std::pair<int, int>> strategies) {
  const int layers = 7;
  ordered_json plan = plan_json(groups, strategies, {0, 3, 7}, 4, layers);
  plan["schedule"] = "interleaved";
  plan["virtual_stages"] = 2;
  const ModelShape shape = gpt2_shape(kVocab, kHidden, layers - 2, kHeads, kSeq);
  check_plan_trains_like_one_process(name, plan, "interleaved", "", "", shape);
  const auto dir = test::scratch_dir("replay-" + name);
  const std::vector<std::set<int64_t>> want_layers = {{0, 1, 4}, {2, 3, 5, 6}};
  const ordered_json trace = read_json_file((dir / "result.trace.json").string());
  for (const auto& f : fs::directory_iterator(dir / "params")) {
    if (f.path().extension() != ".json") continue;
    const ordered_json meta = read_json_file(f.path().string());
    std::set<int64_t> held;
    for (const auto& p : meta["params"]) held.insert(p["layer"].get<int64_t>());
    const int stage = meta["stage"];
    INFO("rank " << meta["rank"] << " stage " << stage);
    CHECK(held == want_layers[stage]);
    // The rank's compute spans, in time order, are StageOps' interleaved order.
    std::vector<std::tuple<double, bool, int, int>> ops;
    for (const auto& e : trace["traceEvents"])
      if (e["ph"] == "X" && e["pid"] == meta["rank"] && (e["name"] == "forward" || e["name"] == "backward"))
        ops.emplace_back(e["ts"].get<double>(), e["name"] == "forward", e["args"]["micro_batch"].get<int>(),
                         e["args"]["chunk"].get<int>());
    std::sort(ops.begin(), ops.end());
    const StageOps want(Schedule::kInterleaved1F1B, 2, stage, 4, 2);
    REQUIRE(static_cast<int>(ops.size()) == want.size());
    for (int q = 0; q < want.size(); ++q) {
      INFO("op " << q);
      CHECK(std::get<1>(ops[q]) == want[q].forward);
      CHECK(std::get<2>(ops[q]) == want[q].micro_batch);
      CHECK(std::get<3>(ops[q]) == want[q].chunk);
    }
  }
}

TEST_CASE("replay under interleaved 1F1B (pp 2 x v 2, uneven stages) trains like one process",
          "[executor][interleaved]") {
  REQUIRE_CPU_COLLECTIVES();
  check_interleaved("interleaved-pp2v2", {1, 1}, {{1, 1}, {1, 1}});
  // Stage 0 dp 2, stage 1 tp 2: the last stage's chunk 0 re-shards into the first stage's chunk 1.
  check_interleaved("interleaved-dp2-tp2", {2, 2}, {{2, 1}, {1, 2}});
}

TEST_CASE("replay refuses interleaving it cannot run", "[executor][interleaved]") {
  ordered_json plan = plan_json({1, 1}, {{1, 1}, {1, 1}}, {0, 3, 7}, 3, 7);
  plan["schedule"] = "interleaved";
  plan["virtual_stages"] = 2;
  CHECK_THROWS_AS(PipelineLayout(plan_file_from_json(plan, "plan"), {}, nullptr), InputError);  // 3 batches, pp 2
  plan = plan_json({1, 1}, {{1, 1}, {1, 1}}, {0, 1, 7}, 4, 7);
  plan["schedule"] = "interleaved";
  plan["virtual_stages"] = 2;
  CHECK_THROWS_AS(PipelineLayout(plan_file_from_json(plan, "plan"), {}, nullptr), InputError);  // 1 layer, v 2
}

TEST_CASE("pipeline layout: sample splits and re-sharding transfers", "[executor]") {
  PlanFile f = plan_file_from_json(plan_json({1, 3}, {{1, 1}, {3, 1}}, {0, 1, 4}, 2), "plan");
  const PipelineLayout layout(f, {}, nullptr);
  CHECK(layout.world() == 4);
  CHECK(layout.micro_batch() == 4);
  const auto& s1 = layout.stage(1);
  REQUIRE(s1.replica_samples.size() == 3);
  CHECK(s1.replica_samples[0].begin == 0);
  CHECK(s1.replica_samples[0].end == 2);
  CHECK(s1.replica_samples[2].begin == 3);
  // Rank 0 sends samples [0,2) to rank 1, [2,3) to rank 2 and [3,4) to rank 3.
  const auto& fwd = layout.forward_transfers(0);
  REQUIRE(fwd.size() == 3);
  CHECK(fwd[1].src == 0);
  CHECK(fwd[1].dst == 2);
  CHECK(fwd[1].samples.begin == 2);
  CHECK(layout.backward_transfers(0).size() == 3);
  // A plan that drops layers is refused when it is read.
  CHECK_THROWS_AS(plan_file_from_json(plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 1, 3}, 2), "plan"), InputError);
}

TEST_CASE("pipeline layout: process groups come from the rank grid, Megatron's order", "[executor][grid]") {
  // Stage 0: dp 2 x tp 2 (ranks 0-3); stage 1: dp 2 x tp 2 (ranks 4-7); stage 2: dp 1 x tp 2 (ranks 8-9).
  PlanFile f = plan_file_from_json(plan_json({4, 4, 2}, {{2, 2}, {2, 2}, {1, 2}}, {0, 1, 3, 4}, 2), "plan");
  const PipelineLayout layout(f, {}, nullptr);
  REQUIRE(layout.world() == 10);
  // Rank 5: stage 1, replica 0, tp index 1: tp group {4, 5}, dp group {5, 7}.
  CHECK(layout.stage_of(5).index == 1);
  CHECK(layout.replica_of(5) == 0);
  CHECK(layout.tp_index_of(5) == 1);
  const GroupSeat tp = layout.tp_seat(5), dp = layout.dp_seat(5);
  CHECK(tp.name == "tp.1.0");
  CHECK(tp.position == 1);
  CHECK(tp.size == 2);
  CHECK(dp.name == "dp.1.1");
  CHECK(dp.position == 0);
  CHECK(dp.size == 2);
  CHECK(layout.dp_seat(7).name == "dp.1.1");
  CHECK(layout.dp_seat(7).position == 1);
  CHECK_FALSE(layout.dp_seat(9).member());  // stage 2 has one replica
  // Stages 0 and 2 differ in dp: one embedding group of their 6 ranks.
  CHECK(layout.embedding_group_full());
  CHECK(layout.embedding_seat(2).name == "emb");
  CHECK(layout.embedding_seat(2).position == 2);
  CHECK(layout.embedding_seat(9).position == 5);
  CHECK(layout.embedding_seat(9).size == 6);
  CHECK_FALSE(layout.embedding_seat(5).member());
  // Equal first and last stages: Megatron's pairs (same replica and tp index).
  PlanFile g = plan_file_from_json(plan_json({4, 4}, {{2, 2}, {2, 2}}, {0, 2, 4}, 2), "plan");
  const PipelineLayout pairs(g, {}, nullptr);
  CHECK_FALSE(pairs.embedding_group_full());
  CHECK(pairs.embedding_seat(2).name == "emb.1.0");
  CHECK(pairs.embedding_seat(2).position == 0);
  CHECK(pairs.embedding_seat(6).name == "emb.1.0");
  CHECK(pairs.embedding_seat(6).position == 1);
}

TEST_CASE("a failing rank or a stage out of memory ends the replay with a clear error, without hanging",
          "[executor][errors]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("replay-fail");
  fs::create_directories(dir);
  auto timed_run = [&](const std::string& env, const std::string& plan, const std::string& extra) {
    const auto t0 = std::chrono::steady_clock::now();
    const test::CommandResult r = test::run_hetplan("replay --device cpu --dtype fp32 --iters 1 --warmup 0 --timeout-s 5 --plan " +
                                           (dir / plan).string() + " --out " + (dir / "r.json").string() + " " + extra, env);
    return std::make_pair(r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  write_json_file((dir / "plan.json").string(), plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 2, 4}, 2));
  {
    // Rank 2 dies at start; the others wait on it in their first collective.
    const auto [r, seconds] = timed_run("HETPLAN_REPLAY_FAIL_RANK=2", "plan.json", "");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("replay failed") != std::string::npos);
    CHECK(r.output.find("rank 2: injected failure") != std::string::npos);
    CHECK(seconds < 40);
  }
  {
    // A 4096-sample global batch in 4 MB per rank: the stages run out of memory.
    ordered_json big = plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 2, 4}, 1);
    big["gbs"] = 4096;
    write_json_file((dir / "big.json").string(), big);
    const auto [r, seconds] = timed_run("", "big.json", "--cpu-memory-limit-mb 4");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("replay failed") != std::string::npos);
    CHECK(r.output.find("out of memory") != std::string::npos);
    CHECK(seconds < 40);
  }
}

TEST_CASE("replay of a Llama (GQA, SwiGLU, RoPE, untied) from a Hugging Face config trains like one process",
          "[executor]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("replay-llama-config");
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  std::ofstream(path) << kLlamaConfig;
  check_plan_trains_like_one_process("llama-pp2tp2", plan_json({2, 2}, {{1, 2}, {1, 2}}, {0, 2, 4}, 2), "1f1b", path);
  check_plan_trains_like_one_process("llama-tp2dp2", plan_json({4}, {{2, 2}}, {0, 4}, 2), "1f1b", path);
}

TEST_CASE("bf16 training keeps fp32 master weights: the applied update is the fp32 update rounded", "[executor][mixed]") {
  const ReplayConfig c = config();
  profiler::GPT model(c.model, profiler::TensorParallelGroup());
  model.to(torch::kCPU, torch::kBFloat16);
  const std::vector<torch::Tensor> params = model.parameters();
  profiler::MixedPrecisionAdam opt(params, kLr);
  REQUIRE(opt.master_params().size() == params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].scalar_type() == torch::kBFloat16);
    CHECK(opt.master_params()[i].scalar_type() == torch::kFloat32);
    CHECK(opt.main_grads()[i].scalar_type() == torch::kFloat32);
    CHECK(torch::equal(opt.master_params()[i].to(torch::kBFloat16), params[i]));
  }
  CHECK(profiler::MixedPrecisionAdam::state_bytes_per_parameter(torch::kBFloat16) == 18);
  CHECK(profiler::MixedPrecisionAdam::state_bytes_per_parameter(torch::kFloat32) == 16);
  CHECK(profiler::MixedPrecisionAdam::state_bytes_per_parameter(torch::kBFloat16, 4) == 9);  // ZeRO-1 over 4

  // fp32 Adam on copies of the masters, fed the same fp32 main gradients.
  std::vector<torch::Tensor> ref;
  for (const auto& m : opt.master_params()) ref.push_back(m.detach().clone().set_requires_grad(true));
  torch::optim::Adam ref_adam(ref, torch::optim::AdamOptions(kLr));
  int64_t kept_by_master = 0;
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    const auto [ids, targets] = global_batch(c, step);
    for (int j = 0; j < 2; ++j) {  // two micro-batches, accumulated in fp32
      (model.loss(ids.narrow(0, 4 * j, 4), targets.narrow(0, 4 * j, 4)) * 0.5).backward();
      opt.accumulate_grads();
      for (const auto& p : params) CHECK_FALSE(p.grad().defined());
    }
    std::vector<torch::Tensor> before;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      ref[i].mutable_grad() = opt.main_grads()[i].clone();
      before.push_back(opt.master_params()[i].detach().clone());
    }
    ref_adam.step();
    opt.step();
    for (std::size_t i = 0; i < params.size(); ++i) {
      INFO("step " << step << " parameter " << i);
      CHECK(torch::equal(opt.master_params()[i], ref[i]));                    // the fp32 update
      CHECK(torch::equal(params[i], ref[i].detach().to(torch::kBFloat16)));  // rounded into the bf16 weights
      // Updates below bf16's resolution move the master but not the weight.
      kept_by_master += ((opt.master_params()[i] != before[i]) & (params[i] == before[i].to(torch::kBFloat16)))
                            .sum()
                            .item<int64_t>();
    }
  }
  CHECK(kept_by_master > 0);
}

TEST_CASE("replay with full or selective recomputation trains like one process", "[executor][recompute]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("pp2tp2-full", plan_json({2, 2}, {{1, 2}, {1, 2}}, {0, 2, 4}, 2), "1f1b", "",
                                     "--recompute full");
  check_plan_trains_like_one_process("pp2dp2-selective", plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 2, 4}, 2), "gpipe", "",
                                     "--recompute selective");
}

TEST_CASE("replay with ZeRO-1 (sharded fp32 masters and Adam state) trains like one process", "[executor][zero]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("pp2dp2-zero1", plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 2, 4}, 2), "1f1b", "",
                                     "--zero 1");
  // Stage 0 with dp 3 (micro-batch 4 splits 2, 1, 1) and the tied embedding split from the head.
  check_plan_trains_like_one_process("dp3-zero1", plan_json({3, 1}, {{3, 1}, {1, 1}}, {0, 2, 4}, 2), "gpipe", "",
                                     "--zero 1");
}

TEST_CASE("main gradients added in the backward (accumulator hooks) equal those added after it", "[executor][mixed]") {
  const ReplayConfig c = config();
  std::vector<torch::Tensor> got[2];
  for (int hooked = 0; hooked < 2; ++hooked) {
    profiler::GPT model(c.model, profiler::TensorParallelGroup());
    model.to(torch::kCPU, torch::kBFloat16);
    const std::vector<torch::Tensor> params = model.parameters();
    profiler::MixedPrecisionAdam opt(params, kLr, 0, 1, hooked == 1);
    const auto [ids, targets] = global_batch(c, 0);
    for (int j = 0; j < 2; ++j) {
      model.loss(ids.narrow(0, 4 * j, 4), targets.narrow(0, 4 * j, 4)).backward();
      // With the hooks no parameter holds a gradient after its backward.
      if (hooked)
        for (const auto& p : params) CHECK_FALSE(p.grad().defined());
      opt.accumulate_grads();
    }
    for (const auto& g : opt.main_grads()) got[hooked].push_back(g.clone());
  }
  REQUIRE(got[0].size() == got[1].size());
  for (std::size_t i = 0; i < got[0].size(); ++i) CHECK(torch::equal(got[0][i], got[1][i]));
}

TEST_CASE("replay in bf16 (pp 2, dp 2, ZeRO-1) on the CPU: losses within bf16's resolution of fp32 training",
          "[executor][mixed]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("replay-bf16");
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_json_file((dir / "plan.json").string(), plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 2, 4}, 2));
  const test::CommandResult r = test::run_hetplan("replay --device cpu --dtype bf16 --iters 2 --warmup 0 --lr 0.001 --zero 1 --plan " +
                                                  (dir / "plan.json").string() + " --out " + (dir / "result.json").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const ordered_json result = read_json_file((dir / "result.json").string());
  CHECK(result["optimizer"]["master_weights"] == "fp32");
  CHECK(result["zero_stage_executed"] == 1);
  const Reference& ref = reference(2, plan_shape());
  REQUIRE(result["losses"].size() == 2);
  // bf16 keeps 8 significant bits (unit roundoff 2^-8); the loss itself is
  // computed in fp32 from bf16 logits, so it may differ by about that much.
  for (int k = 0; k < 2; ++k)
    CHECK(std::abs(result["losses"][k].get<double>() - ref.losses[k]) <= std::ldexp(1.0, -8) * ref.losses[k]);
}

// --- Replay across hosts under torchrun -----------------------------------
// Two "nodes" on this machine: the scripts of `hetplan export --to torchrun`
// for a two-host plan run as two launcher processes (tests/two_nodes.sh;
// tests/fake_torchrun.sh stands in for torchrun, whose Python package this
// machine lacks, and gives the workers torchrun's environment), Gloo, nnodes
// 2. Host 127.0.0.1 holds stage 0 (one replica of tp 2), host 127.0.0.2
// stage 1 (dp 2), each host a different GPU type.

namespace {

using test::run_shell;

// Writes the two-host plan and exports it; returns the folder of the launch scripts.
fs::path export_two_host_plan(const fs::path& dir, const std::string& replay_args) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream((dir / "hostfile").string()) << "127.0.0.1 slots=2\n127.0.0.2 slots=2\n";
  write_json_file((dir / "clusterfile.json").string(),
                  {{"127.0.0.1", {{"instance_type", "A100"}, {"inter_bandwidth", 25}, {"intra_bandwidth", 300}, {"memory", 80}}},
                   {"127.0.0.2", {{"instance_type", "V100"}, {"inter_bandwidth", 10}, {"intra_bandwidth", 50}, {"memory", 32}}}});
  ordered_json plan = plan_json({2, 2}, {{1, 2}, {2, 1}}, {0, 2, 4}, 2);
  plan["node_sequence"] = {"A100", "V100"};
  plan["hostfile"] = (dir / "hostfile").string();
  plan["clusterfile"] = (dir / "clusterfile.json").string();
  write_json_file((dir / "plan.json").string(), plan);
  const test::CommandResult r =
      test::run_hetplan("export --plan " + (dir / "plan.json").string() + " --to torchrun --out " +
                        (dir / "launch").string() + " --rdzv-endpoint 127.0.0.1:" +
                        std::to_string(profiler::free_local_port()) + " --replay-args '" + replay_args + "'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(fs::exists(dir / "launch" / "launch_0_127.0.0.1.sh"));
  REQUIRE(fs::exists(dir / "launch" / "launch_1_127.0.0.2.sh"));
  return dir / "launch";
}

std::string two_nodes(const std::string& mode, const fs::path& launch, const std::string& env = "") {
  return env + " HETPLAN=" HETPLAN_BINARY " bash " HETPLAN_SOURCE_DIR "/tests/two_nodes.sh " + mode + " " +
         launch.string();
}

double field(const std::string& out, const std::string& key) {
  const auto at = out.find(key + "=");
  return at == std::string::npos ? -1 : std::atof(out.c_str() + at + key.size() + 1);
}

}  // namespace

TEST_CASE("replay under torchrun on two nodes (localhost, Gloo) trains like one process", "[executor][torchrun]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("torchrun-train");
  const fs::path launch = export_two_host_plan(
      dir, "--device cpu --dtype fp32 --iters 2 --warmup 0 --lr 0.001 --dump-params " + (dir / "params").string());
  const test::CommandResult r = run_shell(two_nodes("train", launch));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("replay: rank 0 (host 127.0.0.1): iteration_ms median") != std::string::npos);
  // Each process found its rank of the plan from its host and LOCAL_RANK.
  std::vector<double> losses(2, 0.0);
  const int want_stage[] = {0, 0, 1, 1}, want_replica[] = {0, 0, 0, 1}, want_tp[] = {0, 1, 0, 0};
  for (int rank = 0; rank < 4; ++rank) {
    const RankReport rep =
        rank_report_from_json(read_json_file((launch / "ranks" / ("rank" + std::to_string(rank) + ".json")).string()));
    CHECK(rep.rank == rank);
    CHECK(rep.stage == want_stage[rank]);
    CHECK(rep.replica == want_replica[rank]);
    CHECK(rep.tp_index == want_tp[rank]);
    for (std::size_t k = 0; k < rep.losses.size() && k < 2; ++k) losses[k] += rep.losses[k];
  }
  check_trains_like_reference(reference(2, plan_shape()), losses, dir / "params");
}

TEST_CASE("replay under torchrun: a node killed mid-run ends the other within the timeout, naming rank and host",
          "[executor][torchrun][errors]") {
  REQUIRE_CPU_COLLECTIVES();
  constexpr int kTimeout = 10;
  const auto dir = test::scratch_dir("torchrun-kill");
  const fs::path launch = export_two_host_plan(
      dir, "--device cpu --dtype fp32 --iters 100000 --warmup 0 --timeout-s " + std::to_string(kTimeout));
  const test::CommandResult r = run_shell(two_nodes("kill", launch, "KILL_AFTER_S=10"));
  INFO(r.output);
  CHECK(field(r.output, "node0_exit") != 0);
  const double seconds = field(r.output, "seconds_after_kill");
  CHECK(seconds >= 0);
  CHECK(seconds < kTimeout + 5);
  // The survivor names itself and the ranks (with their host) that died. On a
  // loaded machine node 1 may not have joined yet 10 s in; the survivor then
  // says so instead, still naming the rank and host.
  CHECK(r.output.find("(host 127.0.0.1): ") != std::string::npos);
  CHECK((r.output.find("(host 127.0.0.2) stopped responding") != std::string::npos ||
         r.output.find("(host 127.0.0.2) never joined") != std::string::npos));
}

TEST_CASE("replay under torchrun: a node that never joins ends the other within the timeout, naming rank and host",
          "[executor][torchrun][errors]") {
  REQUIRE_CPU_COLLECTIVES();
  constexpr int kTimeout = 5;
  const auto dir = test::scratch_dir("torchrun-absent");
  const fs::path launch =
      export_two_host_plan(dir, "--device cpu --dtype fp32 --iters 2 --warmup 0 --timeout-s " + std::to_string(kTimeout));
  const test::CommandResult r = run_shell(two_nodes("absent", launch));
  INFO(r.output);
  CHECK(field(r.output, "node0_exit") != 0);
  const double seconds = field(r.output, "seconds");
  CHECK(seconds >= 0);
  CHECK(seconds < kTimeout + 15);  // + LibTorch's start-up and the liveness check
  CHECK(r.output.find("rank 2 (host 127.0.0.2) never joined") != std::string::npos);
}

// dp 2, tp 2, pp 2 (8 Gloo ranks): ZeRO and recomputation with every kind of
// parallelism in play. The tied embedding is split over the two stages, so
// its gradient is also summed between them (from the dp chunks under ZeRO-2/3).
ordered_json plan_dp2tp2pp2() { return plan_json({4, 4}, {{2, 2}, {2, 2}}, {0, 2, 4}, 2); }

TEST_CASE("replay (dp 2, tp 2, pp 2) with ZeRO-1 trains like one process", "[executor][zero]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("dp2tp2pp2-zero1", plan_dp2tp2pp2(), "1f1b", "", "--zero 1");
}

TEST_CASE("replay (dp 2, tp 2, pp 2) with ZeRO-2 (gradients reduce-scattered per layer) trains like one process",
          "[executor][zero]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("dp2tp2pp2-zero2", plan_dp2tp2pp2(), "1f1b", "", "--zero 2");
}

TEST_CASE("replay (dp 2, tp 2, pp 2) with ZeRO-3 (weights gathered per layer just in time) trains like one process",
          "[executor][zero]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("dp2tp2pp2-zero3", plan_dp2tp2pp2(), "1f1b", "", "--zero 3");
}

// Overlapped reduction (issue 34): each layer unit's reduce-scatter is left running while the backward goes
// on. The sums are the same, in the same order; the replay must also have started reduce-scatters while
// others were still running, or nothing was overlapped.
TEST_CASE("replay (dp 2, tp 2, pp 2) with ZeRO-2 and overlapped reduce-scatters trains like one process",
          "[executor][zero][overlap]") {
  REQUIRE_CPU_COLLECTIVES();
  const ordered_json r = check_plan_trains_like_one_process("dp2tp2pp2-zero2-overlap", plan_dp2tp2pp2(), "1f1b", "",
                                                            "--zero 2 --overlap-grad-reduce");
  CHECK(r["overlap_grad_reduce_executed"] == true);
  CHECK(r["overlapped_collectives"].get<long long>() > 0);
}

TEST_CASE("replay (dp 2, tp 2, pp 2) with ZeRO-3 and overlapped reduce-scatters trains like one process",
          "[executor][zero][overlap]") {
  REQUIRE_CPU_COLLECTIVES();
  const ordered_json r = check_plan_trains_like_one_process("dp2tp2pp2-zero3-overlap", plan_dp2tp2pp2(), "1f1b", "",
                                                            "--zero 3 --overlap-grad-reduce");
  CHECK(r["overlap_grad_reduce_executed"] == true);
  CHECK(r["overlapped_collectives"].get<long long>() > 0);
}

// Prefetched all-gathers (issue 34, Megatron's --overlap-param-gather, FSDP's forward and backward prefetch):
// ZeRO-3 starts the next layer's gathers before the current layer computes and waits for them only when
// that layer comes; ZeRO-1 with --overlap-grad-reduce reduce-scatters the summed gradients layer by layer
// during the step's last backward (ZeroOptimizer stage 1, in place in the gradient buffer). Each must train
// like one process, and must really have prefetched (gathers found started ahead) or overlapped
// (reduce-scatters started while others ran): with the mechanism taken out the counts are 0.
ordered_json plan_dp2() { return plan_json({2}, {{2, 1}}, {0, 4}, 2); }  // one stage: both tied ends, 4 layers

TEST_CASE("replay with ZeRO-3, prefetched all-gathers and overlapped reduce-scatters trains like one process",
          "[executor][zero][overlap]") {
  REQUIRE_CPU_COLLECTIVES();
  for (const auto& [name, plan] : {std::pair{std::string("dp2-zero3-prefetch"), plan_dp2()},
                                   std::pair{std::string("dp2tp2pp2-zero3-prefetch"), plan_dp2tp2pp2()}}) {
    INFO(name);
    const ordered_json r = check_plan_trains_like_one_process(name, plan, "1f1b", "",
                                                              "--zero 3 --overlap-grad-reduce --overlap-param-gather");
    CHECK(r["overlap_param_gather_executed"] == true);
    CHECK(r["overlap_grad_reduce_executed"] == true);
    CHECK(r["prefetched_gathers"].get<long long>() > 0);
    CHECK(r["overlapped_collectives"].get<long long>() > 0);
  }
  // With full recomputation the recomputed blocks find their weights gathered (or prefetched) again.
  const ordered_json r = check_plan_trains_like_one_process("dp2-zero3-prefetch-full", plan_dp2(), "1f1b", "",
                                                            "--zero 3 --overlap-param-gather --recompute full");
  CHECK(r["prefetched_gathers"].get<long long>() > 0);
}

TEST_CASE("replay with ZeRO-1 and overlapped reduce-scatters (in the last backward) trains like one process",
          "[executor][zero][overlap]") {
  REQUIRE_CPU_COLLECTIVES();
  for (const auto& [name, plan] : {std::pair{std::string("dp2-zero1-overlap"), plan_dp2()},
                                   std::pair{std::string("dp2tp2pp2-zero1-overlap"), plan_dp2tp2pp2()}}) {
    INFO(name);
    const ordered_json r =
        check_plan_trains_like_one_process(name, plan, "1f1b", "", "--zero 1 --overlap-grad-reduce");
    CHECK(r["overlap_grad_reduce_executed"] == true);
    CHECK(r["overlapped_collectives"].get<long long>() > 0);
  }
}

namespace {
// How far a replay of a one-stage, tp 1 plan lands from single-process training: the largest relative
// error of its two losses and of all parameters (rank 0's dump) as one vector; infinite when the replay
// fails (a loss that is not a number cannot be written as JSON). For runs that must NOT train like one
// process.
double replay_deviation(const std::string& name, const ordered_json& plan, const std::string& extra,
                        const std::string& env) {
  const auto dir = test::scratch_dir("replay-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_json_file((dir / "plan.json").string(), plan);
  const test::CommandResult r = test::run_hetplan(
      "replay --device cpu --dtype fp32 --iters 2 --warmup 0 --lr 0.001 --schedule 1f1b --plan " +
          (dir / "plan.json").string() + " --out " + (dir / "result.json").string() + " --dump-params " +
          (dir / "params").string() + " " + extra,
      env);
  UNSCOPED_INFO(name << ": exit " << r.exit_code << "; " << r.output.substr(r.output.size() > 400 ? r.output.size() - 400 : 0));
  if (r.exit_code != 0) return std::numeric_limits<double>::infinity();
  const Reference& ref = reference(2, plan_shape());
  const ordered_json result = read_json_file((dir / "result.json").string());
  double worst = 0;
  for (int k = 0; k < 2; ++k)
    worst = std::max(worst, std::abs(result["losses"][k].get<double>() - ref.losses[k]) / ref.losses[k]);
  const ordered_json meta = read_json_file((dir / "params" / "rank0.json").string());
  std::vector<torch::Tensor> tensors, got, want;
  torch::load(tensors, (dir / "params" / "rank0.pt").string());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::pair<int64_t, std::string> key{meta["params"][i]["layer"], meta["params"][i]["name"]};
    if (key.second == "tied_wte") continue;
    got.push_back(tensors[i].flatten());
    want.push_back(ref.params.at(key).flatten());
  }
  const double params = rel(torch::cat(got), torch::cat(want));
  return std::max(worst, std::isfinite(params) ? params : 1e30);
}
}  // namespace

// The waits are the mechanism: with the test hook HETPLAN_ZERO_FAULT, ZeRO-3 computes with weights whose
// prefetched all-gather it did not wait for, or ZeRO-1 steps without the overlapped reduce-scatters'
// results, and replay no longer trains like one process (the same runs without the hook do, within 1e-4).
TEST_CASE("replay without waiting for prefetched gathers or overlapped reduce-scatters does not train like one "
          "process",
          "[executor][zero][overlap]") {
  REQUIRE_CPU_COLLECTIVES();
  const std::string zero3 = "--zero 3 --overlap-grad-reduce --overlap-param-gather";
  const std::string zero1 = "--zero 1 --overlap-grad-reduce";
  CHECK(replay_deviation("fault-none-zero3", plan_dp2(), zero3, "") <= 1e-4);
  CHECK(replay_deviation("fault-gather-zero3", plan_dp2(), zero3, "HETPLAN_ZERO_FAULT=skip_gather_wait") > 1e-3);
  CHECK(replay_deviation("fault-none-zero1", plan_dp2(), zero1, "") <= 1e-4);
  CHECK(replay_deviation("fault-reduce-zero1", plan_dp2(), zero1, "HETPLAN_ZERO_FAULT=skip_reduce_wait") > 1e-3);
}

// --work-dir of the user's: it reached the ranks twice (the user's and replay's own), which CLI11 refused.
TEST_CASE("replay --work-dir: the ranks write their results there, and the folder's other files stay",
          "[executor][cli]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("replay-work-dir");
  fs::remove_all(dir);
  fs::create_directories(dir / "ranks");
  write_json_file((dir / "plan.json").string(), plan_dp2());
  std::ofstream(dir / "ranks" / "keep.txt") << "mine\n";
  std::ofstream(dir / "ranks" / "rank1.error") << "from an earlier run\n";
  const test::CommandResult r = test::run_hetplan(
      "replay --device cpu --dtype fp32 --iters 1 --warmup 0 --plan " + (dir / "plan.json").string() + " --out " +
      (dir / "result.json").string() + " --work-dir " + (dir / "ranks").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(fs::exists(dir / "ranks" / "rank0.json"));
  CHECK(fs::exists(dir / "ranks" / "rank1.json"));
  CHECK(fs::exists(dir / "ranks" / "keep.txt"));
  CHECK_FALSE(fs::exists(dir / "ranks" / "rank1.error"));
  CHECK_FALSE(fs::exists(dir / "result.ranks"));
}

TEST_CASE("replay (dp 2, tp 2, pp 2) with full recomputation trains like one process", "[executor][recompute]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("dp2tp2pp2-full", plan_dp2tp2pp2(), "1f1b", "", "--recompute full --zero 1");
}

TEST_CASE("replay (dp 2, tp 2, pp 2) with selective recomputation trains like one process", "[executor][recompute]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("dp2tp2pp2-selective", plan_dp2tp2pp2(), "gpipe", "",
                                     "--recompute selective --zero 2");
}

TEST_CASE("replay with ZeRO-3 and full recomputation (recomputed blocks gather their weights again) trains like one process",
          "[executor][zero][recompute]") {
  REQUIRE_CPU_COLLECTIVES();
  check_plan_trains_like_one_process("dp2tp2pp2-zero3-full", plan_dp2tp2pp2(), "1f1b", "", "--zero 3 --recompute full");
}

TEST_CASE("replay with ZeRO-2/3 on uneven shards, a stage of one replica and one stage holding both tied ends",
          "[executor][zero]") {
  REQUIRE_CPU_COLLECTIVES();
  // Stage 0 at dp 3 (units padded to a multiple of 3), stage 1 at dp 1; the
  // tied embedding's gradient is summed over all four ranks (emb_full).
  check_plan_trains_like_one_process("dp3-zero2", plan_json({3, 1}, {{3, 1}, {1, 1}}, {0, 2, 4}, 2), "gpipe", "",
                                     "--zero 2");
  check_plan_trains_like_one_process("dp3-zero3", plan_json({3, 1}, {{3, 1}, {1, 1}}, {0, 2, 4}, 2), "1f1b", "",
                                     "--zero 3");
  // One stage, tp 2, dp 2: the embedding and the head share one weight (its own unit, used by two layers).
  check_plan_trains_like_one_process("tp2dp2-zero3", plan_json({4}, {{2, 2}}, {0, 4}, 2), "1f1b", "", "--zero 3");
}

TEST_CASE("replay of a Llama with ZeRO-3 and selective recomputation trains like one process", "[executor][zero]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("replay-llama-config-zero");
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  std::ofstream(path) << kLlamaConfig;
  check_plan_trains_like_one_process("llama-dp2tp2pp2-zero3", plan_dp2tp2pp2(), "1f1b", path,
                                     "--zero 3 --recompute selective");
}

TEST_CASE("replay reports per-rank memory fields, on the CPU the device ones null with a reason",
          "[executor][memory]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("replay-memory-fields");
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_json_file((dir / "plan.json").string(), plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 2, 4}, 2));
  const test::CommandResult r = test::run_hetplan("replay --device cpu --dtype bf16 --iters 1 --warmup 0 --zero 3 --plan " +
                                                  (dir / "plan.json").string() + " --out " + (dir / "result.json").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const ordered_json result = read_json_file((dir / "result.json").string());
  CHECK(result["zero_stage_executed"] == 3);
  REQUIRE(result["ranks"].size() == 4);
  for (const auto& rk : result["ranks"]) {
    CHECK(rk["peak_reserved_mb"].is_null());
    CHECK(rk["device_used_mb"].is_null());
    CHECK(rk["memory_note"].is_string());
    if (!rk["peak_allocated_mb"].is_null()) CHECK(rk["peak_allocated_mb"].get<double>() == rk["peak_memory_mb"].get<double>());
  }
}

TEST_CASE("ZeRO state bytes per parameter: Megatron's 18 divided as each stage shards", "[executor][zero]") {
  CHECK(ZeroOptimizer::state_bytes_per_parameter(torch::kBFloat16, 2, 4) == 2 + 16.0 / 4);
  CHECK(ZeroOptimizer::state_bytes_per_parameter(torch::kBFloat16, 3, 4) == 18.0 / 4);
  CHECK(ZeroOptimizer::state_bytes_per_parameter(torch::kBFloat16, 2, 1) == 18);
}

TEST_CASE("replay in bf16 with ZeRO-2 and ZeRO-3 (pp 2, dp 2) on the CPU: losses within bf16's resolution of fp32 training",
          "[executor][mixed][zero]") {
  REQUIRE_CPU_COLLECTIVES();
  for (const char* zero : {"2", "3"}) {
    const auto dir = test::scratch_dir(std::string("replay-bf16-zero") + zero);
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_json_file((dir / "plan.json").string(), plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 2, 4}, 2));
    const test::CommandResult r =
        test::run_hetplan(std::string("replay --device cpu --dtype bf16 --iters 2 --warmup 0 --lr 0.001 --zero ") + zero +
                          " --plan " + (dir / "plan.json").string() + " --out " + (dir / "result.json").string());
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const ordered_json result = read_json_file((dir / "result.json").string());
    CHECK(result["zero_stage_executed"] == std::atoi(zero));
    const Reference& ref = reference(2, plan_shape());
    REQUIRE(result["losses"].size() == 2);
    for (int k = 0; k < 2; ++k)
      CHECK(std::abs(result["losses"][k].get<double>() - ref.losses[k]) <= std::ldexp(1.0, -8) * ref.losses[k]);
  }
}

TEST_CASE("ZeRO-3 keeps a unit's weights only while it computes: freed after construction, gathered equal, freed again",
          "[executor][zero]") {
  const ReplayConfig c = config();
  profiler::GPT model(c.model, profiler::TensorParallelGroup());
  std::vector<std::vector<torch::Tensor>> units;
  std::vector<torch::Tensor> before;
  for (auto& l : model.layers()) {
    units.push_back(l->parameters());
    for (const auto& p : l->parameters()) before.push_back(p.detach().clone());
  }
  ZeroOptimizer opt(3, units, kLr, nullptr);
  REQUIRE(opt.num_units() == kLayers);
  auto bytes = [](const torch::Tensor& p) { return p.storage().nbytes(); };
  for (const auto& ps : units)
    for (const auto& p : ps) CHECK(bytes(p) == 0);
  opt.gather(1);
  std::size_t i = units[0].size();
  for (const auto& p : units[1]) {
    CHECK(bytes(p) > 0);
    CHECK(torch::equal(p, before[i++]));
  }
  for (const auto& p : units[2]) CHECK(bytes(p) == 0);
  opt.release(1);
  for (const auto& p : units[1]) CHECK(bytes(p) == 0);
  // One step on one process: gathered weights, loss, backward (the hooks
  // gather each block again), Adam; then every weight has moved and is freed.
  const auto [ids, targets] = global_batch(c, 0);
  opt.zero_grad();
  for (int u = 0; u < opt.num_units(); ++u) opt.gather(u);
  torch::Tensor loss = model.loss(ids, targets);
  for (int u = 0; u < opt.num_units(); ++u) opt.release(u);
  for (int u = 0; u < opt.num_units(); ++u) opt.gather(u);  // the root's units; hooks are per layer output in replay
  loss.backward();
  opt.finish_backward();
  opt.step();
  for (const auto& ps : units)
    for (const auto& p : ps) CHECK(bytes(p) == 0);
  opt.gather_all();
  i = 0;
  int64_t moved = 0;
  for (const auto& ps : units)
    for (const auto& p : ps) moved += !torch::equal(p, before[i++]);
  CHECK(moved > 0);
}

TEST_CASE("ZeRO-2/3 hold a unit's gradients until it is complete, and a second gradient of a parameter is summed in fp32",
          "[executor][zero]") {
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    torch::Tensor a = torch::ones({4}).requires_grad_(), b = torch::ones({3}).requires_grad_(),
                  c = torch::ones({2}).requires_grad_();
    ZeroOptimizer opt(stage, {{a, b, c}}, kLr, nullptr);
    auto full = [&](const torch::Tensor& p) { return opt.full_gradient(0, p); };
    // One backward reaching a, b and c: each gradient lands in its place in the unit's flat gradient.
    opt.zero_grad();
    opt.gather(0);
    (2 * a + 7 * b.sum() + 11 * c.sum()).sum().backward();
    opt.finish_backward();
    CHECK(torch::equal(full(a), torch::full({4}, 2.0f)));
    CHECK(torch::equal(full(b), torch::full({3}, 28.0f)));
    CHECK(torch::equal(full(c), torch::full({2}, 44.0f)));
    // Two backwards in one micro-batch: a's first gradient is held, its second added to it; c gets none
    // (zero), and the unit, never complete in a hook, is reduced by finish_backward.
    opt.zero_grad();
    opt.gather(0);
    (2 * a).sum().backward();
    ((3 * a).sum() + (7 * b).sum()).backward();
    opt.finish_backward();
    CHECK(torch::equal(full(a), torch::full({4}, 5.0f)));
    CHECK(torch::equal(full(b), torch::full({3}, 7.0f)));
    CHECK(torch::equal(full(c), torch::zeros({2})));
  }
}

TEST_CASE("replay's measured peak falls with each ZeRO stage: ZeRO-3 saves half the fp32 weights at dp 2",
          "[executor][zero][memory]") {
  REQUIRE_CPU_COLLECTIVES();
  // A model whose states dominate its activations (3.3M parameters, 64 tokens
  // a replica), fp32 on 2 CPU ranks; peaks from the counting CPU allocator.
  const auto dir = test::scratch_dir("replay-zero-memory");
  fs::remove_all(dir);
  fs::create_directories(dir);
  ordered_json plan = plan_json({2}, {{2, 1}}, {0, 6}, 2);
  plan["gbs"] = 4;
  plan["model"] = {{"num_layers", 6}, {"hidden_size", 256}, {"sequence_length", 16}, {"vocab_size", 512},
                   {"attention_heads", 4}};
  write_json_file((dir / "plan.json").string(), plan);
  std::vector<double> peak;
  double params = 0;
  for (int z = 0; z <= 3; ++z) {
    const std::string out = (dir / (std::string("r") + std::to_string(z) + ".json")).string();  // (GCC 12 -Wrestrict)
    const test::CommandResult r = test::run_hetplan("replay --device cpu --dtype fp32 --iters 1 --warmup 1 --zero " +
                                                    std::to_string(z) + " --plan " + (dir / "plan.json").string() +
                                                    " --out " + out);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const ordered_json result = read_json_file(out);
    if (result["ranks"][0]["peak_allocated_mb"].is_null()) {
      WARN("HETPLAN_SKIP: this LibTorch cannot count CPU allocations");
      return;
    }
    params = result["model"]["parameters"].get<double>();
    peak.push_back(result["ranks"][0]["peak_allocated_mb"].get<double>() * 1024 * 1024);
  }
  INFO("peak bytes per parameter by ZeRO stage: " << peak[0] / params << " " << peak[1] / params << " "
                                                  << peak[2] / params << " " << peak[3] / params);
  CHECK(peak[0] > peak[1]);
  CHECK(peak[1] > peak[2]);
  CHECK(peak[2] > peak[3]);
  // ZeRO-3 keeps 4 / 2 bytes of fp32 weights per parameter instead of 4; a
  // gathered unit (at most the 131k-parameter embedding) is transient.
  // (+ 64 KiB: Gloo's and autograd's small allocations vary by a few KB from run to run.)
  CHECK(std::abs((peak[2] - peak[3]) - 2 * params) <= 4 * 131072 * 2 + 65536);
}

// Sequence parallelism at tp 2 (Megatron's --sequence-parallel: activations split along the sequence
// between the layers, all-gather before the column-parallel linears, reduce-scatter after the
// row-parallel ones, norm weights' gradients summed over tp). pp 2 x tp 2 splits the model as
// [embedding, block 1 | block 2, head]: the embedding reduce-scatters into the shard, stage 0's block
// gathers its output for the pipeline send, stage 1's block scatters its input and the head gathers
// after the final norm. The 1-stage tp 2 x dp 2 plan keeps shards from the embedding to the head.
// Tolerance: the file's 1e-4 (relative, fp32): the sums over tp are the same sums in another order.
// Taken out, the reduce-scatter (each rank keeping its own partial products) or the norm weights'
// all-reduce (each rank's weights following its own tokens' gradient), training differs from one
// process by far more than that: the test fails.
TEST_CASE("replay with sequence parallelism (tp 2) trains like one process, and not without its collectives",
          "[executor][seqpar]") {
  REQUIRE_CPU_COLLECTIVES();
  ordered_json pp2 = plan_json({2, 2}, {{1, 2}, {1, 2}}, {0, 2, 4}, 2);
  pp2["sequence_parallel"] = true;
  ordered_json one = plan_json({4}, {{2, 2}}, {0, 4}, 2);
  one["sequence_parallel"] = true;
  const ordered_json result = check_plan_trains_like_one_process("sp-pp2tp2", pp2);
  CHECK(result["sequence_parallel_executed"] == true);
  check_plan_trains_like_one_process("sp-tp2dp2", one);

  const Deviation no_rs = deviation_without("sp-reduce-scatter", "sp-pp2tp2", pp2);
  const Deviation no_ln = deviation_without("sp-param-allreduce", "sp-tp2dp2", one);
  WARN("without the reduce-scatter: loss error " << no_rs.loss << ", parameter error " << no_rs.params
                                                 << "; without the norm weights' all-reduce: loss error " << no_ln.loss
                                                 << ", parameter error " << no_ln.params);
  // Ten times the equivalence tolerance: the check above would fail by a wide margin.
  CHECK(std::max(no_rs.loss, no_rs.params) > 1e-3);
  CHECK(std::max(no_ln.loss, no_ln.params) > 1e-3);
}

// Sequence parallelism on a Llama (RMSNorm without bias, SwiGLU's two column-parallel linears on one
// gathered input, RoPE on the whole sequence).
TEST_CASE("replay of a Llama with sequence parallelism (tp 2) trains like one process", "[executor][seqpar]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("replay-llama-sp");
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  std::ofstream(path) << kLlamaConfig;
  ordered_json plan = plan_json({2, 2}, {{1, 2}, {1, 2}}, {0, 2, 4}, 2);
  plan["sequence_parallel"] = true;
  check_plan_trains_like_one_process("llama-sp-pp2tp2", plan, "1f1b", path);
}

// Context parallelism at cp 2 (carved from dp 2: Megatron's dp 1): each cp rank holds chunks r and
// 3 - r of 4 of every sequence, attention all-gathers K and V over the cp group and masks causally on
// global positions, gradients are summed over dp x cp. Alone (1 stage) and over pp 2, where
// activations go between stages' ranks of equal cp index; on the GPT (learned positions) and on a
// Llama (RoPE at global positions, GQA: the gathered K/V heads expanded, their gradients summed back),
// the Llama also under selective recomputation (the attention, not the exchange, run again); and at
// cp 4 (chunks of one token: the second halves go to the ranks in reverse order, the gradients'
// reduce-scatter puts them back). Tolerance 1e-4 as above. Without the K/V exchange (each rank
// attending to its own tokens only), training differs: the test fails.
TEST_CASE("replay with context parallelism (cp 2) trains like one process, and not without the K/V exchange",
          "[executor][cp]") {
  REQUIRE_CPU_COLLECTIVES();
  ordered_json one = plan_json({2}, {{2, 1}}, {0, 4}, 2);
  one["context_parallel"] = 2;
  ordered_json pp2 = plan_json({2, 2}, {{2, 1}, {2, 1}}, {0, 2, 4}, 2);
  pp2["context_parallel"] = 2;
  const ordered_json result = check_plan_trains_like_one_process("cp2", one);
  CHECK(result["context_parallel_executed"] == 2);
  check_plan_trains_like_one_process("cp2-pp2", pp2);
  const auto dir = test::scratch_dir("replay-llama-cp");
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  std::ofstream(path) << kLlamaConfig;
  check_plan_trains_like_one_process("llama-cp2", one, "1f1b", path);
  check_plan_trains_like_one_process("llama-cp2-selective", one, "1f1b", path, "--recompute selective");
  ordered_json cp4 = plan_json({4}, {{4, 1}}, {0, 4}, 2);
  cp4["context_parallel"] = 4;
  check_plan_trains_like_one_process("cp4", cp4);

  const Deviation no_kv = deviation_without("cp-kv-exchange", "cp2", one);
  WARN("without the K/V exchange: loss error " << no_kv.loss << ", parameter error " << no_kv.params);
  CHECK(std::max(no_kv.loss, no_kv.params) > 1e-3);  // ten times the equivalence tolerance
}

TEST_CASE("pipeline layout: context parallelism's groups and samples, Megatron's order tp, cp, dp",
          "[executor][cp][grid]") {
  // Two stages of dp 4 x tp 2 with cp 2: Megatron's dp 2; ranks 0-7 and 8-15.
  ordered_json plan = plan_json({8, 8}, {{4, 2}, {4, 2}}, {0, 2, 4}, 2);
  plan["context_parallel"] = 2;
  const PipelineLayout layout(plan_file_from_json(plan, "plan"), {}, nullptr);
  REQUIRE(layout.context_parallel() == 2);
  // Rank 3: replica 1 (Megatron replica 0, cp index 1), tp index 1: cp group {1, 3}, dp x cp group {1, 3, 5, 7}.
  const GroupSeat cp = layout.cp_seat(3);
  CHECK(cp.name == "cp.0.0.1");
  CHECK(cp.position == 1);
  CHECK(cp.size == 2);
  CHECK(layout.cp_seat(1).name == "cp.0.0.1");
  CHECK(layout.cp_seat(1).position == 0);
  CHECK(layout.cp_seat(5).name == "cp.0.1.1");
  CHECK(layout.dp_seat(3).size == 4);
  // Micro-batch 4 over Megatron's dp 2: both cp ranks of a replica take the same samples.
  const StageLayout& s0 = layout.stage(0);
  REQUIRE(s0.replica_samples.size() == 4);
  CHECK(s0.replica_samples[0].begin == 0);
  CHECK(s0.replica_samples[1].begin == 0);
  CHECK(s0.replica_samples[1].end == 2);
  CHECK(s0.replica_samples[2].begin == 2);
  // Activations go between ranks of equal cp index only: 8 receivers, one piece each.
  const auto& fwd = layout.forward_transfers(0);
  REQUIRE(fwd.size() == 8);
  for (const Transfer& x : fwd) CHECK(s0.replica(x.src) % 2 == layout.stage(1).replica(x.dst) % 2);
  CHECK(layout.backward_transfers(0).size() == 8);
  // cp must divide every stage's dp.
  ordered_json bad = plan_json({2, 1}, {{2, 1}, {1, 1}}, {0, 2, 4}, 2);
  bad["context_parallel"] = 2;
  CHECK_THROWS_AS(PipelineLayout(plan_file_from_json(bad, "plan"), {}, nullptr), InputError);
}

// Both at once with the sharded optimizers: tp 2 with sequence parallelism inside cp 2 (4 ranks, Megatron's
// dp 1), under ZeRO-3 (norm weights gathered per layer, their gradients all-reduced over tp, then
// reduce-scattered over dp x cp) and ZeRO-2 with overlapped reduce-scatters.
TEST_CASE("replay with sequence and context parallelism together, under ZeRO-2 and ZeRO-3, trains like one process",
          "[executor][seqpar][cp][zero]") {
  REQUIRE_CPU_COLLECTIVES();
  ordered_json plan = plan_json({4}, {{2, 2}}, {0, 4}, 2);
  plan["sequence_parallel"] = true;
  plan["context_parallel"] = 2;
  check_plan_trains_like_one_process("sp-cp2-zero3", plan, "1f1b", "", "--zero 3");
  check_plan_trains_like_one_process("sp-cp2-zero2-overlap", plan, "1f1b", "", "--zero 2 --overlap-grad-reduce");
}
