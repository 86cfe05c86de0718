// `hetplan export`: every Megatron-LM flag, DeepSpeed key and torchrun flag
// the exporter emits is one of the names listed here with the parser's file
// and commit where it was read, and together the exports below emit all of
// them; known plans export to exact values; plans a framework cannot run end
// in one line naming the stage; torchrun scripts place the plan's ranks on
// the hostfile's hosts.

#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "planner/export_plan.h"
#include "sim/cluster.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/parallel_layout.h"
#include "sim/rank_layout.h"
#include "tests/fixtures.h"

namespace fs = std::filesystem;
using namespace hetplan;

namespace {

constexpr const char* kMg = "d98e8a64ddf34856e74b24714e3bedb2f5a39553";  // NVIDIA/Megatron-LM
constexpr const char* kDs = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641";  // deepspeedai/DeepSpeed
constexpr const char* kPt = "010929fd3f401c3868310396e6a91ed95aa0305b";  // pytorch/pytorch

// name -> file (in the commit above) where the parser defines it. Megatron's
// flags come either from add_argument() in arguments.py or from dataclass
// fields that ArgumentGroupFactory turns into "--field-name" (or the
// field's argparse_meta arg_names), which arguments.py builds for
// TransformerConfig (less its exclude list), TrainingConfig, TokenizerConfig
// and DistributedInitConfig.
const std::map<std::string, std::string> kMegatronFlags = {
    {"--tensor-model-parallel-size", "megatron/core/model_parallel_config.py"},
    {"--pipeline-model-parallel-size", "megatron/core/model_parallel_config.py"},
    {"--sequence-parallel", "megatron/core/model_parallel_config.py"},
    {"--context-parallel-size", "megatron/core/model_parallel_config.py"},
    {"--overlap-grad-reduce", "megatron/training/arguments.py"},
    {"--overlap-param-gather", "megatron/training/arguments.py"},
    {"--ddp-bucket-size", "megatron/training/arguments.py"},
    {"--bf16", "megatron/core/model_parallel_config.py"},
    {"--fp16", "megatron/core/model_parallel_config.py"},
    {"--initial-loss-scale", "megatron/training/arguments.py"},
    {"--min-loss-scale", "megatron/training/arguments.py"},
    {"--loss-scale-window", "megatron/training/arguments.py"},
    {"--hysteresis", "megatron/training/arguments.py"},
    {"--ckpt-format", "megatron/training/arguments.py"},
    {"--use-rope-scaling", "megatron/training/arguments.py"},
    {"--rope-scaling-factor", "megatron/training/arguments.py"},
    {"--micro-batch-size", "megatron/training/config/training_config.py"},
    {"--global-batch-size", "megatron/training/config/training_config.py"},
    {"--vocab-size", "megatron/training/config/training_config.py"},
    {"--use-megatron-fsdp", "megatron/training/config/common_config.py"},
    {"--num-layers", "megatron/core/transformer/transformer_config.py"},
    {"--hidden-size", "megatron/core/transformer/transformer_config.py"},
    {"--ffn-hidden-size", "megatron/core/transformer/transformer_config.py"},
    {"--num-attention-heads", "megatron/core/transformer/transformer_config.py"},
    {"--num-query-groups", "megatron/core/transformer/transformer_config.py"},
    {"--kv-channels", "megatron/core/transformer/transformer_config.py"},
    {"--normalization", "megatron/core/transformer/transformer_config.py"},
    {"--norm-epsilon", "megatron/core/transformer/transformer_config.py"},
    {"--disable-bias-linear", "megatron/core/transformer/transformer_config.py"},
    {"--add-qkv-bias", "megatron/core/transformer/transformer_config.py"},
    {"--hidden-dropout", "megatron/core/transformer/transformer_config.py"},
    {"--attention-dropout", "megatron/core/transformer/transformer_config.py"},
    {"--recompute-granularity", "megatron/core/transformer/transformer_config.py"},
    {"--recompute-method", "megatron/core/transformer/transformer_config.py"},
    {"--recompute-num-layers", "megatron/core/transformer/transformer_config.py"},
    {"--recompute-modules", "megatron/core/transformer/transformer_config.py"},
    {"--group-query-attention", "megatron/training/arguments.py"},
    {"--seq-length", "megatron/training/arguments.py"},
    {"--max-position-embeddings", "megatron/training/arguments.py"},
    {"--position-embedding-type", "megatron/training/arguments.py"},
    {"--rotary-base", "megatron/training/arguments.py"},
    {"--swiglu", "megatron/training/arguments.py"},
    {"--untie-embeddings-and-output-weights", "megatron/training/arguments.py"},
    {"--decoder-first-pipeline-num-layers", "megatron/training/arguments.py"},
    {"--decoder-last-pipeline-num-layers", "megatron/training/arguments.py"},
    {"--pipeline-model-parallel-layout", "megatron/training/arguments.py"},
    {"--num-virtual-stages-per-pipeline-rank", "megatron/training/arguments.py"},
    {"--use-distributed-optimizer", "megatron/training/arguments.py"},
    {"--data-parallel-sharding-strategy", "megatron/training/arguments.py"},
};

// DeepSpeed: top-level keys are constants.py's string constants; zero_optimization's
// keys are DeepSpeedZeroConfig's fields or aliases; offload device is
// DeepSpeedZeroOffload{Param,Optimizer}Config.device; activation_checkpointing's
// are the ACT_CHKPT_* constants; pipeline's are get_pipeline_config()'s defaults.
const std::map<std::string, std::string> kDeepSpeedKeys = {
    {"train_batch_size", "deepspeed/runtime/constants.py"},
    {"train_micro_batch_size_per_gpu", "deepspeed/runtime/constants.py"},
    {"gradient_accumulation_steps", "deepspeed/runtime/constants.py"},
    {"bf16", "deepspeed/runtime/constants.py"},
    {"bf16.enabled", "deepspeed/runtime/constants.py"},
    {"fp16", "deepspeed/runtime/constants.py"},
    {"fp16.enabled", "deepspeed/runtime/constants.py"},
    {"fp16.loss_scale", "deepspeed/runtime/constants.py"},
    {"fp16.initial_scale_power", "deepspeed/runtime/constants.py"},
    {"fp16.loss_scale_window", "deepspeed/runtime/constants.py"},
    {"fp16.hysteresis", "deepspeed/runtime/constants.py"},
    {"fp16.min_loss_scale", "deepspeed/runtime/constants.py"},
    {"zero_optimization", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.stage", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.overlap_comm", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.contiguous_gradients", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.reduce_bucket_size", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.allgather_bucket_size", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.stage3_prefetch_bucket_size", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.stage3_param_persistence_threshold", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.offload_optimizer", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.offload_optimizer.device", "deepspeed/runtime/zero/offload_config.py"},
    {"zero_optimization.offload_param", "deepspeed/runtime/zero/config.py"},
    {"zero_optimization.offload_param.device", "deepspeed/runtime/zero/offload_config.py"},
    {"activation_checkpointing", "deepspeed/runtime/activation_checkpointing/config.py"},
    {"activation_checkpointing.partition_activations", "deepspeed/runtime/activation_checkpointing/config.py"},
    {"activation_checkpointing.contiguous_memory_optimization", "deepspeed/runtime/activation_checkpointing/config.py"},
    {"activation_checkpointing.cpu_checkpointing", "deepspeed/runtime/activation_checkpointing/config.py"},
    {"activation_checkpointing.number_checkpoints", "deepspeed/runtime/activation_checkpointing/config.py"},
    {"pipeline", "deepspeed/runtime/config.py"},
    {"pipeline.stages", "deepspeed/runtime/config.py"},
    {"pipeline.activation_checkpoint_interval", "deepspeed/runtime/config.py"},
};

// torchrun: torch/distributed/run.py's get_args_parser().
const std::set<std::string> kTorchrunFlags = {"--nnodes",        "--node-rank",     "--nproc-per-node",
                                              "--rdzv-backend",  "--rdzv-endpoint", "--rdzv-id",
                                              "--max-restarts",  "--no-python"};

// Llama-3.1's rope_scaling, as its config.json has it.
const ordered_json kLlama31RopeScaling = {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                          {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}};

std::string hf(const std::string& name) { return std::string(HETPLAN_SOURCE_DIR) + "/tests/data/hf/" + name; }

// A plan of `layers` Metis layers (blocks + 2) over stages with the given sizes.
// The repository's clusterfile (0.0.0.4 A100, 0.0.0.1 V100): these tests need no outside data.
const std::string kRepoClusterfile = std::string(HETPLAN_SOURCE_DIR) + "/hostfiles/clusterfile.json";

PlanFile plan(int metis_layers, int hidden, std::vector<int> groups, std::vector<std::pair<int, int>> st,
              std::vector<int> lp, int batches, int gbs, int zero = -1, const std::string& recompute = "",
              std::vector<std::string> types = {"H200"}) {
  ordered_json s = ordered_json::array();
  for (auto [dp, tp] : st) s.push_back({dp, tp});
  ordered_json j = {{"node_sequence", types}, {"device_groups", groups}, {"strategies", s}, {"batches", batches},
                    {"layer_partition", lp},  {"gbs", gbs},
                    {"model", {{"num_layers", metis_layers}, {"hidden_size", hidden}, {"sequence_length", 4096},
                               {"vocab_size", 128256}, {"attention_heads", 32}}}};
  if (zero >= 0) j["zero_stage"] = zero;
  if (!recompute.empty()) j["recompute"] = recompute;
  return plan_file_from_json(j, "plan.json");
}

using Args = std::vector<std::pair<std::string, std::string>>;

void collect_keys(const ordered_json& j, const std::string& prefix, std::set<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    out.insert(key);
    if (it.value().is_object()) collect_keys(it.value(), key, out);
  }
}

}  // namespace

TEST_CASE("export: the flag and key names, with the parser's file and commit they come from", "[export]") {
  std::map<std::string, std::string> mg, dsk;
  for (const auto& n : megatron_flag_sources()) {
    CHECK(n.repo == "NVIDIA/Megatron-LM");
    CHECK(n.commit == kMg);
    mg[n.name] = n.file;
  }
  for (const auto& n : deepspeed_key_sources()) {
    CHECK(n.repo == "deepspeedai/DeepSpeed");
    CHECK(n.commit == kDs);
    dsk[n.name] = n.file;
  }
  std::set<std::string> tr;
  for (const auto& n : torchrun_flag_sources()) {
    CHECK(n.repo == "pytorch/pytorch");
    CHECK(n.commit == kPt);
    CHECK(n.file == "torch/distributed/run.py");
    tr.insert(n.name);
  }
  CHECK(mg == kMegatronFlags);
  CHECK(dsk == kDeepSpeedKeys);
  CHECK(tr == kTorchrunFlags);

  // The exports below emit exactly these names, no others.
  const ModelShape llama = read_hf_config(hf("llama-3.1-8b.json"));
  ModelShape gpt = shape_from_model_config(plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 8, 64).model);
  ModelShape odd = llama;  // a head dimension other than hidden / heads, and a q/k/v bias only
  odd.head_dim = 96;
  odd.attention_bias = true;
  std::set<std::string> emitted;
  auto megatron = [&](const PlanFile& p, const ModelShape& m) {
    for (const auto& [flag, value] : export_megatron(p, m, nullptr, "plan.json").args) emitted.insert(flag);
  };
  megatron(plan(34, 4096, {4, 4}, {{2, 2}, {2, 2}}, {0, 15, 34}, 8, 64, 1, "full"), gpt);        // first/last, tp
  megatron(plan(34, 4096, {2, 2, 2, 2}, {{2, 1}, {2, 1}, {2, 1}, {2, 1}}, {0, 7, 16, 26, 34}, 8, 64, 3, "selective"),
           llama);                                                                              // layout, ZeRO-3
  megatron(plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 8, 64, 2), odd);
  PlanFile scaled = plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 8, 64, -1, "", {"V100"});  // fp16, rope scaling
  scaled.rope_scaling = kLlama31RopeScaling;
  megatron(scaled, llama);
  PlanFile cp = plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 8, 64, 1);  // context parallelism, overlap, buckets
  cp.context_parallel = 2;
  cp.overlap.grad_reduce = cp.overlap.param_gather = true;
  cp.overlap.grad_bucket_params = 5e7;
  megatron(cp, llama);
  PlanFile interleaved = plan(34, 4096, {4, 4}, {{2, 2}, {2, 2}}, {0, 17, 34}, 8, 64);  // 8 blocks per chunk
  interleaved.schedule = "interleaved";
  interleaved.virtual_stages = 2;
  megatron(interleaved, gpt);
  std::set<std::string> want;
  for (const auto& [k, v] : kMegatronFlags) want.insert(k);
  CHECK(emitted == want);

  std::set<std::string> keys;
  collect_keys(export_deepspeed(plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 4, 64, 3, "full"), llama, nullptr, "p").config, "",
               keys);
  collect_keys(export_deepspeed(plan(34, 4096, {4, 4}, {{4, 1}, {4, 1}}, {0, 17, 34}, 4, 64, 1), llama, nullptr, "p").config,
               "", keys);
  collect_keys(export_deepspeed(plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 4, 64, 1, "", {"V100"}), llama, nullptr, "p").config,
               "", keys);
  std::set<std::string> want_keys;
  for (const auto& [k, v] : kDeepSpeedKeys) want_keys.insert(k);
  CHECK(keys == want_keys);
}

TEST_CASE("export --to megatron: a uniform Llama plan, exact arguments", "[export]") {
  // Llama-3.1-8B on 16 GPUs: 2 stages of (dp 4, tp 2), an uneven 15/17 split, ZeRO-1, full recomputation.
  const PlanFile p = plan(34, 4096, {8, 8}, {{4, 2}, {4, 2}}, {0, 16, 34}, 16, 256, 1, "full");
  const MegatronArgs m = export_megatron(p, read_hf_config(hf("llama-3.1-8b.json")), nullptr, "plan.json");
  CHECK(m.world_size == 16);
  const Args want = {{"--tensor-model-parallel-size", "2"},
                     {"--pipeline-model-parallel-size", "2"},
                     {"--sequence-parallel", ""},
                     {"--micro-batch-size", "4"},  // 256 / 16 micro-batches / dp 4
                     {"--global-batch-size", "256"},
                     {"--num-layers", "32"},
                     {"--decoder-first-pipeline-num-layers", "15"},  // Metis layers 1..15 (0 is the embedding)
                     {"--decoder-last-pipeline-num-layers", "17"},
                     {"--hidden-size", "4096"},
                     {"--ffn-hidden-size", "14336"},
                     {"--num-attention-heads", "32"},
                     {"--group-query-attention", ""},
                     {"--num-query-groups", "8"},
                     {"--seq-length", "4096"},
                     {"--max-position-embeddings", "131072"},
                     {"--vocab-size", "128256"},
                     {"--position-embedding-type", "rope"},
                     {"--rotary-base", "500000"},
                     {"--normalization", "RMSNorm"},
                     {"--norm-epsilon", "1e-05"},
                     {"--swiglu", ""},
                     {"--disable-bias-linear", ""},
                     {"--untie-embeddings-and-output-weights", ""},
                     {"--attention-dropout", "0"},
                     {"--hidden-dropout", "0"},
                     {"--bf16", ""},
                     {"--use-distributed-optimizer", ""},
                     {"--recompute-granularity", "full"},
                     {"--recompute-method", "uniform"},
                     {"--recompute-num-layers", "1"}};
  CHECK(m.args == want);
  // Uneven middle stages: Megatron's layout string (E: embedding, t: block, L: loss).
  const MegatronArgs l = export_megatron(plan(34, 4096, {2, 2, 2, 2}, {{2, 1}, {2, 1}, {2, 1}, {2, 1}},
                                              {0, 7, 16, 26, 34}, 8, 64),
                                         read_hf_config(hf("llama-3.1-8b.json")), nullptr, "plan.json");
  CHECK(std::count(l.args.begin(), l.args.end(),
                   std::make_pair(std::string("--pipeline-model-parallel-layout"), std::string("Et*6|t*9|t*10|t*7L"))) == 1);
  CHECK(megatron_args_text(l, "").find("  --pipeline-model-parallel-layout 'Et*6|t*9|t*10|t*7L'\n") != std::string::npos);
}

TEST_CASE("export --to deepspeed: a ZeRO-3 plan, exact config", "[export]") {
  const PlanFile p = plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 4, 64, 3, "full");
  const DeepSpeedConfig d = export_deepspeed(p, read_hf_config(hf("llama-3.1-8b.json")), nullptr, "plan.json");
  const ordered_json want = ordered_json::parse(R"({
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
      "reduce_bucket_size": 16777216, "stage3_prefetch_bucket_size": 15099494,
      "stage3_param_persistence_threshold": 40960, "offload_param": {"device": "none"},
      "offload_optimizer": {"device": "none"}},
    "activation_checkpointing": {"partition_activations": false, "contiguous_memory_optimization": false,
      "cpu_checkpointing": false, "number_checkpoints": 32}})");
  CHECK(d.config == want);
  // DeepSpeed's pipeline engine takes ZeRO 0 or 1 only.
  CHECK_THROWS_WITH(export_deepspeed(plan(34, 4096, {4, 4}, {{4, 1}, {4, 1}}, {0, 17, 34}, 4, 64, 3),
                                     read_hf_config(hf("llama-3.1-8b.json")), nullptr, "plan.json"),
                    Catch::Contains("DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only"));
}

TEST_CASE("export: plans Megatron cannot run end in one line naming the stage and pointing to torchrun", "[export]") {
  const ModelShape llama = read_hf_config(hf("llama-3.1-8b.json"));
  CHECK_THROWS_WITH(export_megatron(plan(34, 4096, {8, 4}, {{4, 2}, {4, 1}}, {0, 16, 34}, 16, 256), llama, nullptr,
                                    "plan.json"),
                    "plan.json: stage 1 runs dp 4, tp 1 but stage 0 runs dp 4, tp 2: Megatron-LM needs the same (dp, tp) "
                    "in every stage; `hetplan export --to torchrun` runs it with hetplan replay");
  CHECK_THROWS_WITH(export_megatron(plan(34, 4096, {6}, {{6, 1}}, {0, 34}, 4, 64), llama, nullptr, "plan.json"),
                    Catch::Contains("does not split evenly over dp 6"));
}

TEST_CASE("export: a plan over two GPU types with the same (dp, tp) in every stage runs with an uneven split",
          "[export]") {
  const ModelShape llama = read_hf_config(hf("llama-3.1-8b.json"));
  const auto dir = test::scratch_dir("export-types");
  std::ofstream((dir / "hostfile").string()) << "0.0.0.4 slots=4\n0.0.0.1 slots=4\n";
  const Cluster c = Cluster::load((dir / "hostfile").string(), kRepoClusterfile);
  const RankLayout rl(c, {c.type_index("A100"), c.type_index("V100")});
  const ParallelLayout pl(c, rl);
  const PlanFile p = plan(34, 4096, {4, 4}, {{4, 1}, {4, 1}}, {0, 20, 34}, 8, 64, -1, "", {"A100", "V100"});
  const MegatronArgs m = export_megatron(p, llama, &pl, "plan.json");
  CHECK(m.world_size == 8);
  const auto has = [&](const std::string& flag, const std::string& value) {
    return std::count(m.args.begin(), m.args.end(), std::make_pair(flag, value)) == 1;
  };
  CHECK(has("--decoder-first-pipeline-num-layers", "19"));
  CHECK(has("--decoder-last-pipeline-num-layers", "13"));
  // V100 has no bf16: fp16 with dynamic loss scaling, and a note saying why.
  CHECK(has("--fp16", ""));
  CHECK(has("--initial-loss-scale", "65536"));
  CHECK(!has("--bf16", ""));
  CHECK(std::any_of(m.notes.begin(), m.notes.end(),
                    [](const std::string& n) { return n.rfind("V100 has no bf16", 0) == 0; }));
  // tp 1: no CUDA_DEVICE_MAX_CONNECTIONS; the launcher runs one process per GPU on each of the two hosts.
  CHECK(m.env.empty());
  CHECK(m.launcher == "torchrun --nnodes 2 --node-rank \"${NODE_RANK:-0}\" --nproc-per-node 4 --master-addr "
                      "\"${MASTER_ADDR:-0.0.0.4}\" --master-port \"${MASTER_PORT:-6000}\" pretrain_gpt.py "
                      "\"${MEGATRON_ARGS[@]}\" \"$@\"");
  const DeepSpeedConfig d = export_deepspeed(p, llama, &pl, "plan.json");
  CHECK(d.config["fp16"] == ordered_json::parse(R"({"enabled": true, "loss_scale": 0, "initial_scale_power": 16,
                                                    "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1})"));
  CHECK(!d.config.contains("bf16"));
}

TEST_CASE("export --to torchrun: one script per node, the plan's ranks on the hostfile's GPUs", "[export][cli]") {
  const auto dir = test::scratch_dir("export-torchrun");
  fs::remove_all(dir / "out");
  // 8 A100 on 0.0.0.4 (two hostfile lines), 4 V100 on 0.0.0.1: stages 0 and 1 (dp 2, tp 2) on the A100s,
  // stage 2 (dp 4) on the V100s.
  std::ofstream((dir / "hostfile").string()) << "0.0.0.4 slots=4\n0.0.0.4 slots=4\n0.0.0.1 slots=4\n";
  ordered_json j = {{"node_sequence", {"A100", "V100"}}, {"device_groups", {4, 4, 4}},
                    {"strategies", {{2, 2}, {2, 2}, {4, 1}}}, {"batches", 4}, {"layer_partition", {0, 4, 8, 10}},
                    {"gbs", 32},  {"hostfile", (dir / "hostfile").string()},
                    {"clusterfile", kRepoClusterfile},
                    {"model", {{"num_layers", 10}, {"hidden_size", 1024}, {"sequence_length", 1024},
                               {"vocab_size", 50257}, {"attention_heads", 16}}}};
  write_json_file((dir / "plan.json").string(), j);
  fs::create_directories(dir / "profiles");
  const test::CommandResult r = test::run_hetplan("export --plan " + (dir / "plan.json").string() +
                                                  " --to torchrun --master 10.9.8.7:1234 --profile-dir " +
                                                  (dir / "profiles").string() + " --out " + (dir / "out").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // The two 0.0.0.4 lines are two nodes.
  CHECK(r.output.find("launch_0_0.0.0.4.sh: host 0.0.0.4, node 0, 4 rank(s)") != std::string::npos);
  CHECK(r.output.find("launch_1_0.0.0.4.sh: host 0.0.0.4, node 1, 4 rank(s)") != std::string::npos);
  CHECK(r.output.find("launch_2_0.0.0.1.sh: host 0.0.0.1, node 2, 4 rank(s)") != std::string::npos);
  CHECK(r.output.find("rendezvous at 10.9.8.7:1234\n") != std::string::npos);
  std::ifstream f((dir / "out" / "launch_2_0.0.0.1.sh").string());
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(s.find("export HETPLAN_HOST=0.0.0.1 HETPLAN_NODE=2\n") != std::string::npos);
  CHECK(s.find("--nnodes 3 --node-rank 2 --nproc-per-node 4") != std::string::npos);
  CHECK(s.find("--rdzv-backend c10d --rdzv-endpoint 10.9.8.7:1234") != std::string::npos);
  CHECK(s.find("#   local rank 3: rank 11, stage 2 (dp 4, tp 1), replica 3, tp index 0, V100\n") != std::string::npos);
  // Every path relative to the script's folder: the checkout may sit elsewhere on each node.
  CHECK(s.find("--profile-dir \"$HERE/\"../profiles") != std::string::npos);
  CHECK(s.find("/tmp") == std::string::npos);
  std::ifstream f1((dir / "out" / "launch_1_0.0.0.4.sh").string());
  const std::string s1((std::istreambuf_iterator<char>(f1)), std::istreambuf_iterator<char>());
  CHECK(s1.find("HETPLAN_NODE=1\n") != std::string::npos);
  CHECK(s1.find("#   local rank 0: rank 4, stage 1 (dp 2, tp 2), replica 0, tp index 0, A100\n") != std::string::npos);
  // --master must be HOST:PORT.
  const test::CommandResult bad = test::run_hetplan("export --plan " + (dir / "plan.json").string() +
                                                    " --to torchrun --master 10.9.8.7 --out " + (dir / "out3").string());
  CHECK(bad.exit_code == 2);
  CHECK(bad.output == "hetplan: error: --master: '10.9.8.7': expected HOST:PORT (a port from 1 to 65535)\n");
  // Only torchrun's flags (the hetplan replay flags follow --no-python).
  const std::string launch = s.substr(s.find("exec "), s.find("--no-python") + 11 - s.find("exec "));
  std::set<std::string> flags;
  for (std::size_t at = launch.find("--"); at != std::string::npos; at = launch.find("--", at + 2))
    flags.insert(launch.substr(at, launch.find_first_of(" \n", at) - at));
  CHECK(flags == kTorchrunFlags);
  CHECK(fs::exists(dir / "out" / "plan.json"));
  CHECK(fs::exists(dir / "out" / "hostfile"));

  // Megatron refuses the plan in one line (exit 2).
  const test::CommandResult m = test::run_hetplan("export --plan " + (dir / "plan.json").string() + " --to megatron");
  CHECK(m.exit_code == 2);
  CHECK(m.output ==
        "hetplan: error: " + (dir / "plan.json").string() +
            ": stage 2 runs dp 4, tp 1 but stage 0 runs dp 2, tp 2: Megatron-LM needs the same (dp, tp) in every "
            "stage; `hetplan export --to torchrun` runs it with hetplan replay\n");
  // A tp group across hosts is refused.
  std::ofstream((dir / "hostfile2").string()) << "10.0.0.1 slots=2\n10.0.0.2 slots=2\n";
  write_json_file((dir / "clusterfile2.json").string(),
                  {{"10.0.0.1", {{"instance_type", "A100"}, {"inter_bandwidth", 25}, {"intra_bandwidth", 300}, {"memory", 80}}},
                   {"10.0.0.2", {{"instance_type", "A100"}, {"inter_bandwidth", 25}, {"intra_bandwidth", 300}, {"memory", 80}}}});
  ordered_json k = j;
  k["node_sequence"] = {"A100"};
  k["device_groups"] = {4};
  k["strategies"] = {{1, 4}};
  k["layer_partition"] = {0, 10};
  k["hostfile"] = (dir / "hostfile2").string();
  k["clusterfile"] = (dir / "clusterfile2.json").string();
  write_json_file((dir / "plan2.json").string(), k);
  const test::CommandResult t = test::run_hetplan("export --plan " + (dir / "plan2.json").string() +
                                                  " --to torchrun --out " + (dir / "out2").string());
  CHECK(t.exit_code == 2);
  CHECK(t.output == "hetplan: error: " + (dir / "plan2.json").string() +
                        ": stage 0 replica 0: its tp group spans hosts 10.0.0.1 (rank 0) and 10.0.0.2 (rank 2); tensor "
                        "parallelism must stay inside a host\n");
}

TEST_CASE("export --to megatron: what validate_args needs (FSDP checkpoints, one device connection, rope scaling)",
          "[export]") {
  const ModelShape llama = read_hf_config(hf("llama-3.1-8b.json"));
  const auto has = [](const MegatronArgs& m, const std::string& flag, const std::string& value) {
    return std::count(m.args.begin(), m.args.end(), std::make_pair(flag, value)) == 1;
  };
  // tp 2 without FSDP: CUDA_DEVICE_MAX_CONNECTIONS=1, exported before the arguments.
  const MegatronArgs tp = export_megatron(plan(34, 4096, {8}, {{4, 2}}, {0, 34}, 8, 64, 1), llama, nullptr, "p");
  CHECK(tp.env == Args{{"CUDA_DEVICE_MAX_CONNECTIONS", "1"}});
  const std::string text = megatron_args_text(tp, "# header\n");
  CHECK(text.find("# header\n") == 0);
  CHECK(text.find("export CUDA_DEVICE_MAX_CONNECTIONS=1\nMEGATRON_ARGS=(\n") != std::string::npos);
  CHECK(text.find(")\n# On every node (NODE_RANK 0, 1, ...; MASTER_ADDR:MASTER_PORT the rendezvous):\ntorchrun --nnodes 1 "
                  "--node-rank \"${NODE_RANK:-0}\" --nproc-per-node 8 --master-addr \"${MASTER_ADDR:-localhost}\" "
                  "--master-port \"${MASTER_PORT:-6000}\" pretrain_gpt.py \"${MEGATRON_ARGS[@]}\" \"$@\"\n") !=
        std::string::npos);
  CHECK(!has(tp, "--ckpt-format", "fsdp_dtensor"));
  // ZeRO-3 (Megatron-FSDP): DTensor checkpoints, and no CUDA_DEVICE_MAX_CONNECTIONS even at tp 2.
  const MegatronArgs fsdp = export_megatron(plan(34, 4096, {8}, {{4, 2}}, {0, 34}, 8, 64, 3), llama, nullptr, "p");
  CHECK(has(fsdp, "--use-megatron-fsdp", ""));
  CHECK(has(fsdp, "--ckpt-format", "fsdp_dtensor"));
  CHECK(fsdp.env.empty());
  // Llama-3.1's rope_scaling: Megatron's llama3 scaling with its factor, right after the rotary base.
  PlanFile scaled = plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 8, 64);
  scaled.rope_scaling = kLlama31RopeScaling;
  const MegatronArgs r = export_megatron(scaled, llama, nullptr, "p");
  const auto at = std::find(r.args.begin(), r.args.end(), std::make_pair(std::string("--rotary-base"), std::string("500000")));
  REQUIRE(r.args.end() - at > 2);
  CHECK(at[1] == std::make_pair(std::string("--use-rope-scaling"), std::string("")));
  CHECK(at[2] == std::make_pair(std::string("--rope-scaling-factor"), std::string("8")));
  CHECK(has(r, "--bf16", ""));
  // A scheme Megatron has no flag for is a note, not a flag.
  scaled.rope_scaling = {{"type", "yarn"}, {"factor", 4.0}};
  const MegatronArgs y = export_megatron(scaled, llama, nullptr, "p");
  CHECK(!has(y, "--use-rope-scaling", ""));
  CHECK(std::any_of(y.notes.begin(), y.notes.end(),
                    [](const std::string& n) { return n.find("has no Megatron-LM flag here") != std::string::npos; }));
}

TEST_CASE("export --to deepspeed: the plan's offload devices", "[export]") {
  const ModelShape llama = read_hf_config(hf("llama-3.1-8b.json"));
  PlanFile p = plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 4, 64, 3);
  p.offload_optimizer = true;
  p.offload_params = true;
  const ordered_json z = export_deepspeed(p, llama, nullptr, "p").config["zero_optimization"];
  CHECK(z["offload_optimizer"] == ordered_json{{"device", "cpu"}});
  CHECK(z["offload_param"] == ordered_json{{"device", "cpu"}});
  p.offload_params = false;
  const ordered_json o = export_deepspeed(p, llama, nullptr, "p").config["zero_optimization"];
  CHECK(o["offload_optimizer"] == ordered_json{{"device", "cpu"}});
  CHECK(o["offload_param"] == ordered_json{{"device", "none"}});
}

TEST_CASE("export: context parallelism, sequence parallelism and overlapped communication", "[export][seqpar]") {
  const ModelShape llama = read_hf_config(hf("llama-3.1-8b.json"));
  // 8 GPUs of dp 4 x tp 2 at cp 2: Megatron's dp is 2, each dp group takes 64 / 8 / 2 = 4 sequences.
  PlanFile p = plan(34, 4096, {8}, {{4, 2}}, {0, 34}, 8, 64, 1);
  p.sequence_parallel = true;
  p.context_parallel = 2;
  p.overlap.grad_reduce = p.overlap.param_gather = true;
  p.overlap.grad_bucket_params = 5e7;
  const MegatronArgs m = export_megatron(p, llama, nullptr, "plan.json");
  auto value = [&](const std::string& flag) -> std::string {
    for (const auto& [f, v] : m.args)
      if (f == flag) return v.empty() ? "(set)" : v;
    return "(absent)";
  };
  CHECK(m.world_size == 8);
  CHECK(value("--sequence-parallel") == "(set)");
  CHECK(value("--context-parallel-size") == "2");
  CHECK(value("--micro-batch-size") == "4");
  CHECK(value("--overlap-grad-reduce") == "(set)");
  CHECK(value("--overlap-param-gather") == "(set)");
  CHECK(value("--ddp-bucket-size") == "50000000");
  CHECK(value("--use-distributed-optimizer") == "(set)");
  // Without ZeRO there is nothing to gather: only the reduction overlaps.
  PlanFile z0 = p;
  z0.zero_stage = 0;
  z0.context_parallel = 1;
  const MegatronArgs m0 = export_megatron(z0, llama, nullptr, "plan.json");
  CHECK(std::count_if(m0.args.begin(), m0.args.end(), [](const auto& a) { return a.first == "--overlap-param-gather"; }) == 0);
  CHECK(std::count_if(m0.args.begin(), m0.args.end(), [](const auto& a) { return a.first == "--overlap-grad-reduce"; }) == 1);
  CHECK(std::count_if(m0.args.begin(), m0.args.end(), [](const auto& a) { return a.first == "--context-parallel-size"; }) == 0);
  // cp must divide dp, and 2 cp the sequence.
  PlanFile bad = p;
  bad.context_parallel = 3;
  CHECK_THROWS_WITH(export_megatron(bad, llama, nullptr, "plan.json"),
                    Catch::Contains("context_parallel 3 does not divide a stage's dp 4"));
  // DeepSpeed: overlap_comm and the bucket sizes as costed; no ring attention.
  PlanFile ds = plan(34, 4096, {8}, {{8, 1}}, {0, 34}, 4, 64, 2);
  ds.overlap.grad_reduce = true;
  ds.overlap.grad_bucket_params = 5e7;
  ds.overlap_recorded = true;
  const ordered_json z = export_deepspeed(ds, llama, nullptr, "p").config["zero_optimization"];
  CHECK(z["overlap_comm"] == true);
  CHECK(z["reduce_bucket_size"] == 50000000);
  CHECK(z["allgather_bucket_size"] == 50000000);
  ds.overlap = CommOverlap{};
  CHECK(export_deepspeed(ds, llama, nullptr, "p").config["zero_optimization"]["overlap_comm"] == false);
  CHECK_THROWS_WITH(export_deepspeed(p, llama, nullptr, "p"), Catch::Contains("DeepSpeed's config has no ring attention"));
}

// Interleaved 1F1B: Megatron's virtual pipeline. Each stage's layers split into v chunks in virtual-stage
// order: every chunk the same blocks is Megatron's own even split (--num-virtual-stages-per-pipeline-rank);
// otherwise the layout of pp * v segments, segment chunk * pp + rank (Megatron's
// PipelineParallelLayerLayout). DeepSpeed's pipeline engine has no interleaving: the exporter says so.
TEST_CASE("export: interleaved plans get Megatron's virtual-pipeline flags, and DeepSpeed refuses them", "[export][interleaved]") {
  const ModelShape llama = read_hf_config(hf("llama-3.1-8b.json"));  // 32 blocks: Metis layers 34
  auto args_of = [&](const PlanFile& p) { return export_megatron(p, llama, nullptr, "plan.json").args; };
  auto has = [](const Args& args, const std::string& flag, const std::string& value) {
    return std::count(args.begin(), args.end(), std::make_pair(flag, value)) == 1;
  };
  // Stages of 17 Metis layers (16 blocks each): chunks [0, 9) [9, 17) and [17, 25) [25, 34): 8 blocks each.
  PlanFile even = plan(34, 4096, {4, 4}, {{2, 2}, {2, 2}}, {0, 17, 34}, 8, 64);
  even.schedule = "interleaved";
  even.virtual_stages = 2;
  const Args a = args_of(even);
  CHECK(has(a, "--num-virtual-stages-per-pipeline-rank", "2"));
  CHECK(has(a, "--num-layers", "32"));
  for (const auto& [flag, value] : a) CHECK(flag != "--pipeline-model-parallel-layout");
  // Uneven stages (15 and 19 Metis layers: 14 and 18 blocks): chunks of 7 + 7 and 9 + 9 blocks; virtual
  // stages in model order: stage 0 chunk 0 (embedding + 7), stage 1 chunk 0 (9), stage 0 chunk 1 (7),
  // stage 1 chunk 1 (9 + head).
  PlanFile uneven = plan(34, 4096, {4, 4}, {{2, 2}, {2, 2}}, {0, 15, 34}, 8, 64);
  uneven.schedule = "interleaved";
  uneven.virtual_stages = 2;
  const Args b = args_of(uneven);
  CHECK(has(b, "--pipeline-model-parallel-layout", "Et*7|t*9|t*7|t*9L"));
  for (const auto& [flag, value] : b) CHECK(flag != "--num-virtual-stages-per-pipeline-rank");
  CHECK_THROWS_WITH(export_deepspeed(even, llama, nullptr, "plan.json"),
                    Catch::Contains("DeepSpeed's pipeline engine cannot run"));
  // A plan file keeps the setting: virtual_stages without the interleaved schedule is refused.
  ordered_json j = plan_file_to_json(even);
  CHECK(j["virtual_stages"] == 2);
  CHECK(plan_file_from_json(j, "p").virtual_stages == 2);
  j["schedule"] = "1f1b";
  CHECK_THROWS_WITH(plan_file_from_json(j, "p.json"), Catch::Contains("p.json: key 'virtual_stages'"));
}

TEST_CASE("export --to megatron: Llama-3.1's rope_scaling goes from its config.json through search to the arguments",
          "[export][cli]") {
  // The committed Llama-3.1-8B config carries its rope_scaling (llama3, factor 8), as the real one does.
  const auto dir = test::scratch_dir("export-rope");
  std::ofstream((dir / "hostfile").string()) << "0.0.0.5 slots=8\n";
  const test::CommandResult gen = test::run_hetplan(
      "gen-profiles --analytic 34 2 --types H100 --max-tp 2 --hf-config " + hf("llama-3.1-8b.json") +
      " --seq-len 4096 --out " + (dir / "profiles").string());
  REQUIRE(gen.exit_code == 0);
  const test::CommandResult s = test::run_hetplan(
      "search --hostfile " + (dir / "hostfile").string() + " --clusterfile " + kRepoClusterfile + " --profiles " +
      (dir / "profiles").string() + " --num_layers 34 --gbs 16 --hidden_size 4096 --sequence_length 4096 "
      "--vocab_size 128256 --heads 32 --hf-config " + hf("llama-3.1-8b.json") + " -q --json " +
      (dir / "plans.json").string());
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  const ordered_json plans = read_json_file((dir / "plans.json").string());
  CHECK(plans["best"]["model"]["architecture"]["rope_scaling"] == kLlama31RopeScaling);
  // No --hf-config: the plan's model, rope scaling included.
  const test::CommandResult e = test::run_hetplan("export --plan " + (dir / "plans.json").string() +
                                                  " --to megatron");
  INFO(e.output);
  REQUIRE(e.exit_code == 0);
  CHECK(e.output.find("  --rotary-base 500000\n  --use-rope-scaling\n  --rope-scaling-factor 8\n") != std::string::npos);
}

TEST_CASE("export --to megatron: a tp that does not split the attention heads is refused, naming both", "[export]") {
  // GPT-2 XL: 25 heads (and 25 key/value heads); tp 2 cannot split them (TransformerConfig's rule).
  const ModelShape gpt2 = read_hf_config(hf("gpt2-xl.json"));
  CHECK_THROWS_WITH(export_megatron(plan(50, 1600, {8}, {{4, 2}}, {0, 50}, 4, 64), gpt2, nullptr, "plan.json"),
                    "plan.json: the model's 25 attention heads do not split over tp 2: Megatron-LM's TransformerConfig "
                    "needs num_attention_heads to be a multiple of tp; take a plan whose tp divides them");
  CHECK(export_megatron(plan(50, 1600, {8}, {{8, 1}}, {0, 50}, 4, 64), gpt2, nullptr, "plan.json").world_size == 8);
  // Llama-3.2-3B: 24 heads split over tp 3, but its 8 key/value heads are neither a multiple nor a divisor of 3.
  const ModelShape llama3b = read_hf_config(hf("llama-3.2-3b.json"));
  CHECK_THROWS_WITH(export_megatron(plan(30, 3072, {6}, {{2, 3}}, {0, 30}, 4, 64), llama3b, nullptr, "plan.json"),
                    "plan.json: the model's 8 key/value heads are neither a multiple nor a divisor of tp 3: Megatron-LM's "
                    "TransformerConfig needs one or the other of num_query_groups; take a plan whose tp divides them");
  // tp 4 divides both.
  CHECK(export_megatron(plan(30, 3072, {8}, {{2, 4}}, {0, 30}, 4, 64), llama3b, nullptr, "plan.json").world_size == 8);
}
