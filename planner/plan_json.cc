#include "planner/plan_json.h"


namespace hetplan {

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

ordered_json search_result_to_json(const SearchResult& r, double average_ms, int trials) {
  ordered_json j;
  j["count"] = r.count;
  j["average_ms"] = average_ms;
  j["trials"] = trials;
  j["best"] = r.top.empty() ? ordered_json(nullptr) : plan_to_json(r.top.front());
  ordered_json top = ordered_json::array();
  for (const auto& p : r.top) top.push_back(plan_to_json(p));
  j["top"] = top;
  j["inter_stage_plans"] = r.inter_stage_plans;
  j["candidates"] = r.candidates;
  j["skipped"] = r.skipped;
  j["dropped_layers"] = r.dropped_layers;
  return j;
}

std::string reference_plan_line(int rank, const PlanResult& p) {
  std::string s = std::to_string(rank) + ", " + python_float(p.cost) + ", (";
  for (std::size_t i = 0; i < p.node_sequence.size(); ++i)
    s += (i ? ", " : "") + p.node_sequence[i];
  if (p.node_sequence.size() == 1) s += ",";
  s += "), [";
  for (std::size_t i = 0; i < p.device_groups.size(); ++i) s += (i ? ", " : "") + std::to_string(p.device_groups[i]);
  s += "], [";
  for (std::size_t i = 0; i < p.strategies.size(); ++i)
    s += (i ? ", (" : "(") + std::to_string(p.strategies[i].dp) + ", " + std::to_string(p.strategies[i].tp) + ")";
  s += "], " + std::to_string(p.batches) + ", [";
  for (std::size_t i = 0; i < p.layer_partition.size(); ++i)
    s += (i ? ", " : "") + std::to_string(p.layer_partition[i]);
  return s + "]";
}

}  // namespace hetplan
