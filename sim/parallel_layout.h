// ParallelLayout: the one rank grid of a plan, Megatron's order.
//
// Within a pipeline stage of ranks [begin, begin + size) at (dp, tp), data-
// parallel replica d and tensor-parallel index t is global rank
// begin + d * tp + t: tp fastest, then dp, then pp (stages are consecutive
// rank ranges). A replica's tp group is therefore tp consecutive ranks, and
// the dp group of tp index t is the ranks begin + t, begin + t + tp, ...
//
// It also says where each global rank runs: the host (the hostfile node's
// ip) and the local GPU index on that host, from RankLayout, which hands out
// ranks node by node in node-sequence order (each type's nodes in hostfile
// order). A hostfile may list one ip on several lines (several "nodes" of
// RankLayout); the local index counts that host's GPUs over all its lines,
// in rank order.
//
// Thread-safety: immutable after construction. REQUIRES: the Cluster and
// RankLayout outlive it.
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/plan.h"
#include "sim/rank_layout.h"

namespace hetplan {

// Global rank of (replica d, tp index t) in the stage starting at `begin`.
inline int grid_rank(int begin, Strategy st, int d, int t) { return begin + d * st.tp + t; }
// The data-parallel replica and tp index of global rank `rank` of the stage starting at `begin`.
inline int grid_replica(int begin, Strategy st, int rank) { return (rank - begin) / st.tp; }
inline int grid_tp_index(int begin, Strategy st, int rank) { return (rank - begin) % st.tp; }

// True when every tp group of the stage (ranks [begin, begin + dp * tp)) lies on one RankLayout node
// (and so on one GPU type). The search filters with it; the simulator costs a plan where it fails with
// its tensor-parallel all-reduces over the inter-node link.
bool tp_groups_inside_nodes(const RankLayout& layout, int begin, Strategy st);

// Splits a homogeneous stage's micro-batch of `micro_batch` samples over `dp` replicas as evenly as
// possible: the first micro_batch % dp replicas take one more. Writes dp counts to `shares`.
void split_micro_batch(int micro_batch, int dp, int* shares);

class ParallelLayout {
 public:
  ParallelLayout(const Cluster& cluster, const RankLayout& layout);

  const Cluster& cluster() const { return *cluster_; }
  const RankLayout& ranks() const { return *layout_; }
  int num_ranks() const { return layout_->num_ranks(); }
  // The hostfile ip global rank `rank` runs on, and its GPU index on that host.
  const std::string& host(int rank) const { return cluster_->nodes()[cluster_node_[layout_->node_of(rank)]].ip; }
  int local_gpu(int rank) const { return local_gpu_[rank]; }
  // The Cluster::nodes() index of RankLayout node `node`.
  int cluster_node(int node) const { return cluster_node_[node]; }
  // GPUs of RankLayout node `node` (the hostfile line's slots).
  int gpus_on_node(int node) const { return node_gpus_[node]; }

  // Placement, for launchers (one process per rank, a launcher per host):
  // the distinct hosts in the order of the lowest rank each holds (host 0
  // holds rank 0), the ranks on a host in local GPU order, and the rank at
  // (host, local GPU), -1 if none.
  std::vector<std::string> hosts() const;
  std::vector<int> ranks_on(const std::string& host) const;
  int rank_at(const std::string& host, int local_gpu) const;

 private:
  const Cluster* cluster_;
  const RankLayout* layout_;
  std::vector<int> cluster_node_, node_gpus_, local_gpu_;
};

}  // namespace hetplan
