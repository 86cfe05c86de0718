#include "sim/rank_layout.h"

#include <algorithm>
#include <limits>

namespace hetplan {

RankLayout::RankLayout(const Cluster& cluster, const std::vector<int>& node_sequence)
    : cluster_(&cluster), node_sequence_(node_sequence) {
  for (int type : node_sequence) {
    for (const ClusterNode& n : cluster.nodes()) {
      if (n.type != type) continue;
      const int node = static_cast<int>(node_type_.size());
      node_type_.push_back(type);
      for (int i = 0; i < n.num_devices; ++i) {
        rank_type_.push_back(type);
        rank_node_.push_back(node);
      }
      node_end_.push_back(static_cast<int>(rank_type_.size()));
    }
  }
}

double RankLayout::memory_capacity_mb(int begin, int end) const {
  // Metis sums memory x count per type, in order of first appearance.
  double total = 0;
  int r = begin;
  while (r < end) {
    const int type = rank_type_[r];
    int count = 0;
    while (r < end && rank_type_[r] == type) {
      ++count;
      ++r;
    }
    total += cluster_->memory_mb(type) * count;
  }
  return total;
}

double RankLayout::pp_bandwidth(int begin, int end) const {
  end = std::min(end, num_ranks());
  const int n0 = rank_node_[begin], n1 = rank_node_[end - 1];
  if (n0 == n1) return cluster_->first_intra_bandwidth(node_type_[n0]);
  // Ranks are contiguous, so the nodes are every node from n0 to n1 and the
  // types are those of the type blocks in between.
  double slowest = std::numeric_limits<double>::infinity();
  for (int n = n0; n <= n1; ++n) slowest = std::min(slowest, cluster_->min_intra_bandwidth(node_type_[n]));
  return slowest;
}

double RankLayout::dp_bandwidth(int begin, int dp, int tp) const {
  double slowest = std::numeric_limits<double>::infinity();
  for (int d = 0; d < dp; ++d) {
    const int first = rank_node_[begin + d], last = rank_node_[begin + (tp - 1) * dp + d];
    double bw;
    if (first == last) {
      bw = cluster_->first_intra_bandwidth(node_type_[first]);
    } else {
      // Several nodes: the smallest "inter" bandwidth over the types of the
      // nodes this replica touches (a min, so repeats do not matter).
      bw = std::numeric_limits<double>::infinity();
      for (int t = 0; t < tp; ++t)
        bw = std::min(bw, cluster_->min_intra_bandwidth(node_type_[rank_node_[begin + t * dp + d]]));
    }
    slowest = std::min(slowest, bw);
  }
  return slowest;
}

}  // namespace hetplan
