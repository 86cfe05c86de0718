// The rank grid of a plan, Megatron-LM's order, and where each rank runs.
//
// StageGrid promises the one formula for ranks inside a pipeline stage: the
// stage holding ranks [begin, begin + dp * tp) gives data-parallel replica d
// and tensor-parallel index t global rank begin + d * tp + t (tp fastest,
// then dp; stages are consecutive rank ranges, so pp is slowest). A replica's
// tp group is tp consecutive ranks; the dp group of tp index t is the ranks
// begin + t, begin + t + tp, ... With context parallelism of size cp
// (carved from the plan's dp, Megatron's order tp, cp, dp), replicas
// d = e * cp + c (c < cp) form data-parallel replica e of Megatron's dp =
// dp / cp, and replica d's tp index t is in the cp group of the ranks
// rank(e * cp + c', t), c' < cp (stride tp); gradients are summed over
// dp x cp, which is the plan's dp group. Every part that needs a rank of a stage
// (balancers, network and memory costing, the search's estimates, export,
// the executor's process groups) asks a StageGrid; Metis's own strided order
// stays in its cost path (RankLayout::dp_bandwidth, metis/metis_cost.h).
// StageGrid and RankStride are plain values: they allocate nothing, so the
// search's hot paths may build them freely. PipelineGrid lists a plan's
// stage grids.
//
// ParallelLayout says where each global rank runs: the host (the hostfile
// node's ip) and the local GPU index on that host, from RankLayout, which
// hands out ranks node by node in node-sequence order (each type's nodes in
// hostfile order). A hostfile may list one ip on several lines (several
// "nodes" of RankLayout); the local index counts that host's GPUs over all
// its lines, in rank order.
//
// REQUIRES (StageGrid): dp >= 1, tp >= 1; rank arguments inside the stage,
// replica and tp indices inside [0, dp) and [0, tp).
// Thread-safety: all types here are immutable after construction and safe to
// share. Lifetime: ParallelLayout keeps pointers to the Cluster and
// RankLayout it was built from; they must outlive it.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/plan.h"
#include "sim/rank_layout.h"

namespace hetplan {

// The ranks first, first + stride, ..., count of them, in that order (a tp or
// a dp group of a stage). REQUIRES: stride >= 1.
struct RankStride {
  int first = 0, stride = 1, count = 0;
  int operator[](int i) const { return first + i * stride; }
  int size() const { return count; }
  // The position of `rank` in the group, -1 if it is not a member.
  int position_of(int rank) const {
    const int offset = rank - first;
    if (offset < 0 || offset % stride != 0 || offset / stride >= count) return -1;
    return offset / stride;
  }
  std::vector<int> ranks() const;  // the members, for callers off the hot path
};

// One pipeline stage's ranks, Megatron's order (see above).
struct StageGrid {
  int begin = 0, dp = 1, tp = 1;

  constexpr StageGrid() = default;
  constexpr StageGrid(int first_rank, int dp_size, int tp_size) : begin(first_rank), dp(dp_size), tp(tp_size) {}
  constexpr StageGrid(int first_rank, Strategy st) : begin(first_rank), dp(st.dp), tp(st.tp) {}

  int size() const { return dp * tp; }
  int end() const { return begin + dp * tp; }
  bool contains(int r) const { return r >= begin && r < end(); }
  // The global rank of replica d's tp index t.
  int rank(int d, int t) const { return begin + d * tp + t; }
  // The replica (dp index) and tp index of global rank r of this stage.
  int replica(int r) const { return (r - begin) / tp; }
  int tp_index(int r) const { return (r - begin) % tp; }
  // Replica d's tp group, in tp order; the dp group of tp index t, in replica order.
  RankStride tp_group(int d) const { return {rank(d, 0), 1, tp}; }
  RankStride dp_group(int t) const { return {begin + t, tp, dp}; }
  // Context parallelism of size cp (see above): replica d's cp index, and the cp group of its tp index t,
  // in cp order. REQUIRES: cp >= 1 divides dp.
  int cp_index(int d, int cp) const { return d % cp; }
  RankStride cp_group(int d, int t, int cp) const { return {rank(d - d % cp, t), tp, cp}; }
  // The stage's Megatron data-parallel replicas under context parallelism of size cp, as a grid of their
  // own: replica e of it is the cp group of replicas e * cp .. e * cp + cp - 1, its first rank
  // rank(e * cp, 0), its cp x tp ranks consecutive. REQUIRES: cp >= 1 divides dp.
  StageGrid cp_groups(int cp) const { return {begin, dp / cp, tp * cp}; }
  // How many replicas have their first rank in [lo, hi). REQUIRES: begin <= lo <= hi.
  int replicas_starting_in(int lo, int hi) const {
    return std::min(dp, (hi - begin + tp - 1) / tp) - std::min(dp, (lo - begin + tp - 1) / tp);
  }
};

// A plan's stage grids: stage 0 starts at rank 0, each next stage where the
// one before ends.
class PipelineGrid {
 public:
  explicit PipelineGrid(const std::vector<Strategy>& strategies);

  int num_stages() const { return static_cast<int>(stages_.size()); }
  int num_ranks() const { return stages_.empty() ? 0 : stages_.back().end(); }
  const StageGrid& stage(int s) const { return stages_[s]; }
  const std::vector<StageGrid>& stages() const { return stages_; }
  // The stage holding global rank `rank`; -1 outside [0, num_ranks()).
  int stage_of(int rank) const;

 private:
  std::vector<StageGrid> stages_;
};

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
  std::vector<int> cluster_node_;  // per RankLayout node: its Cluster::nodes() index
  std::vector<int> local_gpu_;
};

}  // namespace hetplan
