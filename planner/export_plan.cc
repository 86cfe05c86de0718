#include "planner/export_plan.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "base/file_access.h"
#include "base/input_error.h"
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

// Uniform plans only: the same (dp, tp) and one GPU type in every stage.
void require_uniform(const PlanFile& f, const ParallelLayout* placement, const std::vector<std::string>* type_names,
                     const std::string& where, const std::string& framework) {
  const auto& st = f.plan.strategies;
  const std::string pointer = "; `hetplan export --to torchrun` runs it with hetplan replay";
  for (std::size_t s = 1; s < st.size(); ++s)
    if (!(st[s] == st[0]))
      throw InputError(where + ": stage " + std::to_string(s) + " runs dp " + std::to_string(st[s].dp) + ", tp " +
                       std::to_string(st[s].tp) + " but stage 0 runs dp " + std::to_string(st[0].dp) + ", tp " +
                       std::to_string(st[0].tp) + ": " + framework + " needs the same (dp, tp) in every stage" + pointer);
  if (placement && type_names) {
    const RankLayout& rl = placement->ranks();
    const PipelineGrid stages(st);
    std::string first;
    for (int s = 0; s < stages.num_stages(); ++s) {
      for (int r = stages.stage(s).begin; r < stages.stage(s).end(); ++r) {
        const std::string& t = (*type_names)[rl.type_of(r)];
        if (first.empty()) first = t;
        if (t != first)
          throw InputError(where + ": stage " + std::to_string(s) + " runs on " + t + " (rank " + std::to_string(r) +
                           ")" + (s == 0 ? " and " : " but stage 0 on ") + first + ": " + framework +
                           " needs one GPU type in every stage" + pointer);
      }
    }
  } else {
    std::set<std::string> types(f.plan.node_sequence.begin(), f.plan.node_sequence.end());
    if (types.size() > 1) {
      std::string list;
      for (const auto& t : f.plan.node_sequence) list += (list.empty() ? "" : ", ") + t;
      throw InputError(where + ": the plan's node sequence mixes GPU types (" + list + "): " + framework +
                       " needs one GPU type in every stage" + pointer);
    }
  }
}

// Samples per replica per micro-batch: Megatron and DeepSpeed split each micro-batch evenly over dp.
int micro_batch_per_replica(const PlanFile& f, const std::string& where, const std::string& framework) {
  const int micro = f.gbs / f.plan.batches, dp = f.plan.strategies[0].dp;
  if (micro % dp != 0)
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
      mg("--bf16", kMpc),
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

MegatronArgs export_megatron(const PlanFile& f, const ModelShape& m, const ParallelLayout* placement,
                             const std::string& where) {
  require_uniform(f, placement, placement ? &placement->cluster().device_types() : nullptr, where, "Megatron-LM");
  MegatronArgs out;
  const Strategy st = f.plan.strategies[0];
  const int pp = static_cast<int>(f.plan.strategies.size());
  out.world_size = pp * st.dp * st.tp;
  auto add = [&](const std::string& flag, const std::string& value = "") { out.args.emplace_back(flag, value); };
  auto num = [](long long v) { return std::to_string(v); };

  add("--tensor-model-parallel-size", num(st.tp));
  add("--pipeline-model-parallel-size", num(pp));
  if (st.tp > 1) add("--sequence-parallel");
  add("--micro-batch-size", num(micro_batch_per_replica(f, where, "Megatron-LM")));
  add("--global-batch-size", num(f.gbs));

  // Layers: even split, first/last stage counts, or the explicit layout.
  const std::vector<int> b = blocks_per_stage(f);
  add("--num-layers", num(m.num_layers));
  const bool even = std::all_of(b.begin(), b.end(), [&](int x) { return x == b[0]; });
  if (!even) {
    const bool any_empty = std::any_of(b.begin(), b.end(), [](int x) { return x == 0; });
    const bool middle_even = pp > 2 && std::all_of(b.begin() + 1, b.end() - 1, [&](int x) { return x == b[1]; });
    if (!any_empty && pp == 2) {
      add("--decoder-first-pipeline-num-layers", num(b[0]));
      add("--decoder-last-pipeline-num-layers", num(b[1]));
    } else if (!any_empty && middle_even) {
      if (b.front() != b[1]) add("--decoder-first-pipeline-num-layers", num(b.front()));
      if (b.back() != b[1]) add("--decoder-last-pipeline-num-layers", num(b.back()));
    } else {
      std::string layout;
      for (int s = 0; s < pp; ++s) {
        if (s) layout += "|";
        if (s == 0) layout += "E";
        if (b[s] == 1) layout += "t";
        else if (b[s] > 1) layout += "t*" + num(b[s]);
        if (s == pp - 1) layout += "L";
      }
      add("--pipeline-model-parallel-layout", layout);
    }
  }

  // The model's shape.
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

  // Training setting: bf16 mixed precision, ZeRO, recomputation.
  add("--bf16");
  const int zero = std::max(0, f.zero_stage);
  if (zero == 1 || zero == 2) add("--use-distributed-optimizer");
  if (zero == 2)
    out.notes.push_back("ZeRO-2: Megatron-LM's distributed optimizer reduce-scatters gradients but keeps the whole "
                        "gradient buffer on each rank");
  if (zero == 3) {
    add("--use-megatron-fsdp");
    add("--data-parallel-sharding-strategy", "optim_grads_params");
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
  out.notes.push_back("add the tokenizer and data arguments (--tokenizer-type, --data-path, ...); --vocab-size is the "
                      "plan's, before Megatron's padding");
  return out;
}

std::string megatron_args_text(const MegatronArgs& m, const std::string& header) {
  std::string s = header;
  for (const auto& n : m.notes) s += "# note: " + n + "\n";
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
  return s + ")\n";
}

DeepSpeedConfig export_deepspeed(const PlanFile& f, const ModelShape& m, const ParallelLayout* placement,
                                 const std::string& where) {
  require_uniform(f, placement, placement ? &placement->cluster().device_types() : nullptr, where, "DeepSpeed");
  DeepSpeedConfig out;
  ordered_json& c = out.config;
  const Strategy st = f.plan.strategies[0];
  const int pp = static_cast<int>(f.plan.strategies.size());
  const int zero = std::max(0, f.zero_stage);
  if (pp > 1 && zero >= 2)
    throw InputError(where + ": the plan has " + std::to_string(pp) + " pipeline stages and ZeRO stage " +
                     std::to_string(zero) + ": DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only" +
                     "; `hetplan export --to torchrun` runs it with hetplan replay");
  c["train_batch_size"] = f.gbs;
  c["train_micro_batch_size_per_gpu"] = micro_batch_per_replica(f, where, "DeepSpeed");
  c["gradient_accumulation_steps"] = f.plan.batches;
  c["bf16"] = {{"enabled", true}};
  // Bucket sizes from the hidden size, as the Hugging Face integration's "auto" values.
  const long long h2 = m.hidden_size * m.hidden_size;
  ordered_json z;
  z["stage"] = zero;
  z["overlap_comm"] = true;
  z["contiguous_gradients"] = true;
  z["reduce_bucket_size"] = h2;
  if (zero <= 2) z["allgather_bucket_size"] = h2;
  if (zero == 3) {
    z["stage3_prefetch_bucket_size"] = static_cast<long long>(0.9 * static_cast<double>(h2));
    z["stage3_param_persistence_threshold"] = 10 * m.hidden_size;
    z["offload_param"] = {{"device", "none"}};
  }
  z["offload_optimizer"] = {{"device", "none"}};
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
  const std::vector<std::string> hosts = p.hosts();
  const std::string endpoint = o.rdzv_endpoint.empty() ? hosts[0] + ":29500" : o.rdzv_endpoint;
  const auto& types = p.cluster().device_types();
  std::vector<HostLaunch> out;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    HostLaunch h;
    h.host = hosts[i];
    h.node_rank = static_cast<int>(i);
    h.ranks = p.ranks_on(h.host);
    h.file_name = "launch_" + std::to_string(i) + "_" + safe_file_name(h.host) + ".sh";
    std::ostringstream s;
    s << "#!/usr/bin/env bash\n"
      << "# hetplan export --to torchrun: host " << h.host << " (node " << i << " of " << hosts.size() << "), "
      << h.ranks.size() << " of the plan's " << p.num_ranks() << " ranks.\n"
      << "# Run this script on " << h.host << "; run the other hosts' scripts on theirs. Every host needs\n"
      << "# hetplan (or HETPLAN=/path/to/hetplan) and this folder at the same path.\n";
    for (std::size_t g = 0; g < h.ranks.size(); ++g) {
      const int r = h.ranks[g], s_idx = stages.stage_of(r);
      const StageGrid& st = stages.stage(s_idx);
      s << "#   local GPU " << p.local_gpu(r) << ": rank " << r << ", stage " << s_idx << " (dp " << st.dp << ", tp "
        << st.tp << "), replica " << st.replica(r) << ", tp index " << st.tp_index(r) << ", "
        << types[p.ranks().type_of(r)] << "\n";
    }
    s << "set -euo pipefail\n"
      << "HERE=\"$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\"\n"
      << "# replay finds its ranks by this host's name in the hostfile and LOCAL_RANK.\n"
      << "export HETPLAN_HOST=" << shell_quote(h.host) << "\n"
      << "exec ${TORCHRUN:-torchrun} --nnodes " << hosts.size() << " --node-rank " << i << " --nproc-per-node "
      << h.ranks.size() << " \\\n"
      << "  --rdzv-backend c10d --rdzv-endpoint " << shell_quote(endpoint) << " --rdzv-id "
      << "\"${HETPLAN_RDZV_ID:-hetplan}\" --max-restarts 0 \\\n"
      << "  --no-python \"${HETPLAN:-hetplan}\" replay --plan \"$HERE/" << o.plan_file << "\" \\\n"
      << "  --hostfile \"$HERE/" << o.hostfile << "\" --clusterfile \"$HERE/" << o.clusterfile << "\""
      << (o.profile_dir.empty() ? "" : " --profile-dir " + shell_quote(o.profile_dir)) << " \\\n"
      << "  --out \"$HERE/replay.json\" --work-dir \"$HERE/ranks\""
      << (o.replay_args.empty() ? "" : " " + o.replay_args) << " \"$@\"\n";
    h.script = s.str();
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace hetplan
