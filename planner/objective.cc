#include "planner/objective.h"

#include <algorithm>
#include <chrono>

#include "base/input_error.h"

namespace hetplan {

Objective parse_objective(const std::string& text, const std::string& flag) {
  if (text == "time") return Objective::kTime;
  if (text == "cost") return Objective::kCost;
  throw InputError(flag + ": '" + excerpt(text) + "': expected time (least iteration time) or cost (least USD per " +
                   "iteration: time x the GPUs' hourly price)");
}

double cluster_price_per_hour(const Cluster& cluster, const std::string& where) {
  double sum = 0;
  for (int t = 0; t < static_cast<int>(cluster.device_types().size()); ++t) {
    const double p = cluster.price_per_gpu_hour(t);
    if (p < 0) {
      if (where.empty()) return -1;
      throw InputError(where + ": device type '" + excerpt(cluster.device_types()[t]) +
                       "' has no hourly price (the GPU catalogue has none for it): give its entries "
                       "\"price_per_gpu_hour\" (USD per GPU-hour) in the clusterfile");
    }
    sum += p * cluster.num_devices_of(t);
  }
  return sum;
}

namespace {

// Each type's node counts: all of 0..n, or 0, 1, 2, 4, ... and n.
std::vector<int> counts_of(int n, bool thin) {
  std::vector<int> v;
  for (int c = 0; c <= n; c = thin ? (c == 0 ? 1 : 2 * c) : c + 1) v.push_back(c);
  if (v.back() != n) v.push_back(n);
  return v;
}

std::string subset_label(const Cluster& c, const std::vector<int>& per_type, int gpus) {
  std::string s;
  for (std::size_t t = 0; t < per_type.size(); ++t) {
    if (per_type[t] == 0) continue;
    s += (s.empty() ? "" : ", ") + std::to_string(per_type[t]) + " x " + c.device_types()[t] +
         (per_type[t] == 1 ? " node" : " nodes");
  }
  return s + " (" + std::to_string(gpus) + " GPUs)";
}

}  // namespace

std::vector<NodeSubset> node_subsets(const Cluster& cluster, int max_subsets, bool* reduced) {
  const int nt = static_cast<int>(cluster.device_types().size());
  std::vector<int> nodes_of(nt, 0);
  for (const ClusterNode& n : cluster.nodes()) ++nodes_of[n.type];
  double all = 1;
  for (int t = 0; t < nt; ++t) all *= nodes_of[t] + 1;
  *reduced = all - 1 > max_subsets;
  std::vector<std::vector<int>> counts(nt);
  for (int t = 0; t < nt; ++t) counts[t] = counts_of(nodes_of[t], *reduced);
  std::vector<NodeSubset> out;
  std::vector<int> at(nt, 0);
  for (;;) {
    NodeSubset s;
    bool any = false;
    for (int t = 0; t < nt; ++t) {
      s.nodes_per_type.push_back(counts[t][at[t]]);
      any |= s.nodes_per_type.back() > 0;
    }
    if (any) {
      std::vector<int> taken(nt, 0);
      int gpus = 0;
      for (const ClusterNode& n : cluster.nodes())
        if (taken[n.type] < s.nodes_per_type[n.type]) {
          ++taken[n.type];
          s.hosts.emplace_back(n.ip, n.num_devices);
          gpus += n.num_devices;
        }
      s.label = subset_label(cluster, s.nodes_per_type, gpus);
      out.push_back(std::move(s));
    }
    int t = 0;
    while (t < nt && ++at[t] == static_cast<int>(counts[t].size())) at[t++] = 0;
    if (t == nt) break;
  }
  // The whole cluster first, then larger sub-clusters before smaller ones (a stable, documented order).
  std::stable_sort(out.begin(), out.end(), [](const NodeSubset& a, const NodeSubset& b) {
    return a.hosts.size() > b.hosts.size();
  });
  return out;
}

Cluster subset_cluster(const Cluster& cluster, const NodeSubset& subset) {
  return Cluster::from_parts(subset.hosts, cluster.clusterfile(), cluster.hostfile_path(), cluster.clusterfile_path());
}

ObjectiveSearchResult search_objective(const Cluster& cluster, const ProfileSet& profiles, const ModelShape& shape,
                                       int sequence_length, const SimulationOptions& sim,
                                       const PlanSearchOptions& search, const ObjectiveOptions& objective) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const bool cost = objective.objective == Objective::kCost || objective.deadline_ms > 0;
  ObjectiveSearchResult out;
  if (cost) {
    out.subsets = node_subsets(cluster, objective.max_subsets, &out.reduced);
  } else {
    NodeSubset whole;
    for (const ClusterNode& n : cluster.nodes()) whole.hosts.emplace_back(n.ip, n.num_devices);
    whole.label = "the whole cluster (" + std::to_string(cluster.num_devices()) + " GPUs)";
    out.subsets.push_back(std::move(whole));
  }
  std::vector<PricedPlan> all;
  for (std::size_t i = 0; i < out.subsets.size(); ++i) {
    out.clusters.push_back(subset_cluster(cluster, out.subsets[i]));
    const Cluster& sub = out.clusters.back();
    PlanSearchOptions o = search;
    if (search.time_budget_s > 0) {
      const double left = search.time_budget_s - std::chrono::duration<double>(clock::now() - t0).count();
      if (left <= 0) {
        out.cut_short = true;
        out.cut_reason = "time budget";
        break;
      }
      o.time_budget_s = left;
    }
    const PlanSimulator simulator(sub, profiles, shape, sequence_length, sim);
    PlanSearchResult r;
    try {
      r = PlanSearch(sub, profiles, simulator, o).run();
    } catch (const InputError& e) {  // e.g. a sub-cluster too small for the model's pipeline
      if (out.first_infeasible_reason.empty()) out.first_infeasible_reason = out.subsets[i].label + ": " + e.what();
      continue;
    }
    out.enumerated += r.enumerated;
    out.pruned += r.pruned;
    out.costed += r.costed;
    out.infeasible += r.infeasible;
    if (out.first_infeasible_reason.empty() && !r.first_infeasible_reason.empty())
      out.first_infeasible_reason = r.first_infeasible_reason;
    if (!r.top.empty()) ++out.subsets_with_plans;
    const double price = cluster_price_per_hour(sub, "");
    for (SearchedPlan& p : r.top) {
      const double ms = p.plan.cost;
      if (out.fastest_ms < 0 || ms < out.fastest_ms) out.fastest_ms = ms;
      if (objective.deadline_ms > 0 && ms > objective.deadline_ms) continue;
      PricedPlan pp;
      pp.searched = std::move(p);
      pp.subset = static_cast<int>(i);
      pp.usd_per_hour = price;
      pp.usd_per_iteration = price >= 0 ? cost_per_iteration_usd(ms, price) : -1;
      all.push_back(std::move(pp));
    }
    if (r.cut_short) {
      out.cut_short = true;
      out.cut_reason = r.cut_reason;
      break;
    }
  }
  // Stable: equal keys keep the order the subsets and each search gave them.
  std::stable_sort(all.begin(), all.end(), [cost](const PricedPlan& a, const PricedPlan& b) {
    if (cost && a.usd_per_iteration != b.usd_per_iteration) return a.usd_per_iteration < b.usd_per_iteration;
    return a.searched.plan.cost < b.searched.plan.cost;
  });
  if (static_cast<int>(all.size()) > search.top_k) all.resize(search.top_k);
  out.top = std::move(all);
  out.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return out;
}

}  // namespace hetplan
