// Objective: which plan `search` returns when GPUs are rented by the hour.
//
//   --objective time (the default): the least simulated iteration time on the whole cluster (PlanSearch).
//   --objective cost: the least cost per iteration, iteration time x the hourly price of the GPUs the plan
//     uses (Cluster::price_per_gpu_hour: the clusterfile's price_per_gpu_hour, else the GPU catalogue's).
//     Every plan of a cluster uses all of its GPUs, so on one cluster the two objectives pick the same
//     plan; the cost objective therefore also searches sub-clusters: every choice of a number of whole
//     nodes per device type (the first k nodes of that type, in hostfile order; not all zero), where
//     fewer or cheaper GPUs can cost less per iteration although they take longer.
//   --deadline-ms T: the cheapest plan whose iteration time is at most T, over the same sub-clusters
//     (implies --objective cost).
//
// Sub-clusters are searched one by one with the same options (each a PlanSearch, exact over its space);
// the whole run shares one time budget. With more than `max_subsets` choices, each type's node count
// runs over 0, 1, 2, 4, ... and all its nodes instead of every count (said in the result).
//
// Thread-safety: search_objective runs its searches one after another (each may use many threads).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "planner/plan_search.h"
#include "sim/cluster.h"
#include "sim/model_shape.h"
#include "sim/plan_simulator.h"
#include "sim/profile.h"

namespace hetplan {

enum class Objective { kTime, kCost };
// "time" or "cost"; else InputError naming `flag`.
Objective parse_objective(const std::string& text, const std::string& flag);

// USD of one iteration of `iteration_ms` on GPUs that rent for `usd_per_hour` together.
inline double cost_per_iteration_usd(double iteration_ms, double usd_per_hour) {
  return iteration_ms / 3.6e6 * usd_per_hour;
}
// USD per hour of all of `cluster`'s GPUs. Throws InputError naming the first type without a price
// (and how to give one) when `where` is not empty; returns -1 then otherwise.
double cluster_price_per_hour(const Cluster& cluster, const std::string& where);

// A sub-cluster: how many of each device type's nodes it takes (by Cluster::device_types() index).
struct NodeSubset {
  std::vector<int> nodes_per_type;
  std::vector<std::pair<std::string, int>> hosts;  // its hostfile lines (ip, slots), in hostfile order
  std::string label;                               // "2 x A100 node, 1 x H100 node" (16 GPUs)
};
// The sub-clusters --objective cost searches (see above), the whole cluster first.
// `reduced` is set when the node counts were thinned to powers of two.
std::vector<NodeSubset> node_subsets(const Cluster& cluster, int max_subsets, bool* reduced);
// The cluster of those hosts (the same clusterfile entries).
Cluster subset_cluster(const Cluster& cluster, const NodeSubset& subset);

struct ObjectiveOptions {
  Objective objective = Objective::kTime;
  double deadline_ms = 0;  // > 0: only plans at most this fast count (and the objective is cost)
  int max_subsets = 512;
};

struct PricedPlan {
  SearchedPlan searched;  // searched.plan.cost: the iteration time (ms)
  int subset = 0;         // index into ObjectiveSearchResult::subsets
  double usd_per_hour = 0, usd_per_iteration = 0;
};

struct ObjectiveSearchResult {
  std::vector<PricedPlan> top;     // best first by the objective (ties: faster, then the search's order)
  std::vector<NodeSubset> subsets;  // every sub-cluster searched
  std::vector<Cluster> clusters;    // [subset]: its cluster
  bool reduced = false;             // node counts thinned to powers of two
  long long enumerated = 0, pruned = 0, costed = 0, infeasible = 0;
  int subsets_with_plans = 0;
  double fastest_ms = -1;           // the fastest plan seen in any sub-cluster (-1: none), for "deadline too tight"
  bool cut_short = false;
  std::string cut_reason, first_infeasible_reason;
  double seconds = 0;
};

// Searches `cluster` (and, for the cost objective, its sub-clusters) with `search` (its top_k, setups,
// budget, ...) and simulator options `sim`, and ranks what it finds by `objective`.
// REQUIRES: every type of `cluster` has a price when the objective is cost (cluster_price_per_hour).
ObjectiveSearchResult search_objective(const Cluster& cluster, const ProfileSet& profiles, const ModelShape& shape,
                                       int sequence_length, const SimulationOptions& sim,
                                       const PlanSearchOptions& search, const ObjectiveOptions& objective);

}  // namespace hetplan
