#include "planner/export_plan.h"
#include "sim/schedule.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "base/file_access.h"
#include "base/input_error.h"
#include "sim/gpu_specs.h"
#include "sim/memory_model.h"

namespace hetplan {

namespace {

constexpr const char* kTorchRepo = "pytorch/pytorch";
constexpr const char* kTorchCommit = "010929fd3f401c3868310396e6a91ed95aa0305b";

NameSource mg(const char* name, const char* file) { return {name, kMegatronRepo, kMegatronCommit, file}; }
NameSource ds(const char* name, const char* file) { return {name, kDeepSpeedRepo, kDeepSpeedCommit, file}; }

constexpr const char* kArgs = "megatron/training/arguments.py";
constexpr const char* kMpc = "megatron/core/model_parallel_config.py";  // ModelParallelConfig fields
constexpr const char* kTc = "megatron/core/transformer/transformer_config.py";  // TransformerConfig fields
constexpr const char* kTrain = "megatron/training/config/training_config.py";
constexpr const char* kCommon = "megatron/training/config/common_config.py";

// Transformer blocks (Megatron's layers) in each stage: Metis layer 0 is the
// embedding and the last is the head.
std::vector<int> blocks_per_stage(const PlanFile& f) {
  const int last_block = blocks_from_metis_layers(f.model.num_layers);
  std::vector<int> out;
  for (std::size_t s = 0; s + 1 < f.plan.layer_partition.size(); ++s) {
    const int lo = std::max(1, f.plan.layer_partition[s]), hi = std::min(last_block + 1, f.plan.layer_partition[s + 1]);
    out.push_back(std::max(0, hi - lo));
  }
  return out;
}

// The same (dp, tp) in every stage (Megatron's and DeepSpeed's rank grids are uniform). The GPU types may
// differ from stage to stage: the layer split is uneven where the search made it so.
void require_uniform(const PlanFile& f, const std::string& where, const std::string& framework) {
  const auto& st = f.plan.strategies;
  const std::string pointer = "; `hetplan export --to torchrun` runs it with hetplan replay";
  for (std::size_t s = 1; s < st.size(); ++s)
    if (!exporter_grid_matches(st[0], st[s]))
      throw InputError(where + ": stage " + std::to_string(s) + " runs dp " + std::to_string(st[s].dp) + ", tp " +
                       std::to_string(st[s].tp) + " but stage 0 runs dp " + std::to_string(st[0].dp) + ", tp " +
                       std::to_string(st[0].tp) + ": " + framework + " needs the same (dp, tp) in every stage" + pointer);
}

// The GPU type names the plan runs on: each rank's from `placement`, else the node sequence's.
std::vector<std::string> plan_gpu_types(const PlanFile& f, const ParallelLayout* placement) {
  std::vector<std::string> out;
  if (placement) {
    for (int r = 0; r < placement->num_ranks(); ++r)
      out.push_back(placement->cluster().device_types()[placement->ranks().type_of(r)]);
  } else {
    out = f.plan.node_sequence;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The 16-bit format to train in: the plan's precision, except that bf16 becomes fp16 (with loss scaling) when a
// GPU of the plan lacks bf16 (V100; the catalogue, sim/gpu_specs.h). "fp32": neither. `notes` says why.
std::string training_format(const PlanFile& f, const ParallelLayout* placement, std::vector<std::string>& notes) {
  const std::string precision = f.precision.empty() ? "bf16" : f.precision;
  if (precision == "fp32" || precision == "fp16") return precision;
  for (const std::string& t : plan_gpu_types(f, placement)) {
    const GpuSpec* g = find_gpu_spec(t);
    if (g && !g->supports(ComputePrecision::kBf16)) {
      notes.push_back(t + " has no bf16 (it supports " + g->supported() +
                      "): fp16 mixed precision with dynamic loss scaling");
      return "fp16";
    }
  }
  if (precision == "fp8") notes.push_back("the plan was costed in fp8: the framework's FP8 settings are yours to add");
  return "bf16";
}

// Megatron-LM splits the attention heads over tp: TransformerConfig needs the heads to be a multiple of tp and the
// key/value heads (num_query_groups) a multiple or a divisor of it.
void require_heads_split(const ModelShape& m, int tp, const std::string& where) {
  const std::string problem = heads_split_problem(m, tp);
  if (!problem.empty()) throw InputError(where + ": " + problem + "; take a plan whose tp divides them");
}

// Samples per replica per micro-batch: Megatron and DeepSpeed split each micro-batch evenly over dp (with
// context parallelism, over the dp / cp groups: every rank of a cp group takes its group's samples).
int micro_batch_per_replica(const PlanFile& f, const std::string& where, const std::string& framework) {
  const int micro = f.gbs / f.plan.batches, dp = f.plan.strategies[0].dp / std::max(1, f.context_parallel);
  if (!exporter_micro_batch_splits(micro, dp))
    throw InputError(where + ": a micro-batch of gbs / batches = " + std::to_string(micro) +
                     " sequences does not split evenly over dp " + std::to_string(dp) + ": " + framework +
                     " needs micro-batch size x dp x micro-batches = global batch" +
                     "; `hetplan export --to torchrun` runs it with hetplan replay");
  return micro / dp;
}

std::string number_text(double v) {
  std::ostringstream o;
  o.precision(10);
  o << v;
  return o.str();
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,:/=+@") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

const std::vector<NameSource>& megatron_flag_sources() {
  static const std::vector<NameSource> v = {
      mg("--tensor-model-parallel-size", kMpc),
      mg("--pipeline-model-parallel-size", kMpc),
      mg("--sequence-parallel", kMpc),
      mg("--context-parallel-size", kMpc),
      mg("--overlap-grad-reduce", kArgs),
      mg("--overlap-param-gather", kArgs),
      mg("--ddp-bucket-size", kArgs),
      mg("--bf16", kMpc),
      mg("--fp16", kMpc),
      mg("--initial-loss-scale", kArgs),
      mg("--min-loss-scale", kArgs),
      mg("--loss-scale-window", kArgs),
      mg("--hysteresis", kArgs),
      mg("--ckpt-format", kArgs),
      mg("--use-rope-scaling", kArgs),
      mg("--rope-scaling-factor", kArgs),
      mg("--micro-batch-size", kTrain),
      mg("--global-batch-size", kTrain),
      mg("--num-layers", kTc),
      mg("--hidden-size", kTc),
      mg("--ffn-hidden-size", kTc),
      mg("--num-attention-heads", kTc),
      mg("--num-query-groups", kTc),
      mg("--kv-channels", kTc),
      mg("--normalization", kTc),
      mg("--norm-epsilon", kTc),         // TransformerConfig.layernorm_epsilon's arg_names
      mg("--disable-bias-linear", kTc),  // TransformerConfig.add_bias_linear's arg_names
      mg("--add-qkv-bias", kTc),
      mg("--hidden-dropout", kTc),
      mg("--attention-dropout", kTc),
      mg("--recompute-granularity", kTc),
      mg("--recompute-method", kTc),
      mg("--recompute-num-layers", kTc),
      mg("--recompute-modules", kTc),
      mg("--vocab-size", kTrain),  // TokenizerConfig
      mg("--use-megatron-fsdp", kCommon),  // DistributedInitConfig
      mg("--group-query-attention", kArgs),
      mg("--seq-length", kArgs),
      mg("--max-position-embeddings", kArgs),
      mg("--position-embedding-type", kArgs),
      mg("--rotary-base", kArgs),
      mg("--swiglu", kArgs),
      mg("--untie-embeddings-and-output-weights", kArgs),
      mg("--decoder-first-pipeline-num-layers", kArgs),
      mg("--decoder-last-pipeline-num-layers", kArgs),
      mg("--pipeline-model-parallel-layout", kArgs),
      mg("--num-virtual-stages-per-pipeline-rank", kArgs),
      mg("--use-distributed-optimizer", kArgs),
      mg("--data-parallel-sharding-strategy", kArgs),
  };
  return v;
}

const std::vector<NameSource>& deepspeed_key_sources() {
  constexpr const char* kConst = "deepspeed/runtime/constants.py";
  constexpr const char* kZero = "deepspeed/runtime/zero/config.py";
  constexpr const char* kOffload = "deepspeed/runtime/zero/offload_config.py";
  constexpr const char* kAct = "deepspeed/runtime/activation_checkpointing/config.py";
  constexpr const char* kPipe = "deepspeed/runtime/config.py";  // get_pipeline_config
  static const std::vector<NameSource> v = {
      ds("train_batch_size", kConst),
      ds("train_micro_batch_size_per_gpu", kConst),
      ds("gradient_accumulation_steps", kConst),
      ds("bf16", kConst),
      ds("bf16.enabled", kConst),
      ds("fp16", kConst),
      ds("fp16.enabled", kConst),
      ds("fp16.loss_scale", kConst),
      ds("fp16.initial_scale_power", kConst),
      ds("fp16.loss_scale_window", kConst),
      ds("fp16.hysteresis", kConst),
      ds("fp16.min_loss_scale", kConst),
      ds("zero_optimization", kZero),
      ds("zero_optimization.stage", kZero),
      ds("zero_optimization.overlap_comm", kZero),
      ds("zero_optimization.contiguous_gradients", kZero),
      ds("zero_optimization.reduce_bucket_size", kZero),
      ds("zero_optimization.allgather_bucket_size", kZero),
      ds("zero_optimization.stage3_prefetch_bucket_size", kZero),
      ds("zero_optimization.stage3_param_persistence_threshold", kZero),
      ds("zero_optimization.offload_optimizer", kZero),
      ds("zero_optimization.offload_optimizer.device", kOffload),
      ds("zero_optimization.offload_param", kZero),
      ds("zero_optimization.offload_param.device", kOffload),
      ds("activation_checkpointing", kAct),
      ds("activation_checkpointing.partition_activations", kAct),
      ds("activation_checkpointing.contiguous_memory_optimization", kAct),
      ds("activation_checkpointing.cpu_checkpointing", kAct),
      ds("activation_checkpointing.number_checkpoints", kAct),
      ds("pipeline", kPipe),
      ds("pipeline.stages", kPipe),
      ds("pipeline.activation_checkpoint_interval", kPipe),
  };
  return v;
}

const std::vector<NameSource>& torchrun_flag_sources() {
  constexpr const char* kRun = "torch/distributed/run.py";
  static const std::vector<NameSource> v = {
      {"--nnodes", kTorchRepo, kTorchCommit, kRun},        {"--node-rank", kTorchRepo, kTorchCommit, kRun},
      {"--nproc-per-node", kTorchRepo, kTorchCommit, kRun}, {"--rdzv-backend", kTorchRepo, kTorchCommit, kRun},
      {"--rdzv-endpoint", kTorchRepo, kTorchCommit, kRun}, {"--rdzv-id", kTorchRepo, kTorchCommit, kRun},
      {"--max-restarts", kTorchRepo, kTorchCommit, kRun},  {"--no-python", kTorchRepo, kTorchCommit, kRun},
  };
  return v;
}

namespace {

using ArgList = std::vector<std::pair<std::string, std::string>>;

std::string num(long long v) { return std::to_string(v); }

// One segment of Megatron's --pipeline-model-parallel-layout: E (embedding), t*n (n blocks), L (loss).
std::string layout_segment(bool embedding, int blocks, bool loss) {
  std::string out = embedding ? "E" : "";
  if (blocks == 1) out += "t";
  else if (blocks > 1) out += "t*" + num(blocks);
  return out + (loss ? "L" : "");
}

// Interleaved (virtual_stages v > 1): each stage's layers in v chunks (chunk_layers), run in virtual-stage
// order. Every chunk the same blocks: Megatron's own even split with --num-virtual-stages-per-pipeline-rank;
// else the explicit layout of pp * v segments in virtual-stage order (Megatron reads segment
// chunk * pp + rank as rank's chunk; it then derives v from the segment count).
void add_interleaved_layer_split(const PlanFile& f, const ModelShape& m, ArgList& args) {
  const std::vector<int>& lp = f.plan.layer_partition;
  const int pp = static_cast<int>(lp.size()) - 1, v = f.virtual_stages;
  const int last_block = blocks_from_metis_layers(f.model.num_layers);
  std::vector<int> blocks;  // per virtual stage
  for (int k = 0; k < pp * v; ++k) {
    int a = 0, b = 0;
    chunk_layers(lp[k % pp], lp[k % pp + 1], lp[pp], v, k / pp, &a, &b);
    blocks.push_back(std::max(0, std::min(last_block + 1, b) - std::max(1, a)));
  }
  args.emplace_back("--num-layers", num(m.num_layers));
  if (std::all_of(blocks.begin(), blocks.end(), [&](int x) { return x == blocks[0]; })) {
    args.emplace_back("--num-virtual-stages-per-pipeline-rank", num(v));
    return;
  }
  std::string layout;
  for (int k = 0; k < pp * v; ++k) {
    if (k) layout += "|";
    layout += layout_segment(k == 0, blocks[k], k == pp * v - 1);
  }
  args.emplace_back("--pipeline-model-parallel-layout", layout);
}

// Layers: an even split, the first/last stage counts, or the explicit layout.
void add_layer_split(const PlanFile& f, const ModelShape& m, ArgList& args) {
  if (f.virtual_stages > 1) {
    add_interleaved_layer_split(f, m, args);
    return;
  }
  const std::vector<int> b = blocks_per_stage(f);
  const int pp = static_cast<int>(b.size());
  args.emplace_back("--num-layers", num(m.num_layers));
  const bool even = std::all_of(b.begin(), b.end(), [&](int x) { return x == b[0]; });
  if (even) return;
  const bool any_empty = std::any_of(b.begin(), b.end(), [](int x) { return x == 0; });
  const bool middle_even = pp > 2 && std::all_of(b.begin() + 1, b.end() - 1, [&](int x) { return x == b[1]; });
  if (!any_empty && pp == 2) {
    args.emplace_back("--decoder-first-pipeline-num-layers", num(b[0]));
    args.emplace_back("--decoder-last-pipeline-num-layers", num(b[1]));
  } else if (!any_empty && middle_even) {
    if (b.front() != b[1]) args.emplace_back("--decoder-first-pipeline-num-layers", num(b.front()));
    if (b.back() != b[1]) args.emplace_back("--decoder-last-pipeline-num-layers", num(b.back()));
  } else {
    std::string layout;
    for (int s = 0; s < pp; ++s) {
      if (s) layout += "|";
      layout += layout_segment(s == 0, b[s], s == pp - 1);
    }
    args.emplace_back("--pipeline-model-parallel-layout", layout);
  }
}

// Llama-3.1's rope_scaling ("rope_type": "llama3"): Megatron's --use-rope-scaling applies that scheme with the
// factor given and fixed low/high frequency factors 1 and 4 and original context 8192; other types are a note.
void add_rope_scaling(const ordered_json& rs, ArgList& args, std::vector<std::string>& notes) {
  if (!rs.is_object()) return;
  const std::string type = rs.contains("rope_type") && rs["rope_type"].is_string() ? rs["rope_type"].get<std::string>()
                           : rs.contains("type") && rs["type"].is_string()       ? rs["type"].get<std::string>()
                                                                                  : "";
  if (type != "llama3" || !rs.contains("factor") || !rs["factor"].is_number()) {
    notes.push_back("the model's rope_scaling " + excerpt(rs.dump()) + " has no Megatron-LM flag here: add it by hand");
    return;
  }
  args.emplace_back("--use-rope-scaling", "");
  args.emplace_back("--rope-scaling-factor", number_text(rs["factor"].get<double>()));
  auto differs = [&](const char* key, double megatron) {
    return rs.contains(key) && rs[key].is_number() && rs[key].get<double>() != megatron;
  };
  if (differs("low_freq_factor", 1) || differs("high_freq_factor", 4) || differs("original_max_position_embeddings", 8192))
    notes.push_back("rope_scaling " + excerpt(rs.dump()) + ": Megatron-LM's llama3 scaling fixes low_freq_factor 1, "
                    "high_freq_factor 4 and original_max_position_embeddings 8192");
}

// Context parallelism: Megatron's data-parallel size is the plan's dp / cp (its rank order is tp, cp, dp, as
// the plan's); the sequence must split into 2 x cp load-balanced chunks (validate_args).
void add_context_parallel(const PlanFile& f, const std::string& where, MegatronArgs& out) {
  const int cp = std::max(1, f.context_parallel);
  if (cp == 1) return;
  for (const Strategy& st : f.plan.strategies)
    if (st.dp % cp != 0)
      throw InputError(where + ": context_parallel " + std::to_string(cp) + " does not divide a stage's dp " +
                       std::to_string(st.dp));
  if (f.model.sequence_length % (2 * cp) != 0)
    throw InputError(where + ": Megatron-LM needs the sequence length (" + std::to_string(f.model.sequence_length) +
                     ") to be a multiple of 2 x context_parallel (" + std::to_string(2 * cp) + ")");
  out.args.emplace_back("--context-parallel-size", num(cp));
}

// The model's shape.
void add_model_shape(const PlanFile& f, const ModelShape& m, MegatronArgs& out) {
  ArgList& args = out.args;
  auto add = [&](const std::string& flag, const std::string& value = "") { args.emplace_back(flag, value); };
  add("--hidden-size", num(m.hidden_size));
  add("--ffn-hidden-size", num(m.ffn_hidden_size));
  add("--num-attention-heads", num(m.num_heads));
  if (m.num_kv_heads != m.num_heads) {
    add("--group-query-attention");
    add("--num-query-groups", num(m.num_kv_heads));
  }
  if (m.head_dim * m.num_heads != m.hidden_size) add("--kv-channels", num(m.head_dim));
  add("--seq-length", num(f.model.sequence_length));
  add("--max-position-embeddings", num(std::max<long long>(m.max_positions, f.model.sequence_length)));
  add("--vocab-size", num(m.vocab_size));
  if (m.learned_positions) {
    add("--position-embedding-type", "learned_absolute");
  } else {
    add("--position-embedding-type", "rope");
    add("--rotary-base", num(std::llround(m.rope_theta)));
    add_rope_scaling(f.rope_scaling, args, out.notes);
  }
  add("--normalization", m.norm == NormKind::kRmsNorm ? "RMSNorm" : "LayerNorm");
  add("--norm-epsilon", number_text(m.norm_eps));
  if (m.mlp == MlpKind::kSwiGlu) add("--swiglu");
  if (!m.mlp_bias) add("--disable-bias-linear");
  if (!m.mlp_bias && m.attention_bias) {
    add("--add-qkv-bias");
    out.notes.push_back("the model's attention output projection has a bias, which Megatron-LM's --add-qkv-bias "
                        "does not add");
  }
  if (!m.tied_embeddings) add("--untie-embeddings-and-output-weights");
  if (!m.dropout) {
    add("--attention-dropout", "0");
    add("--hidden-dropout", "0");
  }
}

void add_overlap(const PlanFile& f, MegatronArgs& out);

// Training setting: mixed precision, ZeRO (distributed optimizer or Megatron-FSDP), recomputation.
void add_training_setting(const PlanFile& f, const ParallelLayout* placement, const std::string& where,
                          MegatronArgs& out) {
  auto add = [&](const std::string& flag, const std::string& value = "") { out.args.emplace_back(flag, value); };
  const std::string format = training_format(f, placement, out.notes);
  if (format == "bf16") add("--bf16");
  if (format == "fp16") {
    add("--fp16");
    add("--initial-loss-scale", "65536");  // dynamic loss scaling (no --loss-scale), from 2^16
    add("--min-loss-scale", "1");
    add("--loss-scale-window", "1000");
    add("--hysteresis", "2");
  }
  const int zero = std::max(0, f.zero_stage);
  if (zero == 1 || zero == 2) add("--use-distributed-optimizer");
  if (zero == 2)
    out.notes.push_back("ZeRO-2: Megatron-LM's distributed optimizer reduce-scatters gradients but keeps the whole "
                        "gradient buffer on each rank");
  if (zero == 3) {
    add("--use-megatron-fsdp");
    add("--data-parallel-sharding-strategy", "optim_grads_params");
    add("--ckpt-format", "fsdp_dtensor");  // validate_args: Megatron-FSDP saves DTensor checkpoints only
  }
  const Recompute rc = f.recompute.empty() ? Recompute::kNone : parse_recompute(f.recompute, where + ": recompute");
  if (rc == Recompute::kFull) {
    add("--recompute-granularity", "full");
    add("--recompute-method", "uniform");
    add("--recompute-num-layers", "1");
  } else if (rc == Recompute::kSelective) {
    add("--recompute-granularity", "selective");
    add("--recompute-modules", "core_attn");
  }
  if (f.offload_optimizer)
    out.notes.push_back("the plan was costed with the optimizer state offloaded to CPU memory: Megatron-LM's "
                        "--optimizer-cpu-offload is yours to add");
  add_overlap(f, out);
}

// Overlapped data-parallel communication: Megatron overlaps the gradient reduction with
// --overlap-grad-reduce, the distributed optimizer's (or Megatron-FSDP's) weight gather with
// --overlap-param-gather, which needs the former (validate_args).
void add_overlap(const PlanFile& f, MegatronArgs& out) {
  auto add = [&](const std::string& flag, const std::string& value = "") { out.args.emplace_back(flag, value); };
  const int zero = std::max(0, f.zero_stage);
  const bool gather = f.overlap.param_gather && zero >= 1;
  if (f.overlap.grad_reduce || gather) add("--overlap-grad-reduce");
  if (gather) add("--overlap-param-gather");
  if (f.overlap.any() && f.overlap.grad_bucket_params > 0)
    add("--ddp-bucket-size", num(std::llround(f.overlap.grad_bucket_params)));
}

// The environment Megatron-LM needs and the torchrun line that starts pretrain_gpt.py on every node.
void add_launch(const PlanFile& f, const ParallelLayout* placement, MegatronArgs& out) {
  const int zero = std::max(0, f.zero_stage);
  // Megatron orders tp communication before compute with one connection per device (validate_args checks it);
  // Megatron-FSDP needs the opposite.
  if (f.plan.strategies[0].tp > 1 && zero != 3) out.env.emplace_back("CUDA_DEVICE_MAX_CONNECTIONS", "1");
  int nodes = 1, per_node = out.world_size;
  std::string master = "localhost";
  if (placement) {
    const std::vector<std::vector<int>> ranks = ranks_by_node(*placement);
    nodes = static_cast<int>(ranks.size());
    per_node = static_cast<int>(ranks[0].size());
    master = placement->host(0);
    if (std::any_of(ranks.begin(), ranks.end(), [&](const auto& n) { return static_cast<int>(n.size()) != per_node; }))
      out.notes.push_back("the nodes run different numbers of GPUs: set --nproc-per-node per node");
  }
  out.launcher = "torchrun --nnodes " + num(nodes) + " --node-rank \"${NODE_RANK:-0}\" --nproc-per-node " +
                 num(per_node) + " --master-addr \"${MASTER_ADDR:-" + master + "}\" --master-port \"${MASTER_PORT:-6000}\" " +
                 "pretrain_gpt.py \"${MEGATRON_ARGS[@]}\" \"$@\"";
}

}  // namespace

MegatronArgs export_megatron(const PlanFile& f, const ModelShape& m, const ParallelLayout* placement,
                             const std::string& where) {
  require_uniform(f, where, "Megatron-LM");
  MegatronArgs out;
  const Strategy st = f.plan.strategies[0];
  require_heads_split(m, st.tp, where);
  const int pp = static_cast<int>(f.plan.strategies.size());
  out.world_size = pp * st.dp * st.tp;
  auto add = [&](const std::string& flag, const std::string& value = "") { out.args.emplace_back(flag, value); };
  add("--tensor-model-parallel-size", num(st.tp));
  add("--pipeline-model-parallel-size", num(pp));
  if (st.tp > 1) add("--sequence-parallel");
  if (st.tp > 1 && !f.sequence_parallel)
    out.notes.push_back("the plan was costed without sequence parallelism; --sequence-parallel only lowers the "
                        "activation memory (sim/sequence_parallel.h)");
  add_context_parallel(f, where, out);
  add("--micro-batch-size", num(micro_batch_per_replica(f, where, "Megatron-LM")));
  add("--global-batch-size", num(f.gbs));
  add_layer_split(f, m, out.args);
  add_model_shape(f, m, out);
  add_training_setting(f, placement, where, out);
  add_launch(f, placement, out);
  const std::vector<std::string> types = plan_gpu_types(f, placement);
  if (types.size() > 1) {
    std::string list;
    for (const auto& t : types) list += (list.empty() ? "" : ", ") + t;
    out.notes.push_back("the stages run on different GPU types (" + list + "): the uneven layer split balances them");
  }
  out.notes.push_back("add the tokenizer and data arguments (--tokenizer-type, --data-path, ...); --vocab-size is the "
                      "plan's, before Megatron's padding");
  return out;
}

std::string megatron_args_text(const MegatronArgs& m, const std::string& header) {
  std::string s = header;
  for (const auto& n : m.notes) s += "# note: " + n + "\n";
  for (const auto& [name, value] : m.env) s += "export " + name + "=" + value + "\n";
  s += "MEGATRON_ARGS=(\n";
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "  " + flag + ... here.
  for (const auto& [flag, value] : m.args) {
    s += "  ";
    s += flag;
    if (!value.empty()) {
      s += ' ';
      s += shell_quote(value);
    }
    s += '\n';
  }
  s += ")\n";
  if (!m.launcher.empty()) s += "# On every node (NODE_RANK 0, 1, ...; MASTER_ADDR:MASTER_PORT the rendezvous):\n" +
                                 m.launcher + "\n";
  return s;
}

DeepSpeedConfig export_deepspeed(const PlanFile& f, const ModelShape& m, const ParallelLayout* placement,
                                 const std::string& where) {
  require_uniform(f, where, "DeepSpeed");
  if (f.context_parallel > 1)
    throw InputError(where + ": context_parallel " + std::to_string(f.context_parallel) +
                     ": DeepSpeed's config has no ring attention (Ulysses splits heads, not the ring); export it to "
                     "Megatron-LM");
  if (f.virtual_stages > 1)
    throw InputError(where + ": the plan interleaves " + std::to_string(f.virtual_stages) +
                     " virtual stages per pipeline rank, which DeepSpeed's pipeline engine cannot run (its "
                     "PipelineModule gives each rank one contiguous piece and runs plain 1F1B); export it --to "
                     "megatron, or `hetplan export --to torchrun` runs it with hetplan replay");
  DeepSpeedConfig out;
  ordered_json& c = out.config;
  const Strategy st = f.plan.strategies[0];
  const int pp = static_cast<int>(f.plan.strategies.size());
  const int zero = std::max(0, f.zero_stage);
  if (!deepspeed_pipeline_zero_ok(pp, zero))
    throw InputError(where + ": the plan has " + std::to_string(pp) + " pipeline stages and ZeRO stage " +
                     std::to_string(zero) + ": DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only" +
                     "; `hetplan export --to torchrun` runs it with hetplan replay");
  c["train_batch_size"] = f.gbs;
  c["train_micro_batch_size_per_gpu"] = micro_batch_per_replica(f, where, "DeepSpeed");
  c["gradient_accumulation_steps"] = f.plan.batches;
  const std::string format = training_format(f, placement, out.notes);
  if (format == "bf16") c["bf16"] = {{"enabled", true}};
  if (format == "fp16")  // dynamic loss scaling (loss_scale 0) from 2^16
    c["fp16"] = {{"enabled", true},   {"loss_scale", 0},  {"initial_scale_power", 16},
                 {"loss_scale_window", 1000}, {"hysteresis", 2}, {"min_loss_scale", 1}};
  // Bucket sizes from the hidden size, as the Hugging Face integration's "auto" values.
  const long long h2 = m.hidden_size * m.hidden_size;
  ordered_json z;
  z["stage"] = zero;
  // overlap_comm as costed (a plan file from before it recorded overlap: on, DeepSpeed's usual setting);
  // bucket sizes in elements, the plan's when it set one.
  z["overlap_comm"] = f.overlap.any() || !f.overlap_recorded;
  z["contiguous_gradients"] = true;
  const long long grad_bucket = f.overlap.grad_bucket_params > 0 ? std::llround(f.overlap.grad_bucket_params) : h2;
  const long long gather_bucket = f.overlap.param_bucket_params > 0 ? std::llround(f.overlap.param_bucket_params)
                                                                    : grad_bucket;
  z["reduce_bucket_size"] = grad_bucket;
  if (zero <= 2) z["allgather_bucket_size"] = gather_bucket;
  if (zero == 3) {
    z["stage3_prefetch_bucket_size"] = static_cast<long long>(0.9 * static_cast<double>(h2));
    z["stage3_param_persistence_threshold"] = 10 * m.hidden_size;
    z["offload_param"] = {{"device", f.offload_params ? "cpu" : "none"}};
  }
  z["offload_optimizer"] = {{"device", f.offload_optimizer ? "cpu" : "none"}};
  c["zero_optimization"] = z;
  const Recompute rc = f.recompute.empty() ? Recompute::kNone : parse_recompute(f.recompute, where + ": recompute");
  const std::vector<int> b = blocks_per_stage(f);
  if (rc != Recompute::kNone) {
    c["activation_checkpointing"] = {{"partition_activations", st.tp > 1},
                                     {"contiguous_memory_optimization", false},
                                     {"cpu_checkpointing", false},
                                     {"number_checkpoints", *std::max_element(b.begin(), b.end())}};
    if (rc == Recompute::kSelective)
      out.notes.push_back("selective recomputation (core attention) is the model code's choice; DeepSpeed's "
                          "activation checkpointing checkpoints whole blocks");
  }
  if (pp > 1) {
    c["pipeline"] = {{"stages", pp}, {"activation_checkpoint_interval", rc == Recompute::kFull ? 1 : 0}};
    std::string counts;
    for (int x : b) counts += (counts.empty() ? "" : ", ") + std::to_string(x);
    out.notes.push_back("PipelineModule(num_stages=" + std::to_string(pp) + ") must place the transformer blocks " +
                        counts + " per stage (the embedding on the first stage, the head on the last)");
  }
  if (st.tp > 1)
    out.notes.push_back("tensor parallelism (tp " + std::to_string(st.tp) +
                        ") comes from the model code (e.g. Megatron-DeepSpeed's --tensor-model-parallel-size); the "
                        "batch keys count data-parallel ranks (dp " + std::to_string(st.dp) + ")");
  return out;
}

std::vector<HostLaunch> export_torchrun(const PlanFile& f, const ParallelLayout& p, const TorchrunOptions& o,
                                        const std::string& where) {
  // tp groups inside a host.
  const PipelineGrid stages(f.plan.strategies);
  for (int s = 0; s < stages.num_stages(); ++s) {
    const StageGrid& st = stages.stage(s);
    for (int d = 0; d < st.dp; ++d) {
      const RankStride group = st.tp_group(d);
      for (int t = 1; t < group.size(); ++t) {
        const int a = group[0], r = group[t];
        if (p.host(a) != p.host(r))
          throw InputError(where + ": stage " + std::to_string(s) + " replica " + std::to_string(d) +
                           ": its tp group spans hosts " + p.host(a) + " (rank " + std::to_string(a) + ") and " +
                           p.host(r) + " (rank " + std::to_string(r) + "); tensor parallelism must stay inside a host");
      }
    }
  }
  const std::vector<std::vector<int>> nodes = ranks_by_node(p);
  const std::string endpoint = o.rdzv_endpoint.empty() ? p.host(0) + ":29500" : o.rdzv_endpoint;
  const auto& types = p.cluster().device_types();
  std::vector<HostLaunch> out;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    HostLaunch h;
    h.host = p.host(nodes[i][0]);
    h.node_rank = static_cast<int>(i);
    h.ranks = nodes[i];
    h.file_name = "launch_" + std::to_string(i) + "_" + safe_file_name(h.host) + ".sh";
    std::ostringstream s;
    s << "#!/usr/bin/env bash\n"
      << "# hetplan export --to torchrun: host " << h.host << " (node " << i << " of " << nodes.size() << "), "
      << h.ranks.size() << " of the plan's " << p.num_ranks() << " ranks.\n"
      << "# Run this script on " << h.host << "; run the other nodes' scripts on theirs. Every node needs\n"
      << "# hetplan (or HETPLAN=/path/to/hetplan) and this folder; its paths are relative to this script.\n";
    for (std::size_t g = 0; g < h.ranks.size(); ++g) {
      const int r = h.ranks[g], s_idx = stages.stage_of(r);
      const StageGrid& st = stages.stage(s_idx);
      s << "#   local rank " << g << ": rank " << r << ", stage " << s_idx << " (dp " << st.dp << ", tp "
        << st.tp << "), replica " << st.replica(r) << ", tp index " << st.tp_index(r) << ", "
        << types[p.ranks().type_of(r)] << "\n";
    }
    s << "set -euo pipefail\n"
      << "HERE=\"$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\"\n"
      << "# replay finds its ranks by this node's place among the plan's nodes and LOCAL_RANK.\n"
      << "export HETPLAN_HOST=" << shell_quote(h.host) << " HETPLAN_NODE=" << i << "\n"
      << "exec ${TORCHRUN:-torchrun} --nnodes " << nodes.size() << " --node-rank " << i << " --nproc-per-node "
      << h.ranks.size() << " \\\n"
      << "  --rdzv-backend c10d --rdzv-endpoint " << shell_quote(endpoint) << " --rdzv-id "
      << "\"${HETPLAN_RDZV_ID:-hetplan}\" --max-restarts 0 \\\n"
      << "  --no-python \"${HETPLAN:-hetplan}\" replay --plan \"$HERE/" << o.plan_file << "\" \\\n"
      << "  --hostfile \"$HERE/" << o.hostfile << "\" --clusterfile \"$HERE/" << o.clusterfile << "\""
      << (o.profile_dir.empty() ? "" : " --profile-dir \"$HERE/\"" + shell_quote(o.profile_dir)) << " \\\n"
      << "  --out \"$HERE/replay.json\" --work-dir \"$HERE/ranks\""
      << (o.replay_args.empty() ? "" : " " + o.replay_args) << " \"$@\"\n";
    h.script = s.str();
    out.push_back(std::move(h));
  }
  return out;
}

std::vector<std::string> accepting_exporters(const PlanFile& plan, const ModelShape& shape,
                                             const ParallelLayout& placement,
                                             std::vector<std::pair<std::string, std::string>>* refusals) {
  std::vector<std::string> out;
  auto attempt = [&](const char* name, auto&& run) {
    try {
      run();
      out.push_back(name);
    } catch (const InputError& e) {
      if (refusals) refusals->emplace_back(name, e.what());
    }
  };
  attempt("megatron", [&] { export_megatron(plan, shape, &placement, "plan"); });
  attempt("deepspeed", [&] { export_deepspeed(plan, shape, &placement, "plan"); });
  attempt("torchrun", [&] { export_torchrun(plan, placement, TorchrunOptions{}, "plan"); });
  return out;
}

}  // namespace hetplan
