// Network: how long collectives and point-to-point transfers take between
// the ranks of a RankLayout, from the clusterfile's bandwidths.
//
// Two ranks on one node talk over that node's intra_bandwidth; ranks on two
// nodes over the smaller inter_bandwidth of the two (the real key, not the
// intra_bandwidth Metis reads). Every message also pays a per-hop latency.
// A ring all-reduce of B bytes over n ranks moves 2 (n - 1) / n x B over its
// slowest link in 2 (n - 1) steps; the hierarchical form reduce-scatters
// inside each node, all-reduces the node's shard across nodes and all-gathers
// inside the node again. NCCL's tree (a chain inside each node, a double
// binary tree over the nodes) moves the ring's bytes at full bandwidth with a
// latency logarithmic in the nodes (Jeaugey, "Massively Scale Your Deep
// Learning Training with NCCL 2.4", NVIDIA blog 2019): 2 ((k - 1) intra +
// ceil(log2 nodes) inter) latencies. all_reduce() takes the fastest of the
// three, as NCCL's tuner would. The constants and where each comes from:
// sim/network.md.
// Collectives inside a node may run at a measured bus bandwidth instead of
// the clusterfile's (NetworkOptions::intra_collective_bytes_per_s).
//
// Units are explicit: clusterfile numbers are read as GB/s (1e9 bytes/s,
// the unit Metis's clusterfiles are written in), GiB/s, or bytes/s, and
// checked to be plausible for that unit (InputError otherwise).
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/parallel_layout.h"
#include "sim/rank_layout.h"

namespace hetplan {

enum class BandwidthUnit { kGBps, kGiBps, kBytesPerSecond };

// "GB/s", "GiB/s" or "bytes/s" (also gbps, gibps, bps); throws InputError naming `where`.
BandwidthUnit parse_bandwidth_unit(const std::string& s, const std::string& where);
double bytes_per_second(double value, BandwidthUnit unit);

// The one rule for a bandwidth a user gives (clusterfile, profile, flag):
// finite and, in bytes/s, from kMinBytesPerSecond (10 MB/s, slow Ethernet) to
// kMaxBytesPerSecond (10 TB/s, beyond any NVLink). Throws InputError
// "<where> = X: expected GB/s between 0.01 and 10000" (or the unit's range).
inline constexpr double kMinBytesPerSecond = 1e7, kMaxBytesPerSecond = 1e13;
void check_bandwidth(double value, BandwidthUnit unit, const std::string& where);
// check_bandwidth for every intra_bandwidth and inter_bandwidth of a
// clusterfile; `search` (either cost model), `simulate` and `whatif` all call it.
void check_clusterfile_bandwidths(const std::vector<ClusterfileEntry>& entries, const std::string& clusterfile,
                                  BandwidthUnit unit);

// The latency term of one ring all-reduce over n ranks: 2 (n - 1) steps of
// hop_latency_s each (0 for n <= 1). Network charges it per collective; the
// profile's measured bandwidth is taken net of it (LayerProfile).
inline double ring_all_reduce_latency_s(int n, double hop_latency_s) {
  return n > 1 ? 2.0 * (n - 1) * hop_latency_s : 0.0;
}

struct NetworkOptions {
  BandwidthUnit unit = BandwidthUnit::kGBps;
  // Measured bus bandwidth (bytes/s) of all-reduces among one node's GPUs,
  // per cluster device type index (0 or absent: the clusterfile's
  // intra_bandwidth). It covers what the datasheet does not: NCCL's protocol
  // and per-call costs. p2p keeps the clusterfile's numbers.
  std::vector<double> intra_collective_bytes_per_s;
  double intra_latency_s = 11e-6;  // NVLink/PCIe hop: an 8 KiB all-reduce on 2 x H200 took 22 us, 2 ring steps
                                   // (scripts/gpu_nccl_bench.sh, logs/validate/nccl-h200x2; sim/network.md)
  // All-gather and reduce-scatter inside a node reach this fraction of the all-reduce's bus bandwidth (both
  // net of the calls' latency, at the same full buffer): 0.79-0.86, median 0.81, from 16 MiB to 1 GiB on
  // 2 x H200, NCCL 2.28.9 (scripts/gpu_nccl_bench.sh, logs/validate/nccl-h200x2; sim/network.md).
  double intra_gather_bandwidth_ratio = 0.81;
  double inter_latency_s = 20e-6;  // InfiniBand/Ethernet hop between nodes
};

class Network {
 public:
  // Validates every clusterfile bandwidth against the unit. Throws InputError
  // "<clusterfile>: key '<ip>.inter_bandwidth' = X: ..." for absurd values.
  Network(const Cluster& cluster, const RankLayout& layout, NetworkOptions options = {});

  // Bandwidth (bytes/s) and latency (s) of the link ranks a and b share.
  double link_bandwidth(int a, int b) const;
  double link_latency(int a, int b) const;
  bool same_node(int a, int b) const { return layout_->node_of(a) == layout_->node_of(b); }

  double p2p_seconds(int from, int to, double bytes) const;
  // One step of a ring exchange through NCCL (every rank of the ring sends `bytes` to the next and receives
  // from the one before at once: context parallelism's K/V ring): the link's latency plus the bytes at the
  // link's collective bandwidth (inside a node the measured bus bandwidth where one is given, as NCCL's
  // collectives run there; p2p_seconds keeps the clusterfile's datasheet figure).
  double ring_step_seconds(int from, int to, double bytes) const;
  double ring_all_reduce_seconds(const std::vector<int>& ranks, double bytes) const;
  double hierarchical_all_reduce_seconds(const std::vector<int>& ranks, double bytes) const;
  double tree_all_reduce_seconds(const std::vector<int>& ranks, double bytes) const;
  double all_reduce_seconds(const std::vector<int>& ranks, double bytes) const;
  // Ring all-gather (or reduce-scatter) where every rank ends with (or
  // starts from) `bytes` in total: (n - 1) / n x bytes over the slowest link.
  double all_gather_seconds(const std::vector<int>& ranks, double bytes) const;

  // all_reduce_seconds / ring_all_reduce_seconds over a group of a stage's grid (a tp or a dp group,
  // StageGrid::tp_group / dp_group: in rank order and so in node order), the same numbers without
  // allocating.
  double all_reduce_seconds_strided(RankStride group, double bytes) const;
  double ring_all_reduce_seconds_strided(RankStride group, double bytes) const;
  // A ring all-reduce of `n` GPUs inside RankLayout node `node`, at its collective bandwidth.
  double intra_node_all_reduce_seconds(int node, int n, double bytes) const;
  // One NCCL all-gather, or one reduce-scatter, of `n` GPUs inside node `node`, `bytes` the full buffer
  // (every rank's part): its own call, so its latency is (n - 1) ring steps but never less than the 2 steps
  // the smallest call costs (an 8 KiB all-gather took 22.6 us and a reduce-scatter 21.9 us on 2 x H200,
  // as the all-reduce's 22.0: logs/validate/nccl-h200x2), and (n - 1) / n x bytes at the node's collective
  // bandwidth x intra_gather_bandwidth_ratio. 0 for n <= 1 or no bytes.
  double intra_node_gather_seconds(int node, int n, double bytes) const;

  const RankLayout& layout() const { return *layout_; }

 private:
  // Slowest link and largest latency of the ring over `ranks` in order, for a collective.
  void ring_bottleneck(const std::vector<int>& ranks, double* bandwidth, double* latency) const;
  double collective_bandwidth(int a, int b) const;
  // The ring and the hierarchical all-reduce of `bytes` over `group`, walked node by node (a node is a
  // range of ranks, so its members are one run): the same links, so the same bottlenecks, as a walk
  // rank by rank, in O(nodes) instead of O(n). REQUIRES: group.size() >= 2, bytes > 0.
  void strided_all_reduces(RankStride group, double bytes, double* ring, double* hier, double* tree) const;
  // The tree's latency: a chain of `per_node` ranks inside each node and a double binary tree over `nodes`.
  double tree_latency_s(int per_node, int nodes) const;

  const RankLayout* layout_;
  NetworkOptions opt_;
  std::vector<double> node_intra_, node_inter_;  // bytes/s, per layout node
  std::vector<double> node_collective_;           // bytes/s inside the node, for collectives
};

}  // namespace hetplan
