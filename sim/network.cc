#include "sim/network.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "base/input_error.h"
#include "base/json_util.h"

namespace hetplan {

BandwidthUnit parse_bandwidth_unit(const std::string& s, const std::string& where) {
  std::string k;
  for (char c : s) k += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (k == "gb/s" || k == "gbps" || k == "gbs") return BandwidthUnit::kGBps;
  if (k == "gib/s" || k == "gibps") return BandwidthUnit::kGiBps;
  if (k == "bytes/s" || k == "b/s" || k == "bps" || k == "bytes") return BandwidthUnit::kBytesPerSecond;
  throw InputError(where + ": '" + excerpt(s) + "': expected GB/s, GiB/s or bytes/s");
}

double bytes_per_second(double value, BandwidthUnit unit) {
  switch (unit) {
    case BandwidthUnit::kGBps: return value * 1e9;
    case BandwidthUnit::kGiBps: return value * 1024.0 * 1024.0 * 1024.0;
    case BandwidthUnit::kBytesPerSecond: return value;
  }
  return value;
}

void check_bandwidth(double value, BandwidthUnit unit, const std::string& where) {
  const double bps = bytes_per_second(value, unit);
  if (std::isfinite(value) && bps >= kMinBytesPerSecond && bps <= kMaxBytesPerSecond) return;
  std::ostringstream msg;
  msg << where << " = " << value << ": ";
  if (unit == BandwidthUnit::kBytesPerSecond)
    msg << "expected bytes/s between 1e7 and 1e13";
  else
    msg << "expected " << (unit == BandwidthUnit::kGBps ? "GB/s" : "GiB/s") << " between 0.01 and 10000";
  if (unit != BandwidthUnit::kBytesPerSecond && value > 1e4) msg << " (is it bytes/s? then pass --bandwidth-unit bytes/s)";
  if (unit == BandwidthUnit::kBytesPerSecond && value > 0 && value < 1e7)
    msg << " (is it GB/s? then pass --bandwidth-unit GB/s)";
  throw InputError(msg.str());
}

void check_clusterfile_bandwidths(const std::vector<ClusterfileEntry>& entries, const std::string& clusterfile,
                                  BandwidthUnit unit) {
  const std::string file = clusterfile.empty() ? "clusterfile" : clusterfile;
  for (const auto& e : entries) {
    check_bandwidth(e.intra_bandwidth, unit, key_where(file, e.ip + ".intra_bandwidth"));
    check_bandwidth(e.inter_bandwidth, unit, key_where(file, e.ip + ".inter_bandwidth"));
  }
}

Network::Network(const Cluster& cluster, const RankLayout& layout, NetworkOptions options)
    : layout_(&layout), opt_(options) {
  if (!(opt_.intra_latency_s >= 0 && opt_.inter_latency_s >= 0 && opt_.intra_latency_s < 1 && opt_.inter_latency_s < 1))
    throw InputError("network latency: expected seconds in [0, 1)");
  check_clusterfile_bandwidths(cluster.clusterfile(), cluster.clusterfile_path(), opt_.unit);
  // Layout nodes in RankLayout's order: the node sequence's types, each in hostfile order.
  for (int type : layout.node_sequence())
    for (const ClusterNode& n : cluster.nodes()) {
      if (n.type != type) continue;
      node_intra_.push_back(bytes_per_second(n.intra_bandwidth, opt_.unit));
      node_inter_.push_back(bytes_per_second(n.inter_bandwidth, opt_.unit));
      const bool measured = type < static_cast<int>(opt_.intra_collective_bytes_per_s.size()) &&
                            opt_.intra_collective_bytes_per_s[type] > 0;
      node_collective_.push_back(measured ? opt_.intra_collective_bytes_per_s[type] : node_intra_.back());
    }
}

double Network::link_bandwidth(int a, int b) const {
  const int na = layout_->node_of(a), nb = layout_->node_of(b);
  if (na == nb) return node_intra_[na];
  return std::min(node_inter_[na], node_inter_[nb]);
}

double Network::collective_bandwidth(int a, int b) const {
  const int na = layout_->node_of(a), nb = layout_->node_of(b);
  return na == nb ? node_collective_[na] : link_bandwidth(a, b);
}

double Network::link_latency(int a, int b) const { return same_node(a, b) ? opt_.intra_latency_s : opt_.inter_latency_s; }

double Network::p2p_seconds(int from, int to, double bytes) const {
  if (from == to || bytes <= 0) return 0.0;
  return link_latency(from, to) + bytes / link_bandwidth(from, to);
}

double Network::ring_step_seconds(int from, int to, double bytes) const {
  if (from == to || bytes <= 0) return 0.0;
  return link_latency(from, to) + bytes / collective_bandwidth(from, to);
}

void Network::ring_bottleneck(const std::vector<int>& ranks, double* bandwidth, double* latency) const {
  double bw = std::numeric_limits<double>::infinity(), lat = 0;
  const std::size_t n = ranks.size();
  for (std::size_t i = 0; i < n; ++i) {
    const int a = ranks[i], b = ranks[(i + 1) % n];
    bw = std::min(bw, collective_bandwidth(a, b));
    lat = std::max(lat, link_latency(a, b));
  }
  *bandwidth = bw;
  *latency = lat;
}

double Network::ring_all_reduce_seconds(const std::vector<int>& ranks, double bytes) const {
  const double n = static_cast<double>(ranks.size());
  if (n <= 1 || bytes <= 0) return 0.0;
  double bw, lat;
  ring_bottleneck(ranks, &bw, &lat);
  return 2 * (n - 1) * lat + 2 * (n - 1) / n * bytes / bw;
}

double Network::all_gather_seconds(const std::vector<int>& ranks, double bytes) const {
  const double n = static_cast<double>(ranks.size());
  if (n <= 1 || bytes <= 0) return 0.0;
  double bw, lat;
  ring_bottleneck(ranks, &bw, &lat);
  return (n - 1) * lat + (n - 1) / n * bytes / bw;
}

double Network::hierarchical_all_reduce_seconds(const std::vector<int>& ranks, double bytes) const {
  if (ranks.size() <= 1 || bytes <= 0) return 0.0;
  std::map<int, std::vector<int>> by_node;
  for (int r : ranks) by_node[layout_->node_of(r)].push_back(r);
  if (by_node.size() == 1) return ring_all_reduce_seconds(ranks, bytes);
  // Phase 1 and 3: reduce-scatter and all-gather inside each node, in parallel; the slowest node sets the pace.
  double intra = 0;
  std::size_t per_node = 0;
  for (const auto& [node, rs] : by_node) {
    intra = std::max(intra, 2 * all_gather_seconds(rs, bytes));
    per_node = std::max(per_node, rs.size());
  }
  // Phase 2: each node's shard (bytes / ranks per node) is all-reduced across the nodes, one ring per shard,
  // all in parallel over the node's links.
  std::vector<int> leaders;
  for (const auto& [node, rs] : by_node) leaders.push_back(rs.front());
  const double inter = ring_all_reduce_seconds(leaders, bytes / static_cast<double>(per_node));
  return intra + inter;
}

double Network::tree_all_reduce_seconds(const std::vector<int>& ranks, double bytes) const {
  const double n = static_cast<double>(ranks.size());
  if (n <= 1 || bytes <= 0) return 0.0;
  std::map<int, int> per_node;
  for (int r : ranks) ++per_node[layout_->node_of(r)];
  double bw, lat;
  ring_bottleneck(ranks, &bw, &lat);
  if (per_node.size() == 1) return ring_all_reduce_seconds(ranks, bytes);
  int most = 0;
  for (const auto& [node, k] : per_node) most = std::max(most, k);
  return tree_latency_s(most, static_cast<int>(per_node.size())) + 2 * (n - 1) / n * bytes / bw;
}

double Network::tree_latency_s(int per_node, int nodes) const {
  return 2 * ((per_node - 1) * opt_.intra_latency_s + std::ceil(std::log2(static_cast<double>(nodes))) * opt_.inter_latency_s);
}

double Network::all_reduce_seconds(const std::vector<int>& ranks, double bytes) const {
  return std::min({ring_all_reduce_seconds(ranks, bytes), hierarchical_all_reduce_seconds(ranks, bytes),
                   tree_all_reduce_seconds(ranks, bytes)});
}

void Network::strided_all_reduces(RankStride group, double bytes, double* ring, double* hier, double* tree) const {
  const int first = group.first, stride = group.stride, count = group.count;
  const double n = static_cast<double>(count);
  const double intra_lat = opt_.intra_latency_s, inter_lat = opt_.inter_latency_s;
  // Ring over all members: (k - 1) links inside each node of k members, one link between consecutive
  // nodes, and the link from the last member back to the first.
  double ring_bw = std::numeric_limits<double>::infinity(), ring_lat = 0;
  // Hierarchical: a ring inside each node (its all-gather, twice), then a ring over the nodes' first
  // members (the leaders) with bytes / the most members of a node.
  double intra = 0, leader_bw = std::numeric_limits<double>::infinity(), leader_lat = 0;
  int runs = 0, per_node = 0, first_node = -1, prev_node = -1;
  int last_members = 0;  // the node before's members and collective bandwidth: an equal node adds nothing new
  double last_collective = -1;
  for (int i = 0; i < count;) {
    const int rank = first + i * stride, node = layout_->node_of(rank);
    const int members = std::min(count - i, (layout_->node_end(node) - rank + stride - 1) / stride);
    if (members > 1 && !(members == last_members && node_collective_[node] == last_collective)) {
      ring_bw = std::min(ring_bw, node_collective_[node]);
      ring_lat = std::max(ring_lat, intra_lat);
      const double k = static_cast<double>(members);
      intra = std::max(intra, 2 * ((k - 1) * intra_lat + (k - 1) / k * bytes / node_collective_[node]));
      last_members = members;
      last_collective = node_collective_[node];
    }
    if (prev_node >= 0) {
      const double bw = std::min(node_inter_[prev_node], node_inter_[node]);
      ring_bw = std::min(ring_bw, bw);
      ring_lat = std::max(ring_lat, inter_lat);
      leader_bw = std::min(leader_bw, bw);
      leader_lat = std::max(leader_lat, inter_lat);
    } else {
      first_node = node;
    }
    per_node = std::max(per_node, members);
    ++runs;
    prev_node = node;
    i += members;
  }
  if (runs == 1) {  // the wrap link inside the one node (with two or more members: count >= 2)
    ring_bw = std::min(ring_bw, node_collective_[first_node]);
    ring_lat = std::max(ring_lat, intra_lat);
  } else {  // the wrap links back to the first node, for both rings
    const double bw = std::min(node_inter_[prev_node], node_inter_[first_node]);
    ring_bw = std::min(ring_bw, bw);
    ring_lat = std::max(ring_lat, inter_lat);
    leader_bw = std::min(leader_bw, bw);
    leader_lat = std::max(leader_lat, inter_lat);
  }
  *ring = 2 * (n - 1) * ring_lat + 2 * (n - 1) / n * bytes / ring_bw;
  if (runs == 1) {
    *hier = *tree = *ring;
    return;
  }
  // NCCL's tree: a chain inside each node and a double binary tree over the nodes: the ring's bandwidth
  // term with a latency logarithmic in the nodes.
  *tree = tree_latency_s(per_node, runs) + 2 * (n - 1) / n * bytes / ring_bw;
  const double leader_bytes = bytes / static_cast<double>(per_node);
  const double nl = static_cast<double>(runs);
  const double inter = leader_bytes > 0 ? 2 * (nl - 1) * leader_lat + 2 * (nl - 1) / nl * leader_bytes / leader_bw : 0.0;
  *hier = intra + inter;
}

double Network::ring_all_reduce_seconds_strided(RankStride group, double bytes) const {
  if (group.size() <= 1 || bytes <= 0) return 0.0;
  double ring, hier, tree;
  strided_all_reduces(group, bytes, &ring, &hier, &tree);
  return ring;
}

double Network::all_reduce_seconds_strided(RankStride group, double bytes) const {
  if (group.size() <= 1 || bytes <= 0) return 0.0;
  double ring, hier, tree;
  strided_all_reduces(group, bytes, &ring, &hier, &tree);
  return std::min({ring, hier, tree});
}

double Network::intra_node_all_reduce_seconds(int node, int count, double bytes) const {
  const double n = static_cast<double>(count);
  if (n <= 1 || bytes <= 0) return 0.0;
  return ring_all_reduce_latency_s(count, opt_.intra_latency_s) + 2 * (n - 1) / n * bytes / node_collective_[node];
}

double Network::intra_node_gather_seconds(int node, int count, double bytes) const {
  const double n = static_cast<double>(count);
  if (n <= 1 || bytes <= 0) return 0.0;
  const double steps = std::max(n - 1, 2.0);
  return steps * opt_.intra_latency_s +
         (n - 1) / n * bytes / (node_collective_[node] * opt_.intra_gather_bandwidth_ratio);
}

}  // namespace hetplan
