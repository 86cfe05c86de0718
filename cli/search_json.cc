#include "cli/search_json.h"

#include <cmath>

#include <tuple>

#include "planner/export_plan.h"
#include "sim/parallel_layout.h"
#include "sim/rank_layout.h"

namespace hetplan {

namespace {

// "best" and "top": entry(i) for each of the n plans, cheapest first.
template <typename Entry>
void add_best_and_top(std::size_t n, const Entry& entry, ordered_json* j) {
  (*j)["best"] = n == 0 ? ordered_json(nullptr) : entry(0);
  ordered_json top = ordered_json::array();
  for (std::size_t i = 0; i < n; ++i) top.push_back(entry(i));
  (*j)["top"] = top;
}

// What a search was run on: the model, the global batch and the input paths.
void add_search_context(const PlanFile& context, ordered_json* j) {
  (*j)["model"] = model_to_json(context.model);
  (*j)["gbs"] = context.gbs;
  (*j)["hostfile"] = context.hostfile;
  (*j)["clusterfile"] = context.clusterfile;
  (*j)["profile_dir"] = context.profile_dir;
}

// The counts of a default or cost-objective search (PlanSearchResult, ObjectiveSearchResult): what it enumerated,
// pruned, costed and found infeasible, its seconds, and whether (and why) it was cut short.
template <typename Result>
void add_search_counts(const Result& r, ordered_json* j) {
  (*j)["enumerated"] = r.enumerated;
  (*j)["pruned"] = r.pruned;
  (*j)["costed"] = r.costed;
  (*j)["infeasible"] = r.infeasible;
  (*j)["seconds"] = r.seconds;
  (*j)["cut_short"] = r.cut_short;
  if (r.cut_short) (*j)["cut_reason"] = r.cut_reason;
}

// The GPUs' hourly prices: per type, usd_per_gpu_hour and its source.
ordered_json prices_json(const Cluster& cluster) {
  ordered_json prices = ordered_json::object();
  for (int t = 0; t < static_cast<int>(cluster.device_types().size()); ++t)
    prices[cluster.device_types()[t]] = {{"usd_per_gpu_hour", cluster.price_per_gpu_hour(t)},
                                         {"source", cluster.price_source(t)}};
  return prices;
}

}  // namespace

ordered_json search_result_to_json(const SearchResult& r, double average_ms, int trials, const PlanFile& context,
                                   const std::vector<std::pair<int, std::string>>& settings) {
  auto entry = [&](std::size_t i) {
    PlanFile f = context;
    f.plan = r.top[i];
    if (i < settings.size()) std::tie(f.zero_stage, f.recompute) = settings[i];
    return plan_file_to_json(f);
  };
  ordered_json j;
  j["count"] = r.count;
  j["average_ms"] = average_ms;
  j["trials"] = trials;
  add_best_and_top(r.top.size(), entry, &j);
  j["inter_stage_plans"] = r.inter_stage_plans;
  j["candidates"] = r.candidates;
  j["skipped"] = r.skipped;
  j["dropped_layers"] = r.dropped_layers;
  add_search_context(context, &j);
  return j;
}

ordered_json rank_placement_json(const Cluster& cluster, const PlanResult& plan) {
  const RankLayout layout(cluster, cluster.type_indices(plan.node_sequence));
  const ParallelLayout placement(cluster, layout);
  const PipelineGrid stages(plan.strategies);
  ordered_json ranks = ordered_json::array();
  for (int i = 0; i < stages.num_stages(); ++i) {
    const StageGrid& st = stages.stage(i);
    for (int r = st.begin; r < st.end() && r < layout.num_ranks(); ++r)
      ranks.push_back({{"rank", r},
                       {"host", placement.host(r)},
                       {"local_gpu", placement.local_gpu(r)},
                       {"device", cluster.device_types()[layout.type_of(r)]},
                       {"stage", i},
                       {"dp_index", st.replica(r)},
                       {"tp_index", st.tp_index(r)}});
  }
  return ranks;
}

ordered_json searched_plan_json(const SearchedPlan& p, const Cluster& cluster, const std::vector<TrainingSetup>& setups,
                                const PlanFile& context, const std::string& schedule) {
  PlanFile f = context;
  f.plan = p.plan;
  const TrainingSetup& s = setups[p.setup];
  f.zero_stage = s.zero_stage;
  f.recompute = to_string(s.recompute);
  f.sequence_parallel = s.sequence_parallel;
  f.context_parallel = s.context_parallel;
  f.overlap = s.overlap;
  f.overlap_recorded = true;
  f.schedule = p.virtual_stages > 1 ? "interleaved" : schedule;
  f.virtual_stages = p.virtual_stages;
  ordered_json j = plan_file_to_json(f);
  j["ranks"] = rank_placement_json(cluster, f.plan);
  // Which exporters take it as is: each exporter's own checks (planner/export_plan.h).
  const RankLayout layout(cluster, cluster.type_indices(f.plan.node_sequence));
  const ParallelLayout placement(cluster, layout);
  std::vector<std::pair<std::string, std::string>> refusals;
  j["exporters"] = accepting_exporters(f, f.shape ? *f.shape : shape_from_model_config(f.model), placement, &refusals);
  if (!refusals.empty()) {
    ordered_json why = ordered_json::object();
    for (const auto& [name, reason] : refusals) why[name] = reason;
    j["exporters_refused"] = why;
  }
  return j;
}

ordered_json plan_search_result_to_json(const PlanSearchResult& r, const Cluster& cluster,
                                        const std::vector<TrainingSetup>& setups, const PlanFile& context,
                                        const std::string& schedule) {
  auto entry = [&](std::size_t i) { return searched_plan_json(r.top[i], cluster, setups, context, schedule); };
  ordered_json j;
  j["cost_model"] = "sim";
  add_best_and_top(r.top.size(), entry, &j);
  add_search_counts(r, &j);
  // The proof: null where unknown (no plan; no bound), lower_bound_ms null also where no plan is left.
  auto number_or_null = [](double x, bool known) { return known ? ordered_json(x) : ordered_json(nullptr); };
  j["best_ms"] = number_or_null(r.best_ms, r.best_ms >= 0);
  j["lower_bound_ms"] = number_or_null(r.lower_bound_ms, std::isfinite(r.lower_bound_ms));
  j["gap"] = number_or_null(r.gap, std::isfinite(r.gap));
  j["gap_asked"] = r.gap_asked;
  j["proven"] = r.proven;
  j["space_empty"] = r.space_empty;
  j["first_plan_seconds"] = number_or_null(r.first_plan_s, r.first_plan_s >= 0);
  j["seed_plans_costed"] = r.seeds_costed;
  add_search_context(context, &j);
  return j;
}

ordered_json objective_search_result_to_json(const ObjectiveSearchResult& r, const Cluster& cluster,
                                             const std::vector<TrainingSetup>& setups, const PlanFile& context,
                                             const std::string& schedule, double deadline_ms,
                                             const std::vector<std::string>& subset_hostfiles) {
  auto entry = [&](std::size_t i) {
    const PricedPlan& p = r.top[i];
    PlanFile c = context;
    if (!subset_hostfiles[p.subset].empty()) c.hostfile = subset_hostfiles[p.subset];
    ordered_json j = searched_plan_json(p.searched, r.clusters[p.subset], setups, c, schedule);
    j["usd_per_iteration"] = p.usd_per_iteration;
    j["usd_per_hour"] = p.usd_per_hour;
    j["gpus_used"] = r.clusters[p.subset].num_devices();
    j["sub_cluster"] = r.subsets[p.subset].label;
    return j;
  };
  ordered_json j;
  j["cost_model"] = "sim";
  j["objective"] = "cost";
  if (deadline_ms > 0) j["deadline_ms"] = deadline_ms;
  add_best_and_top(r.top.size(), entry, &j);
  j["prices"] = prices_json(cluster);
  j["sub_clusters_searched"] = r.subsets.size();
  add_search_counts(r, &j);
  add_search_context(context, &j);
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
