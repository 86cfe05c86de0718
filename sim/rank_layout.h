// RankLayout: which device type and node each global rank is, for one node
// sequence. Ranks are handed out node by node: all nodes of the sequence's
// first type (in hostfile order), then the second type's, and so on.
//
// It also answers Metis's bandwidth questions for a set of ranks: one node
// means that node type's intra bandwidth; several nodes mean the smallest
// "inter" bandwidth of the types involved, which Metis reads from the
// intra_bandwidth key (Cluster::min_intra_bandwidth).
//
// Which rank of a stage is which replica and tp index is StageGrid's
// (sim/parallel_layout.h); RankLayout only knows nodes and types.
// REQUIRES: node_sequence holds valid type indices of `cluster`; rank and
// node arguments are in range. Thread-safety: immutable after construction.
// Lifetime: keeps a pointer to the Cluster, which must outlive it.
#pragma once

#include <vector>

#include "sim/cluster.h"

namespace hetplan {

class RankLayout {
 public:
  RankLayout(const Cluster& cluster, const std::vector<int>& node_sequence);

  int num_ranks() const { return static_cast<int>(rank_type_.size()); }
  int type_of(int rank) const { return rank_type_[rank]; }
  int node_of(int rank) const { return rank_node_[rank]; }
  // A node's ranks are one range, [node_end(node) - node_size(node), node_end(node)).
  int node_end(int node) const { return node_end_[node]; }
  int node_size(int node) const { return node_end_[node] - (node > 0 ? node_end_[node - 1] : 0); }
  const std::vector<int>& rank_types() const { return rank_type_; }
  const std::vector<int>& node_sequence() const { return node_sequence_; }

  // True when ranks [begin, end) are all of one device type.
  bool homogeneous(int begin, int end) const { return rank_type_[begin] == rank_type_[end - 1]; }

  // Sum over the ranks [begin, end) of their GPU memory in MB.
  double memory_capacity_mb(int begin, int end) const;

  // Metis's bandwidth between pipeline stage `stage` and the next, given the
  // ranks of both stages [begin, end).
  double pp_bandwidth(int begin, int end) const;

  // Metis's slowest data-parallel bandwidth of a stage of dp*tp ranks from
  // `begin`: replica d holds ranks begin + t*dp + d for t < tp (Metis's
  // layout, kept for its cost model; the simulator uses Megatron's grid,
  // sim/parallel_layout.h).
  double dp_bandwidth(int begin, int dp, int tp) const;

 private:
  const Cluster* cluster_;
  std::vector<int> node_sequence_;
  std::vector<int> rank_type_, rank_node_, node_type_;
  std::vector<int> node_end_;  // per node: one past its last rank
};

}  // namespace hetplan
