#include "planner/search_settings.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "base/input_error.h"
#include "base/limits.h"
#include "planner/plan_search.h"
#include "planner/stage_search.h"
#include "sim/plan_cost.h"
#include "sim/rank_layout.h"

namespace hetplan {

std::vector<TrainingSetup> with_overlap_dimension(const std::vector<TrainingSetup>& setups,
                                                  const std::string& overlap) {
  if (overlap != "off" && overlap != "on" && overlap != "auto")
    throw InputError("--overlap: '" + excerpt(overlap) + "': expected off, on or auto");
  std::vector<TrainingSetup> out;
  for (const TrainingSetup& s : setups) {
    if (overlap != "on") out.push_back(s);
    if (overlap == "off") continue;
    TrainingSetup o = s;
    o.overlap.grad_reduce = true;
    o.overlap.param_gather = s.zero_stage >= 1;
    out.push_back(o);
  }
  return out;
}

std::vector<int> parse_context_parallel(const std::string& cp, int sequence_length, int gpus) {
  auto balances = [&](int n) { return n == 1 || sequence_length % (2 * n) == 0; };
  if (cp == "auto") {
    std::vector<int> out{1};
    for (int n = 2; n <= gpus && balances(n); n *= 2) out.push_back(n);
    return out;
  }
  int n = 0;
  std::size_t used = 0;
  try {
    n = std::stoi(cp, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != cp.size() || n < 1 || n > kMaxReplicas)
    throw InputError("--cp: '" + excerpt(cp) + "': expected auto or a whole number from 1 to " +
                     std::to_string(kMaxReplicas));
  if (!balances(n))
    throw InputError("--cp " + cp + ": the sequence length " + std::to_string(sequence_length) +
                     " is not a multiple of 2 x cp = " + std::to_string(2 * n) +
                     " (Megatron splits each sequence into 2 x cp chunks to balance the causal mask)");
  return {n};
}

std::vector<TrainingSetup> with_context_parallel_dimension(const std::vector<TrainingSetup>& setups,
                                                           const std::vector<int>& cps) {
  std::vector<TrainingSetup> out;
  for (const int n : cps)
    for (TrainingSetup s : setups) {
      s.context_parallel = n;
      out.push_back(s);
    }
  return out;
}

std::vector<std::vector<int>> context_parallel_parts(const std::vector<TrainingSetup>& setups) {
  std::vector<int> sizes;
  for (const TrainingSetup& s : setups) sizes.push_back(s.context_parallel);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<std::vector<int>> parts(sizes.size());
  for (std::size_t k = 0; k < setups.size(); ++k)
    parts[std::lower_bound(sizes.begin(), sizes.end(), setups[k].context_parallel) - sizes.begin()].push_back(
        static_cast<int>(k));
  return parts;
}

std::string parallel_setup_suffix(const TrainingSetup& s) {
  std::string out;
  if (s.sequence_parallel) out += ", sequence parallel";
  if (s.context_parallel > 1) out += ", cp " + std::to_string(s.context_parallel);
  if (s.overlap.any()) out += ", overlapped communication";
  return out;
}

namespace {

// The node order's index among the permutations of the cluster's types in lexicographic order (the
// search's NodeOrder::index), from the plan's node sequence.
int node_order_index(const PlanResult& p, const Cluster& cluster) {
  const std::vector<std::string>& types = cluster.device_types();
  const int n = static_cast<int>(p.node_sequence.size());
  std::vector<char> used(types.size(), 0);
  long long index = 0;
  for (int i = 0; i < n; ++i) {
    const int t = static_cast<int>(std::find(types.begin(), types.end(), p.node_sequence[i]) - types.begin());
    int smaller = 0;
    for (int u = 0; u < t; ++u) smaller += used[u] ? 0 : 1;
    used[t] = 1;
    long long f = 1;
    for (int k = 2; k < n - i; ++k) f *= k;
    index += smaller * f;
  }
  return static_cast<int>(index);
}

}  // namespace

std::vector<int> plan_key_order(const PlanResult& p, const Cluster& cluster) {
  std::vector<int> order{node_order_index(p, cluster), p.batches, static_cast<int>(p.device_groups.size())};
  for (std::size_t i = 0; i < p.device_groups.size(); ++i) {
    order.push_back(p.device_groups[i]);
    order.push_back(p.strategies[i].dp);
    order.push_back(p.layer_partition[i + 1] - p.layer_partition[i]);
  }
  return order;
}

bool settings_bind_memory(const Cluster& cluster, const ProfileSet& profiles, const PlanSimulator& sim,
                          const std::vector<TrainingSetup>& setups) {
  std::vector<int> identity(cluster.device_types().size());
  for (std::size_t t = 0; t < identity.size(); ++t) identity[t] = static_cast<int>(t);
  const RankLayout layout(cluster, identity);
  const PlanCostModel cost(sim, layout, setups);
  const int layers = profiles.num_layers();
  for (int node = 0, first = 0; first < layout.num_ranks(); first = layout.node_end(node++)) {
    const int pt = profiles.type_index(cluster.device_types()[layout.type_of(first)]);
    int tp = 0;  // the node's largest tp: profiled, within the node, splitting the heads
    for (const LayerProfile& e : profiles.entries())
      if (e.tp > tp && e.tp <= layout.node_size(node) && profiles.find(pt, e.tp, e.bs) == &e &&
          tp_splits_heads(sim.shape(), e.tp))
        tp = e.tp;
    if (tp > 0 && cost.state_bytes_lower_bound(tp, 1, 0, layers) <= cost.rank_capacity_bytes(first)) return false;
  }
  return true;
}

std::vector<std::vector<int>> setting_parts(const std::vector<TrainingSetup>& setups) {
  std::vector<std::vector<int>> parts(2);
  for (std::size_t k = 0; k < setups.size(); ++k)
    parts[setups[k].recompute == Recompute::kFull ? 1 : 0].push_back(static_cast<int>(k));
  if (parts[1].empty()) parts.pop_back();
  if (parts[0].empty()) parts.erase(parts.begin());
  return parts;
}

// The parts in turn (planner/plan_search.md, "Settings in parts"): each an exact search over the plans
// of its settings, its threshold set from the start by the plans found before it; their best plans
// merged, each plan once at its fastest setting (the first on ties, as the joint search's leaf).
PlanSearchResult PlanSearch::search_parts(const std::vector<std::vector<int>>& parts, bool whole) const {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  struct Found {
    double cost;
    std::vector<int> order;
    int setup;
    SearchedPlan plan;
  };
  std::vector<Found> found;
  PlanSearchResult all;
  all.gap_asked = opt_.gap;
  all.lower_bound_ms = std::numeric_limits<double>::infinity();
  all.space_empty = true;
  for (const std::vector<int>& part : parts) {
    if (opt_.cancel && opt_.cancel->load()) {
      all.cut_short = true;
      all.cut_reason = "interrupted";
      all.space_empty = false;
      break;
    }
    PlanSearchOptions o = opt_;
    o.setups.clear();
    for (int j : part) o.setups.push_back(opt_.setups[j]);
    if (!whole) o.setting_parts = PlanSearchOptions::SettingParts::kNever;
    // Seed plans (planner/seed_plans.h) in the first part, and in a later one only while no plan is known
    // (where only full recomputation fits memory); in every context-parallel part (each its own shapes).
    if (!found.empty() && !whole) o.seed_time_s = 0;
    // A plan found in an earlier part is the same plan (the same id) under another setting: offered again
    // here, SharedBound counts it once, at its least cost.
    for (const Found& f : found) o.incumbents.emplace_back(f.cost, plan_id(f.order));
    const double part_start = elapsed();
    if (opt_.time_budget_s > 0) o.time_budget_s = std::max(1e-3, opt_.time_budget_s - part_start);
    const PlanSearch sub(*cluster_, *profiles_, *sim_, o);
    PlanSearchResult r = whole ? sub.search_all() : sub.search();
    for (SearchedPlan& p : r.top) {
      p.setup = part[p.setup];
      std::vector<int> order = plan_key_order(p.plan, *cluster_);
      found.push_back(Found{p.plan.cost, std::move(order), p.setup, std::move(p)});
    }
    // Each part's bound holds for its plans; the union's is the least.
    all.lower_bound_ms = std::min(all.lower_bound_ms, r.lower_bound_ms);
    all.space_empty = all.space_empty && r.space_empty;
    all.seeds_costed += r.seeds_costed;
    all.seed_seconds += r.seed_seconds;
    if (r.first_plan_s >= 0 && all.first_plan_s < 0) all.first_plan_s = part_start + r.first_plan_s;
    all.enumerated += r.enumerated;
    all.pruned += r.pruned;
    all.costed += r.costed;
    all.infeasible += r.infeasible;
    if (all.first_infeasible_reason.empty()) all.first_infeasible_reason = r.first_infeasible_reason;
    if (r.cut_short) {
      all.cut_short = true;
      all.cut_reason = r.cut_reason;
      all.space_empty = false;
      break;
    }
  }
  // Cheapest first, then the plan order, then the setting: each plan kept once, at its first entry.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.cost, a.order, a.setup) < std::tie(b.cost, b.order, b.setup);
  });
  std::vector<const std::vector<int>*> kept;
  for (Found& f : found) {
    if (static_cast<int>(all.top.size()) >= opt_.top_k) break;
    if (std::any_of(kept.begin(), kept.end(), [&](const std::vector<int>* o) { return *o == f.order; })) continue;
    kept.push_back(&f.order);
    all.top.push_back(std::move(f.plan));
  }
  all.space_empty = all.space_empty && all.top.empty();  // (a part all above the threshold has no plan)
  all.best_ms = all.top.empty() ? -1 : all.top[0].plan.cost;
  if (!all.top.empty()) all.lower_bound_ms = std::min(all.lower_bound_ms, all.best_ms);
  const double best = all.top.empty() ? std::numeric_limits<double>::infinity() : all.best_ms;
  all.gap = std::isfinite(best) && all.lower_bound_ms > 0 ? std::max(0.0, best / all.lower_bound_ms - 1)
                                                           : std::numeric_limits<double>::infinity();
  all.proven = all.space_empty || (!all.top.empty() && all.gap <= opt_.gap * (1 + 1e-9) + 1e-12);
  all.seconds = elapsed();
  return all;
}

}  // namespace hetplan
