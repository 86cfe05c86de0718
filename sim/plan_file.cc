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
  j["gbs"] = f.gbs;
  if (!f.hostfile.empty()) j["hostfile"] = f.hostfile;
  if (!f.clusterfile.empty()) j["clusterfile"] = f.clusterfile;
  if (!f.profile_dir.empty()) j["profile_dir"] = f.profile_dir;
  if (f.zero_stage >= 0) j["zero_stage"] = f.zero_stage;
  if (!f.recompute.empty()) j["recompute"] = f.recompute;
  if (!f.schedule.empty()) j["schedule"] = f.schedule;
  return j;
}

namespace {

std::string list_text(const std::vector<int>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return excerpt(out + "]");
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
  for (std::size_t s = 0; s < stages; ++s)
    if (f.gbs / p.batches < p.strategies[s].dp)
      throw InputError(file + ": key 'batches' = " + std::to_string(p.batches) + ": a micro-batch of gbs / batches = " +
                       std::to_string(f.gbs / p.batches) + " sequences cannot feed the " +
                       std::to_string(p.strategies[s].dp) + " data-parallel replicas of stage " + std::to_string(s) +
                       " (expected gbs / batches >= dp)");
  if (j->contains("zero_stage")) {
    const double z = require_number(*j, "zero_stage", file, "");
    if (z != 0 && z != 1 && z != 2 && z != 3) throw InputError(file + ": key 'zero_stage': expected 0, 1, 2 or 3");
    f.zero_stage = static_cast<int>(z);
  }
  if (j->contains("recompute")) {
    const std::string where = file + ": key 'recompute'";
    if (!(*j)["recompute"].is_string()) throw InputError(where + ": expected none, selective or full");
    f.recompute = to_string(parse_recompute((*j)["recompute"].get<std::string>(), where));
  }
  if (j->contains("schedule")) {
    const std::string where = file + ": key 'schedule'";
    if (!(*j)["schedule"].is_string()) throw InputError(where + ": expected gpipe or 1f1b");
    f.schedule = to_string(parse_schedule((*j)["schedule"].get<std::string>(), where));
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
