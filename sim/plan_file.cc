#include "sim/plan_file.h"

#include "sim/input_error.h"
#include "sim/memory_model.h"

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
  m.num_layers = static_cast<int>(require_number(j, "num_layers", file, "model"));
  m.hidden_size = static_cast<int>(require_number(j, "hidden_size", file, "model"));
  m.sequence_length = static_cast<int>(require_number(j, "sequence_length", file, "model"));
  m.vocab_size = static_cast<int>(require_number(j, "vocab_size", file, "model"));
  if (j.contains("attention_heads")) m.attention_heads = static_cast<int>(require_number(j, "attention_heads", file, "model"));
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
  return j;
}

PlanFile plan_file_from_json(const ordered_json& in, const std::string& file) {
  const ordered_json* j = &in;
  if (in.is_object() && in.contains("best") && !in.contains("device_groups")) {
    if (in["best"].is_null()) throw InputError(file + ": key 'best' is null (the search found no plan)");
    j = &in["best"];
  }
  PlanFile f;
  const ordered_json& model = j->contains("model") ? (*j)["model"] : require_key(in, "model", file, "");
  f.model = model_from_json(model, file);
  f.gbs = static_cast<int>(j->contains("gbs") ? require_number(*j, "gbs", file, "") : require_number(in, "gbs", file, ""));
  auto str = [&](const char* key, std::string& out) {
    if (j->contains(key) && (*j)[key].is_string()) out = (*j)[key].get<std::string>();
    else if (in.contains(key) && in[key].is_string()) out = in[key].get<std::string>();
  };
  str("hostfile", f.hostfile);
  str("clusterfile", f.clusterfile);
  str("profile_dir", f.profile_dir);

  PlanResult& p = f.plan;
  if (j->contains("cost") && (*j)["cost"].is_number()) p.cost = (*j)["cost"].get<double>();
  const ordered_json& ns = require_key(*j, "node_sequence", file, "");
  for (const auto& t : ns) {
    if (!t.is_string()) throw InputError(file + ": key 'node_sequence' must be a list of device type names");
    p.node_sequence.push_back(t.get<std::string>());
  }
  for (double g : require_number_list(*j, "device_groups", file, "")) p.device_groups.push_back(static_cast<int>(g));
  for (double l : require_number_list(*j, "layer_partition", file, "")) p.layer_partition.push_back(static_cast<int>(l));
  p.batches = static_cast<int>(require_number(*j, "batches", file, ""));
  if (j->contains("num_repartition")) p.num_repartition = static_cast<int>(require_number(*j, "num_repartition", file, ""));
  const ordered_json& st = require_key(*j, "strategies", file, "");
  for (std::size_t i = 0; i < st.size(); ++i) {
    if (!st[i].is_array() || st[i].size() != 2 || !st[i][0].is_number_integer() || !st[i][1].is_number_integer())
      throw InputError(file + ": key 'strategies[" + std::to_string(i) + "]' must be [dp, tp]");
    p.strategies.push_back(Strategy{st[i][0].get<int>(), st[i][1].get<int>()});
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
    if (x.dp < 1 || x.tp < 1 || x.dp * x.tp != p.device_groups[s])
      throw InputError(file + ": 'strategies[" + std::to_string(s) + "]' = [" + std::to_string(x.dp) + ", " +
                       std::to_string(x.tp) + "] does not use the " + std::to_string(p.device_groups[s]) +
                       " GPUs of its device group (expected dp * tp = group size)");
    if (p.layer_partition[s + 1] < p.layer_partition[s])
      throw InputError(file + ": 'layer_partition' must be non-decreasing");
  }
  if (p.batches < 1 || f.gbs < 1 || f.gbs % p.batches != 0)
    throw InputError(file + ": expected 'batches' >= 1 dividing 'gbs'");
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
  return f;
}

PlanFile read_plan_file(const std::string& path) { return plan_file_from_json(read_json_file(path), path); }

}  // namespace hetplan
