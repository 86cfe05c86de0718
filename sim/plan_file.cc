#include "sim/plan_file.h"

#include "base/checked.h"
#include "sim/cluster.h"
#include "base/file_access.h"
#include "base/input_error.h"
#include "sim/memory_model.h"
#include "sim/timeline.h"

namespace hetplan {

ordered_json model_to_json(const ModelConfig& m) {
  ordered_json j;
  j["model_name"] = m.name;
  j["model_size"] = m.size;
  j["num_layers"] = m.num_layers;
  j["hidden_size"] = m.hidden_size;
  j["sequence_length"] = m.sequence_length;
  j["vocab_size"] = m.vocab_size;
  j["attention_heads"] = m.attention_heads;
  return j;
}

ModelConfig model_from_json(const ordered_json& j, const std::string& file) {
  ModelConfig m;
  auto str = [&](const char* key, std::string& out) {
    if (j.contains(key) && j[key].is_string()) out = j[key].get<std::string>();
  };
  str("model_name", m.name);
  str("model_size", m.size);
  auto count = [&](const char* key, long long max) {
    return static_cast<int>(require_integer(j, key, file, "model", rules::int_in(1, static_cast<double>(max))));
  };
  m.num_layers = count("num_layers", kMaxModelLayers);
  m.hidden_size = count("hidden_size", kMaxHiddenSize);
  m.sequence_length = count("sequence_length", kMaxSequenceLength);
  m.vocab_size = count("vocab_size", kMaxVocabSize);
  if (j.contains("attention_heads")) m.attention_heads = count("attention_heads", kMaxAttentionHeads);
  if (m.attention_heads > m.hidden_size)
    throw InputError(file + ": key 'model.attention_heads' = " + std::to_string(m.attention_heads) +
                     ": expected at most model.hidden_size (" + std::to_string(m.hidden_size) + ")");
  return m;
}

ordered_json shape_to_json(const ModelShape& s, const ordered_json& rope_scaling) {
  ordered_json j;
  j["name"] = s.name;
  j["vocab_size"] = s.vocab_size;
  j["hidden_size"] = s.hidden_size;
  j["num_blocks"] = s.num_layers;
  j["num_heads"] = s.num_heads;
  j["num_kv_heads"] = s.num_kv_heads;
  j["head_dim"] = s.head_dim;
  j["ffn_hidden_size"] = s.ffn_hidden_size;
  j["max_positions"] = s.max_positions;
  j["activation"] = s.mlp == MlpKind::kSwiGlu ? "swiglu" : "gelu";
  j["norm"] = s.norm == NormKind::kRmsNorm ? "rmsnorm" : "layernorm";
  j["tied_embeddings"] = s.tied_embeddings;
  j["learned_positions"] = s.learned_positions;
  j["attention_bias"] = s.attention_bias;
  j["mlp_bias"] = s.mlp_bias;
  j["dropout"] = s.dropout;
  j["norm_eps"] = s.norm_eps;
  j["rope_theta"] = s.rope_theta;
  if (!rope_scaling.is_null()) j["rope_scaling"] = rope_scaling;
  return j;
}

namespace {

const char* const kArchitecture = "model.architecture";

long long shape_count(const ordered_json& j, const char* key, const std::string& file, long long max) {
  return require_integer(j, key, file, kArchitecture, rules::int_in(1, static_cast<double>(max)));
}

bool shape_flag(const ordered_json& j, const char* key, const std::string& file) {
  const ordered_json& v = require_key(j, key, file, kArchitecture);
  if (!v.is_boolean())
    throw InputError(file + ": key '" + kArchitecture + "." + key + "' must be true or false");
  return v.get<bool>();
}

// One of two names: `second` is true, `first` false; anything else an InputError listing both.
bool shape_choice(const ordered_json& j, const char* key, const std::string& file, const char* first,
                  const char* second) {
  const ordered_json& v = require_key(j, key, file, kArchitecture);
  if (v.is_string() && v.get<std::string>() == first) return false;
  if (v.is_string() && v.get<std::string>() == second) return true;
  throw InputError(file + ": key '" + kArchitecture + "." + key + "': expected " + first + " or " + second);
}

}  // namespace

ModelShape shape_from_json(const ordered_json& j, const std::string& file) {
  if (!j.is_object()) throw InputError(file + ": key '" + kArchitecture + "' must be an object");
  ModelShape s;
  if (j.contains("name") && j["name"].is_string()) s.name = j["name"].get<std::string>();
  s.vocab_size = shape_count(j, "vocab_size", file, kMaxVocabSize);
  s.hidden_size = shape_count(j, "hidden_size", file, kMaxHiddenSize);
  s.num_layers = static_cast<int>(shape_count(j, "num_blocks", file, kMaxModelBlocks));
  s.num_heads = static_cast<int>(shape_count(j, "num_heads", file, kMaxAttentionHeads));
  s.num_kv_heads = static_cast<int>(shape_count(j, "num_kv_heads", file, kMaxAttentionHeads));
  s.head_dim = shape_count(j, "head_dim", file, kMaxHiddenSize);
  s.ffn_hidden_size = shape_count(j, "ffn_hidden_size", file, kMaxFfnSize);
  s.max_positions = shape_count(j, "max_positions", file, kMaxSequenceLength);
  s.mlp = shape_choice(j, "activation", file, "gelu", "swiglu") ? MlpKind::kSwiGlu : MlpKind::kGelu;
  s.norm = shape_choice(j, "norm", file, "layernorm", "rmsnorm") ? NormKind::kRmsNorm : NormKind::kLayerNorm;
  s.tied_embeddings = shape_flag(j, "tied_embeddings", file);
  s.learned_positions = shape_flag(j, "learned_positions", file);
  s.attention_bias = shape_flag(j, "attention_bias", file);
  s.mlp_bias = shape_flag(j, "mlp_bias", file);
  s.dropout = shape_flag(j, "dropout", file);
  s.norm_eps = require_number(j, "norm_eps", file, kArchitecture, rules::non_negative_up_to(1));
  s.rope_theta = require_number(j, "rope_theta", file, kArchitecture, rules::non_negative_up_to(1e12));
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null() && !j["rope_scaling"].is_object())
    throw InputError(file + ": key '" + kArchitecture + ".rope_scaling' must be an object (the Hugging Face "
                     "config's) or null");
  s.validate(file + ": key '" + kArchitecture + "'");
  return s;
}

ordered_json hf_rope_scaling(const std::string& hf_config) {
  const ordered_json j = read_json_file(hf_config);
  if (!j.is_object() || !j.contains("rope_scaling") || j["rope_scaling"].is_null()) return nullptr;
  if (!j["rope_scaling"].is_object()) throw InputError(hf_config + ": key 'rope_scaling' must be an object or null");
  return j["rope_scaling"];
}

ModelShape plan_shape(const PlanFile& f, const std::string& hf_config, const std::string& plan_path,
                      std::string* warning) {
  if (warning) warning->clear();
  if (hf_config.empty() && f.shape) return *f.shape;
  if (hf_config.empty()) {
    ModelShape s = shape_from_model_config(f.model);
    s.validate(plan_path + ": key 'model'");
    if (warning)
      *warning = plan_path + " records no model architecture (a plan file from before plans carried it): using the "
                 "GPT shape of its 'model' keys; pass --hf-config for another model";
    return s;
  }
  ModelShape s = shape_of_plan(f.model, hf_config, "the plan " + plan_path);
  if (!f.shape) return s;
  // The config must describe the plan's model: the first key that differs, with both values.
  const ordered_json given = shape_to_json(s, hf_rope_scaling(hf_config));
  const ordered_json recorded = shape_to_json(*f.shape, f.rope_scaling);
  for (const auto& [key, value] : recorded.items()) {
    if (key == "name") continue;
    const std::string theirs = given.contains(key) ? given[key].dump() : "absent";
    if (theirs != value.dump())
      throw InputError("--hf-config " + hf_config + ": '" + key + "' is " + excerpt(theirs) + ", but the plan " +
                       plan_path + " records " + excerpt(value.dump()) + " (" + kArchitecture + "." + key +
                       "); leave --hf-config out to use the plan's model");
  }
  if (given.contains("rope_scaling") && !recorded.contains("rope_scaling"))
    throw InputError("--hf-config " + hf_config + ": 'rope_scaling' is " + excerpt(given["rope_scaling"].dump()) +
                     ", but the plan " + plan_path + " records none; leave --hf-config out to use the plan's model");
  return s;
}

ordered_json plan_to_json(const PlanResult& p) {
  ordered_json j;
  j["cost"] = p.cost;
  j["node_sequence"] = p.node_sequence;
  j["device_groups"] = p.device_groups;
  ordered_json st = ordered_json::array();
  for (const Strategy& s : p.strategies) st.push_back({s.dp, s.tp});
  j["strategies"] = st;
  j["batches"] = p.batches;
  j["layer_partition"] = p.layer_partition;
  j["num_repartition"] = p.num_repartition;
  return j;
}

ordered_json plan_file_to_json(const PlanFile& f) {
  ordered_json j = plan_to_json(f.plan);
  j["model"] = model_to_json(f.model);
  if (f.shape) j["model"]["architecture"] = shape_to_json(*f.shape, f.rope_scaling);
  j["gbs"] = f.gbs;
  if (!f.hostfile.empty()) j["hostfile"] = f.hostfile;
  if (!f.clusterfile.empty()) j["clusterfile"] = f.clusterfile;
  if (!f.profile_dir.empty()) j["profile_dir"] = f.profile_dir;
  if (f.zero_stage >= 0) j["zero_stage"] = f.zero_stage;
  if (!f.recompute.empty()) j["recompute"] = f.recompute;
  if (!f.schedule.empty()) j["schedule"] = f.schedule;
  if (f.virtual_stages > 1) j["virtual_stages"] = f.virtual_stages;
  if (!f.precision.empty()) j["precision"] = f.precision;
  if (f.offload_optimizer) j["offload_optimizer"] = true;
  if (f.offload_params) j["offload_params"] = true;
  if (!f.accounting.empty()) j["accounting"] = f.accounting;
  if (f.deepspeed_buffers) j["deepspeed_buffers"] = true;
  if (f.ddp_buckets) j["ddp_buckets"] = true;
  if (f.ddp_buckets && !f.ddp_old_buckets.empty()) j["ddp_old_buckets"] = f.ddp_old_buckets;
  if (f.grads_in_backward) j["grads_in_backward"] = true;
  if (f.fp32_residual) j["fp32_residual"] = true;
  if (f.eager_fp32_loss) j["eager_fp32_loss"] = true;
  if (f.sequence_parallel) j["sequence_parallel"] = true;
  if (f.context_parallel > 1) j["context_parallel"] = f.context_parallel;
  if (f.overlap.any() || f.overlap_recorded) {
    ordered_json o;
    o["grad_reduce"] = f.overlap.grad_reduce;
    o["param_gather"] = f.overlap.param_gather;
    if (f.overlap.grad_bucket_params > 0) o["grad_bucket_params"] = f.overlap.grad_bucket_params;
    if (f.overlap.param_bucket_params > 0) o["param_bucket_params"] = f.overlap.param_bucket_params;
    j["overlap"] = o;
  }
  return j;
}

namespace {

std::string list_text(const std::vector<int>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return excerpt(out + "]");
}

// model.architecture: the shape, which must agree with the model keys (blocks and hidden size).
void read_architecture(const ordered_json& a, const std::string& file, PlanFile& f) {
  f.shape = shape_from_json(a, file);
  if (f.shape->metis_num_layers() != f.model.num_layers || f.shape->hidden_size != f.model.hidden_size)
    throw InputError(file + ": key 'model.architecture' has " + std::to_string(f.shape->num_layers) +
                     " blocks of hidden size " + std::to_string(f.shape->hidden_size) + ", but 'model' has " +
                     std::to_string(f.model.num_layers) + " layers (blocks + 2) of hidden size " +
                     std::to_string(f.model.hidden_size));
  if (a.contains("rope_scaling")) f.rope_scaling = a["rope_scaling"];
}

// The training setup the plan was costed with, each key when present: zero_stage, recompute, schedule,
// precision, offload_optimizer, offload_params, accounting, deepspeed_buffers and ddp_buckets.
void read_setup(const ordered_json& j, const std::string& file, PlanFile& f) {
  if (j.contains("zero_stage")) {
    const double z = require_number(j, "zero_stage", file, "");
    if (z != 0 && z != 1 && z != 2 && z != 3) throw InputError(file + ": key 'zero_stage': expected 0, 1, 2 or 3");
    f.zero_stage = static_cast<int>(z);
  }
  if (j.contains("recompute")) {
    const std::string where = file + ": key 'recompute'";
    if (!j["recompute"].is_string()) throw InputError(where + ": expected none, selective or full");
    f.recompute = to_string(parse_recompute(j["recompute"].get<std::string>(), where));
  }
  if (j.contains("schedule")) {
    const std::string where = file + ": key 'schedule'";
    if (!j["schedule"].is_string()) throw InputError(where + ": expected gpipe, 1f1b or interleaved");
    f.schedule = to_string(parse_schedule(j["schedule"].get<std::string>(), where));
  }
  if (j.contains("virtual_stages")) {
    const double v = require_number(j, "virtual_stages", file, "");
    if (v < 1 || v > 64 || v != static_cast<int>(v))
      throw InputError(file + ": key 'virtual_stages': expected a whole number from 1 to 64");
    f.virtual_stages = static_cast<int>(v);
    if (f.virtual_stages > 1 && f.schedule != "interleaved")
      throw InputError(file + ": key 'virtual_stages' is " + std::to_string(f.virtual_stages) +
                       ", which needs \"schedule\": \"interleaved\"");
  }
  if (j.contains("precision")) {
    const std::string where = file + ": key 'precision'";
    if (!j["precision"].is_string()) throw InputError(where + ": expected fp32, fp16, bf16 or fp8");
    f.precision = to_string(parse_precision(j["precision"].get<std::string>(), where));
  }
  auto flag = [&](const char* key, bool& out) {
    if (!j.contains(key)) return;
    if (!j[key].is_boolean()) throw InputError(file + ": key '" + key + "' must be true or false");
    out = j[key].get<bool>();
  };
  flag("offload_optimizer", f.offload_optimizer);
  flag("offload_params", f.offload_params);
  flag("deepspeed_buffers", f.deepspeed_buffers);
  flag("ddp_buckets", f.ddp_buckets);
  if (j.contains("ddp_old_buckets")) {
    const std::string where = file + ": key 'ddp_old_buckets'";
    if (!j["ddp_old_buckets"].is_string()) throw InputError(where + ": expected none, activations, gradients or both");
    DdpBuckets d;
    parse_old_buckets_phases(j["ddp_old_buckets"].get<std::string>(), where, d);
    f.ddp_old_buckets = old_buckets_phases_name(d);
  }
  flag("grads_in_backward", f.grads_in_backward);
  flag("fp32_residual", f.fp32_residual);
  flag("eager_fp32_loss", f.eager_fp32_loss);
  if (j.contains("accounting")) {
    const std::string where = file + ": key 'accounting'";
    if (!j["accounting"].is_string()) throw InputError(where + ": expected zero, deepspeed, megatron or fsdp2");
    f.accounting = j["accounting"].get<std::string>();
    if (f.accounting != "zero" && f.accounting != "deepspeed" && f.accounting != "megatron" && f.accounting != "fsdp2")
      throw InputError(where + ": '" + excerpt(f.accounting) + "': expected zero, deepspeed, megatron or fsdp2");
  }
  flag("sequence_parallel", f.sequence_parallel);
  if (j.contains("context_parallel"))
    f.context_parallel =
        static_cast<int>(require_integer(j, "context_parallel", file, "", rules::int_in(1, kMaxReplicas)));
  if (j.contains("overlap")) {
    const ordered_json& o = j["overlap"];
    if (!o.is_object()) throw InputError(file + ": key 'overlap' must be an object");
    f.overlap_recorded = true;
    auto oflag = [&](const char* key, bool& out) {
      if (!o.contains(key)) return;
      if (!o[key].is_boolean()) throw InputError(file + ": key 'overlap." + key + "' must be true or false");
      out = o[key].get<bool>();
    };
    oflag("grad_reduce", f.overlap.grad_reduce);
    oflag("param_gather", f.overlap.param_gather);
    const NumberRule bucket = rules::non_negative_up_to(1e13);
    if (o.contains("grad_bucket_params"))
      f.overlap.grad_bucket_params = require_number(o, "grad_bucket_params", file, "overlap.", bucket);
    if (o.contains("param_bucket_params"))
      f.overlap.param_bucket_params = require_number(o, "param_bucket_params", file, "overlap.", bucket);
  }
}

}  // namespace

PlanFile plan_file_from_json(const ordered_json& in, const std::string& file) {
  const ordered_json* j = &in;
  if (!in.is_object()) throw InputError(file + ": expected a JSON object (a plan from `hetplan search --json`)");
  if (in.contains("best") && !in.contains("device_groups")) {
    if (in["best"].is_null()) throw InputError(file + ": key 'best' is null (the search found no plan)");
    if (!in["best"].is_object()) throw InputError(file + ": key 'best' must be an object (a plan)");
    j = &in["best"];
  }
  PlanFile f;
  const ordered_json& model = j->contains("model") ? (*j)["model"] : require_key(in, "model", file, "");
  if (!model.is_object()) throw InputError(file + ": key 'model' must be an object");
  f.model = model_from_json(model, file);
  if (model.contains("architecture")) read_architecture(model["architecture"], file, f);
  const NumberRule gbs_rule = rules::int_in(1, kMaxGlobalBatch);
  f.gbs = static_cast<int>(j->contains("gbs") ? require_integer(*j, "gbs", file, "", gbs_rule)
                                              : require_integer(in, "gbs", file, "", gbs_rule));
  auto str = [&](const char* key, std::string& out) {
    if (j->contains(key) && (*j)[key].is_string()) out = (*j)[key].get<std::string>();
    else if (in.contains(key) && in[key].is_string()) out = in[key].get<std::string>();
  };
  str("hostfile", f.hostfile);
  str("clusterfile", f.clusterfile);
  str("profile_dir", f.profile_dir);

  PlanResult& p = f.plan;
  if (j->contains("cost") && (*j)["cost"].is_number()) p.cost = number_value((*j)["cost"], file, "cost");
  const ordered_json& ns = require_array(*j, "node_sequence", file, "");
  for (const auto& t : ns) {
    if (!t.is_string()) throw InputError(file + ": key 'node_sequence' must be a list of device type names");
    p.node_sequence.push_back(t.get<std::string>());
  }
  const std::size_t max_stages = kMaxModelLayers;
  for (double g : require_number_list(*j, "device_groups", file, "", rules::int_in(1, kMaxClusterGpus), max_stages))
    p.device_groups.push_back(static_cast<int>(g));
  for (double l : require_number_list(*j, "layer_partition", file, "", rules::int_in(0, kMaxModelLayers), max_stages + 1))
    p.layer_partition.push_back(static_cast<int>(l));
  p.batches = static_cast<int>(require_integer(*j, "batches", file, "", rules::int_in(1, kMaxGlobalBatch)));
  if (j->contains("num_repartition"))
    p.num_repartition = static_cast<int>(require_integer(*j, "num_repartition", file, "", rules::int_in(0, 1e9)));
  const ordered_json& st = require_array(*j, "strategies", file, "");
  for (std::size_t i = 0; i < st.size(); ++i) {
    const std::string key = "strategies[" + std::to_string(i) + "]";
    if (!st[i].is_array() || st[i].size() != 2)
      throw InputError(file + ": key '" + key + "' must be [dp, tp]");
    const NumberRule degree = rules::int_in(1, kMaxClusterGpus);
    p.strategies.push_back(Strategy{static_cast<int>(number_value(st[i][0], file, key + "[0]", degree)),
                                    static_cast<int>(number_value(st[i][1], file, key + "[1]", degree))});
  }

  const std::size_t stages = p.device_groups.size();
  if (stages == 0) throw InputError(file + ": key 'device_groups' is empty");
  if (p.strategies.size() != stages)
    throw InputError(file + ": 'strategies' has " + std::to_string(p.strategies.size()) + " entries, expected one per " +
                     "device group (" + std::to_string(stages) + ")");
  if (p.layer_partition.size() != stages + 1)
    throw InputError(file + ": 'layer_partition' has " + std::to_string(p.layer_partition.size()) +
                     " entries, expected stages + 1 = " + std::to_string(stages + 1));
  for (std::size_t s = 0; s < stages; ++s) {
    const Strategy x = p.strategies[s];
    const auto gpus = checked_mul(x.dp, x.tp);
    if (!gpus || *gpus != p.device_groups[s])
      throw InputError(file + ": 'strategies[" + std::to_string(s) + "]' = [" + std::to_string(x.dp) + ", " +
                       std::to_string(x.tp) + "] does not use the " + std::to_string(p.device_groups[s]) +
                       " GPUs of its device group (expected dp * tp = group size)");
  }
  for (std::size_t s = 0; s < p.strategies.size(); ++s)
    if (p.strategies[s].dp > kMaxReplicas)
      throw InputError(file + ": key 'strategies[" + std::to_string(s) + "][0]' = " +
                       std::to_string(p.strategies[s].dp) + ": more data-parallel replicas than the " +
                       std::to_string(kMaxReplicas) + " a stage may have (expected dp <= " +
                       std::to_string(kMaxReplicas) + ")");
  // Every layer in exactly one stage, every stage at least one layer.
  bool covers = p.layer_partition.front() == 0 && p.layer_partition.back() == f.model.num_layers;
  for (std::size_t s = 0; s < stages; ++s) covers = covers && p.layer_partition[s + 1] > p.layer_partition[s];
  if (!covers)
    throw InputError(file + ": key 'layer_partition' = " + list_text(p.layer_partition) +
                     ": expected 0 first, model.num_layers (" + std::to_string(f.model.num_layers) +
                     ") last and strictly increasing entries (every layer in one stage, every stage at least one "
                     "layer); a plan that drops layers can be avoided with `search --reject-dropped-layers`");
  if (f.gbs % p.batches != 0) throw InputError(file + ": expected 'batches' >= 1 dividing 'gbs'");
  read_setup(*j, file, f);
  // Every data-parallel replica takes a sample of each micro-batch; under context parallelism every cp group
  // of replicas (dp / cp of them, Megatron's data-parallel size), whose ranks share its samples.
  const int cp = f.context_parallel;
  for (std::size_t s = 0; s < stages; ++s) {
    const int dp = p.strategies[s].dp;
    if (dp % cp != 0)
      throw InputError(file + ": key 'context_parallel' = " + std::to_string(cp) + ": does not divide stage " +
                       std::to_string(s) + "'s dp " + std::to_string(dp) + " (expected dp a multiple of cp)");
    if (f.gbs / p.batches < dp / cp)
      throw InputError(file + ": key 'batches' = " + std::to_string(p.batches) + ": a micro-batch of gbs / batches = " +
                       std::to_string(f.gbs / p.batches) + " sequences cannot feed the " + std::to_string(dp / cp) +
                       " data-parallel replicas of stage " + std::to_string(s) +
                       (cp > 1 ? " (its dp / context_parallel)" : "") + " (expected gbs / batches >= dp / cp)");
  }
  return f;
}

namespace {

// A relative `name` from the plan file at `plan_path`: the path next to the plan when something is there
// (an exported folder works from any working directory), else `name` as written (the working directory).
std::string next_to_plan(const std::string& plan_path, const std::string& name) {
  if (name.empty() || name[0] == '/') return name;
  const std::size_t slash = plan_path.rfind('/');
  if (slash == std::string::npos) return name;
  const std::string beside = plan_path.substr(0, slash + 1) + name;
  return file_kind(beside) == "missing" ? name : beside;
}

}  // namespace

PlanFile read_plan_file(const std::string& path) {
  PlanFile f = plan_file_from_json(read_json_file(path), path);
  f.hostfile = next_to_plan(path, f.hostfile);
  f.clusterfile = next_to_plan(path, f.clusterfile);
  f.profile_dir = next_to_plan(path, f.profile_dir);
  return f;
}

}  // namespace hetplan
