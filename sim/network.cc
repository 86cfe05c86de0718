#include "sim/network.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "sim/input_error.h"
#include "sim/json_util.h"

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

double Network::all_reduce_seconds(const std::vector<int>& ranks, double bytes) const {
  return std::min(ring_all_reduce_seconds(ranks, bytes), hierarchical_all_reduce_seconds(ranks, bytes));
}

}  // namespace hetplan

namespace hetplan {

namespace {
// Ring bottleneck over ranks first + i * stride for i in [i0, i1), closing the ring.
template <class Bw, class Lat>
void strided_bottleneck(int first, int stride, int i0, int i1, Bw bw_of, Lat lat_of, double* bandwidth,
                        double* latency) {
  double bw = std::numeric_limits<double>::infinity(), lat = 0;
  const int n = i1 - i0;
  for (int i = 0; i < n; ++i) {
    const int a = first + (i0 + i) * stride, b = first + (i0 + (i + 1) % n) * stride;
    bw = std::min(bw, bw_of(a, b));
    lat = std::max(lat, lat_of(a, b));
  }
  *bandwidth = bw;
  *latency = lat;
}
}  // namespace

double Network::ring_all_reduce_seconds_strided(int first, int stride, int count, double bytes) const {
  const double n = static_cast<double>(count);
  if (n <= 1 || bytes <= 0) return 0.0;
  double bw, lat;
  strided_bottleneck(
      first, stride, 0, count, [&](int a, int b) { return collective_bandwidth(a, b); },
      [&](int a, int b) { return link_latency(a, b); }, &bw, &lat);
  return 2 * (n - 1) * lat + 2 * (n - 1) / n * bytes / bw;
}

double Network::all_reduce_seconds_strided(int first, int stride, int count, double bytes) const {
  const double ring = ring_all_reduce_seconds_strided(first, stride, count, bytes);
  // hierarchical_all_reduce_seconds: ranks in order, so each node's ranks are one run.
  double hier;
  if (count <= 1 || bytes <= 0) {
    hier = 0.0;
  } else {
    auto node = [&](int i) { return layout_->node_of(first + i * stride); };
    int runs = 0;
    for (int i = 0; i < count; ++i)
      if (i == 0 || node(i) != node(i - 1)) ++runs;
    if (runs == 1) {
      hier = ring;
    } else {
      double intra = 0;
      std::size_t per_node = 0;
      for (int i0 = 0; i0 < count;) {
        int i1 = i0 + 1;
        while (i1 < count && node(i1) == node(i0)) ++i1;
        // 2 * all_gather_seconds(run, bytes)
        const double n = static_cast<double>(i1 - i0);
        double ag = 0.0;
        if (n > 1) {
          double bw, lat;
          strided_bottleneck(
              first, stride, i0, i1, [&](int a, int b) { return collective_bandwidth(a, b); },
              [&](int a, int b) { return link_latency(a, b); }, &bw, &lat);
          ag = (n - 1) * lat + (n - 1) / n * bytes / bw;
        }
        intra = std::max(intra, 2 * ag);
        per_node = std::max(per_node, static_cast<std::size_t>(i1 - i0));
        i0 = i1;
      }
      // Ring over the runs' leaders with bytes / per_node.
      const double leader_bytes = bytes / static_cast<double>(per_node);
      double inter = 0.0;
      const double nl = static_cast<double>(runs);
      if (leader_bytes > 0) {
        double bw = std::numeric_limits<double>::infinity(), lat = 0;
        int first_leader = -1, prev = -1;
        auto link = [&](int a, int b) {
          bw = std::min(bw, collective_bandwidth(a, b));
          lat = std::max(lat, link_latency(a, b));
        };
        for (int i = 0; i < count; ++i) {
          if (i > 0 && node(i) == node(i - 1)) continue;
          const int r = first + i * stride;
          if (prev >= 0) link(prev, r);
          else first_leader = r;
          prev = r;
        }
        link(prev, first_leader);
        inter = 2 * (nl - 1) * lat + 2 * (nl - 1) / nl * leader_bytes / bw;
      }
      hier = intra + inter;
    }
  }
  return std::min(ring, hier);
}

double Network::intra_node_all_reduce_seconds(int node, int count, double bytes) const {
  const double n = static_cast<double>(count);
  if (n <= 1 || bytes <= 0) return 0.0;
  return 2 * (n - 1) * opt_.intra_latency_s + 2 * (n - 1) / n * bytes / node_collective_[node];
}

}  // namespace hetplan
