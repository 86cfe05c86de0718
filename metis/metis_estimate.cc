#include "metis/metis_estimate.h"

#include <algorithm>

#include "metis/inter_stage.h"
#include "metis/layer_balancer.h"
#include "metis/metis_search.h"
#include "base/input_error.h"
#include "sim/rank_layout.h"

namespace hetplan {

MetisEstimate metis_estimate(const Cluster& cluster, const ProfileSet& profiles, const PlanFile& pf,
                             const MetisEstimateOptions& options) {
  const PlanResult& plan = pf.plan;
  // The search's own checks: every cluster type has profiles, the model matches them.
  SearchOptions so;
  so.model = pf.model;
  so.gbs = pf.gbs;
  const MetisSearch search(cluster, profiles, so);
  const std::vector<int>& profile_type = search.profile_type();

  // Metis's node sequences are the permutations of the cluster's device types.
  std::vector<int> ns;
  for (const auto& name : plan.node_sequence) {
    const int t = cluster.type_index(name);
    if (t < 0) throw InputError("plan: node_sequence names '" + excerpt(name) + "', which the cluster does not have");
    if (std::find(ns.begin(), ns.end(), t) != ns.end())
      throw InputError("plan: node_sequence names '" + excerpt(name) + "' twice");
    ns.push_back(t);
  }
  if (ns.size() != cluster.device_types().size())
    throw InputError("plan: node_sequence names " + std::to_string(ns.size()) + " device types, but the cluster has " +
                     std::to_string(cluster.device_types().size()) + " (Metis orders all of them)");
  if (plan.batches < 1 || pf.gbs % plan.batches != 0)
    throw InputError("plan: batches = " + std::to_string(plan.batches) + " does not divide the global batch size " +
                     std::to_string(pf.gbs));
  const RankLayout layout(cluster, ns);
  int total = 0;
  for (int g : plan.device_groups) total += g;
  if (total != layout.num_ranks())
    throw InputError("plan: device_groups use " + std::to_string(total) + " GPUs, but the cluster has " +
                     std::to_string(layout.num_ranks()));

  InterStagePlan isp;
  isp.ns_idx = 0;
  isp.device_groups = &plan.device_groups;
  isp.num_stage = isp.num_stages();  // the true label (see the header)
  isp.batches = plan.batches;
  isp.gbs = pf.gbs;
  std::vector<int> rank_ptypes;
  for (int t : layout.rank_types()) rank_ptypes.push_back(profile_type[t]);

  MetisEstimate out;
  const int max_bs = options.max_profiled_batch_size > 0 ? options.max_profiled_batch_size : profiles.max_bs();
  const MetisCostModel cost_model(profiles, pf.model, profile_type, max_bs);
  SkippedPlan skip;
  out.costed = cost_model.cost(isp, layout, plan.strategies.data(), plan.layer_partition.data(), &out.terms, &skip);
  if (!out.costed) out.skipped = profiles.expected_path(skip.type, skip.tp, skip.bs) + ": " + skip.reason;

  // The search's visits of these groups (metis/metis_search.cc walks the same list).
  InterStagePlanGenerator generator(metis_inter_stage_options(cluster, pf.gbs, pf.model.num_layers,
                                                              options.min_group_scale_variance, options.max_permute_len));
  const std::vector<InterStagePlan> visits = generator.all();
  const auto& sequences = generator.node_sequences();
  for (const InterStagePlan& v : visits) {
    if (sequences[v.ns_idx] != ns || v.batches != plan.batches || *v.device_groups != plan.device_groups) continue;
    out.visit_labels.push_back(v.num_stage);
    if (v.num_stage < isp.num_stages() && out.label == 0) {
      out.label = v.num_stage;
      InterStagePlan labelled = isp;
      labelled.num_stage = v.num_stage;
      out.label_costed = cost_model.cost(labelled, layout, plan.strategies.data(), plan.layer_partition.data(),
                                         &out.label_terms, &skip);
      if (!out.label_costed) out.label_skipped = profiles.expected_path(skip.type, skip.tp, skip.bs) + ": " + skip.reason;
    }
  }

  const int stages = isp.num_stages();
  const LayerLoadBalancer balancer(profiles, profiles.model().norm_layer_duration);
  out.stage_memory_mb.assign(stages, 0.0);
  try {
    balancer.stage_memory_demand(isp, rank_ptypes, plan.strategies.data(), plan.layer_partition.data(),
                                 out.stage_memory_mb.data());
    out.memory_known = true;
  } catch (const MissingProfileError& e) {
    out.memory_skipped = e.what();
    out.stage_memory_mb.clear();
  }
  int begin = 0;
  for (int s = 0; s < stages; ++s) {
    const int end = begin + plan.device_groups[s];
    out.stage_capacity_mb.push_back(layout.memory_capacity_mb(begin, end));
    if (out.memory_known)
      for (int r = begin; r < end; ++r) out.ranks.push_back(MetisRankMemory{r, s, out.stage_memory_mb[s]});
    begin = end;
  }
  return out;
}

namespace {

ordered_json terms_json(const CostTerms& t) {
  return {{"execution", t.execution}, {"fb_sync", t.fb_sync}, {"parameter_update", t.parameter_update},
          {"dp", t.dp},           {"pp", t.pp},           {"batch_generate", t.batch_generate},
          {"total", t.total}};
}

}  // namespace

ordered_json metis_estimate_to_json(const MetisEstimate& e) {
  ordered_json j;
  j["cost_model"] = "metis";
  j["iteration_ms"] = e.costed ? ordered_json(e.terms.total) : ordered_json(nullptr);
  if (e.costed) {
    j["terms"] = terms_json(e.terms);
  } else {
    j["skipped"] = e.skipped;
  }
  ordered_json ranks = ordered_json::array();
  for (const MetisRankMemory& r : e.ranks) ranks.push_back({{"rank", r.rank}, {"stage", r.stage}, {"memory_mb", r.memory_mb}});
  j["ranks"] = ranks;
  ordered_json stages = ordered_json::array();
  for (std::size_t s = 0; s < e.stage_capacity_mb.size(); ++s) {
    ordered_json st;
    st["stage"] = static_cast<int>(s);
    st["memory_mb"] = e.memory_known ? ordered_json(e.stage_memory_mb[s]) : ordered_json(nullptr);
    st["capacity_mb"] = e.stage_capacity_mb[s];
    stages.push_back(st);
  }
  j["stages"] = stages;
  if (!e.memory_known) j["memory_skipped"] = e.memory_skipped;
  j["search_visits"] = e.visit_labels;
  if (e.label > 0) {
    ordered_json l;
    l["num_stage"] = e.label;
    l["iteration_ms"] = e.label_costed ? ordered_json(e.label_terms.total) : ordered_json(nullptr);
    if (e.label_costed) l["terms"] = terms_json(e.label_terms);
    else l["skipped"] = e.label_skipped;
    j["search_label"] = l;
  }
  return j;
}

}  // namespace hetplan
