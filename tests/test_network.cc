// Network: units, p2p over the link two ranks share, ring and hierarchical
// all-reduce, against the closed forms (Thakur et al. 2005, "Optimization of
// Collective Communication Operations in MPICH", Sec. 4: ring all-reduce moves
// 2 (p - 1) / p of the data per rank in 2 (p - 1) steps).
#include <catch2/catch.hpp>

#include <cmath>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/input_error.h"
#include "sim/network.h"
#include "sim/rank_layout.h"

using namespace hetplan;

namespace {

// Two 4-GPU nodes of type X: 300 GB/s inside, 25 GB/s between.
Cluster two_nodes(double intra = 300, double inter = 25) {
  std::vector<ClusterfileEntry> cf = {{"10.0.0.1", "A100", inter, intra, 80}};
  return Cluster::from_parts({{"10.0.0.1", 4}, {"10.0.0.1", 4}}, cf, "hostfile", "cluster.json");
}

}  // namespace

TEST_CASE("bandwidth units are explicit", "[network]") {
  CHECK(bytes_per_second(25, BandwidthUnit::kGBps) == 25e9);
  CHECK(bytes_per_second(1, BandwidthUnit::kGiBps) == 1073741824.0);
  CHECK(bytes_per_second(25e9, BandwidthUnit::kBytesPerSecond) == 25e9);
  CHECK(parse_bandwidth_unit("GB/s", "--bandwidth-unit") == BandwidthUnit::kGBps);
  CHECK(parse_bandwidth_unit("bytes/s", "--bandwidth-unit") == BandwidthUnit::kBytesPerSecond);
  CHECK_THROWS_AS(parse_bandwidth_unit("furlongs", "--bandwidth-unit"), InputError);
}

TEST_CASE("absurd clusterfile bandwidths are rejected with the key", "[network][errors]") {
  const Cluster c = two_nodes(300, 25e9);  // bytes/s written where GB/s is expected
  const RankLayout layout(c, {0});
  try {
    Network n(c, layout);
    FAIL("expected InputError");
  } catch (const InputError& e) {
    const std::string m = e.what();
    CHECK(m.find("cluster.json: key '10.0.0.1.inter_bandwidth'") != std::string::npos);
    CHECK(m.find("bytes/s") != std::string::npos);
  }
  // The same numbers are fine once declared as bytes/s... except the intra value 300, which is then absurd.
  NetworkOptions o;
  o.unit = BandwidthUnit::kBytesPerSecond;
  CHECK_THROWS_AS(Network(c, layout, o), InputError);
  const Cluster ok = two_nodes(300e9, 25e9);
  CHECK_NOTHROW(Network(ok, RankLayout(ok, {0}), o));
}

TEST_CASE("p2p uses the link the two ranks share", "[network]") {
  const Cluster c = two_nodes();
  const RankLayout layout(c, {0});
  NetworkOptions o;
  o.intra_latency_s = 1e-6;
  o.inter_latency_s = 1e-5;
  const Network n(c, layout, o);
  const double bytes = 1e9;
  CHECK(n.p2p_seconds(0, 1, bytes) == Approx(1e-6 + bytes / 300e9).epsilon(1e-12));  // same node
  CHECK(n.p2p_seconds(3, 4, bytes) == Approx(1e-5 + bytes / 25e9).epsilon(1e-12));   // across nodes
  CHECK(n.p2p_seconds(2, 2, bytes) == 0);
}

TEST_CASE("ring and hierarchical all-reduce", "[network]") {
  const Cluster c = two_nodes();
  const RankLayout layout(c, {0});
  NetworkOptions o;
  o.intra_latency_s = 1e-6;
  o.inter_latency_s = 1e-5;
  const Network n(c, layout, o);
  const double B = 4e9;
  // One node, 4 ranks: 2 (n-1) steps of latency + 2 (n-1)/n B / bw.
  CHECK(n.ring_all_reduce_seconds({0, 1, 2, 3}, B) == Approx(6 * 1e-6 + 1.5 * B / 300e9).epsilon(1e-12));
  // Across both nodes the ring's slowest link is the inter-node one.
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(n.ring_all_reduce_seconds(all, B) == Approx(14 * 1e-5 + 2.0 * 7 / 8 * B / 25e9).epsilon(1e-12));
  // Hierarchical: reduce-scatter + all-gather inside each node (2 x (3 latency + 3/4 B / 300e9)), then each
  // rank's quarter all-reduced across the 2 nodes (2 latency + 2 x 1/2 x B/4 / 25e9).
  const double hier = 2 * (3 * 1e-6 + 0.75 * B / 300e9) + (2 * 1e-5 + 1.0 * (B / 4) / 25e9);
  CHECK(n.hierarchical_all_reduce_seconds(all, B) == Approx(hier).epsilon(1e-12));
  CHECK(n.all_reduce_seconds(all, B) == Approx(hier).epsilon(1e-12));  // the faster here
  CHECK(hier < n.ring_all_reduce_seconds(all, B));
  // All-gather: (n-1)/n of the data.
  CHECK(n.all_gather_seconds({0, 1, 2, 3}, B) == Approx(3 * 1e-6 + 0.75 * B / 300e9).epsilon(1e-12));
}

namespace {

// The strided all-reduces as they were first written, rank by rank: the ring over every member, and the
// hierarchical one over each node's run of members and then the runs' leaders (collective bandwidth =
// link bandwidth: no measured collectives).
double reference_strided(const Network& n, const RankLayout& layout, int first, int stride, int count, double bytes,
                         bool ring_only) {
  if (count <= 1 || bytes <= 0) return 0.0;
  auto ring_over = [&](int i0, int i1, double* bw, double* lat) {
    *bw = std::numeric_limits<double>::infinity();
    *lat = 0;
    const int k = i1 - i0;
    for (int i = 0; i < k; ++i) {
      const int a = first + (i0 + i) * stride, b = first + (i0 + (i + 1) % k) * stride;
      *bw = std::min(*bw, n.link_bandwidth(a, b));
      *lat = std::max(*lat, n.link_latency(a, b));
    }
  };
  const double c = count;
  double bw, lat;
  ring_over(0, count, &bw, &lat);
  const double ring = 2 * (c - 1) * lat + 2 * (c - 1) / c * bytes / bw;
  const double ring_bw = bw;
  if (ring_only) return ring;
  auto node = [&](int i) { return layout.node_of(first + i * stride); };
  double intra = 0, leader_bw = std::numeric_limits<double>::infinity(), leader_lat = 0;
  int runs = 0, per_node = 0, prev = -1, first_leader = -1;
  for (int i0 = 0; i0 < count;) {
    int i1 = i0 + 1;
    while (i1 < count && node(i1) == node(i0)) ++i1;
    const double k = i1 - i0;
    if (k > 1) {
      ring_over(i0, i1, &bw, &lat);
      intra = std::max(intra, 2 * ((k - 1) * lat + (k - 1) / k * bytes / bw));
    }
    const int leader = first + i0 * stride;
    if (prev >= 0) {
      leader_bw = std::min(leader_bw, n.link_bandwidth(prev, leader));
      leader_lat = std::max(leader_lat, n.link_latency(prev, leader));
    } else {
      first_leader = leader;
    }
    prev = leader;
    per_node = std::max(per_node, i1 - i0);
    ++runs;
    i0 = i1;
  }
  if (runs == 1) return ring;
  leader_bw = std::min(leader_bw, n.link_bandwidth(prev, first_leader));
  leader_lat = std::max(leader_lat, n.link_latency(prev, first_leader));
  const double nl = runs, leader_bytes = bytes / per_node;
  const double inter = 2 * (nl - 1) * leader_lat + 2 * (nl - 1) / nl * leader_bytes / leader_bw;
  // NCCL's tree: a chain of per_node ranks in each node, a double binary tree over the nodes, the ring's bytes.
  const double tree = 2 * ((per_node - 1) * n.link_latency(first, first) + std::ceil(std::log2(nl)) * leader_lat) +
                      2 * (c - 1) / c * bytes / ring_bw;
  return std::min({ring, intra + inter, tree});
}

}  // namespace

TEST_CASE("strided all-reduces walked node by node equal the rank-by-rank walk exactly", "[network]") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    // 1-3 types, each with its own intra and inter bandwidth; 1-12 nodes of 1-8 GPUs each.
    const int types = 1 + static_cast<int>(rng() % 3);
    std::vector<ClusterfileEntry> cf;
    const char* names[] = {"A100", "V100", "H100"};
    for (int t = 0; t < types; ++t)
      cf.push_back({"10.0.0." + std::to_string(t + 1), names[t], 5.0 + static_cast<double>(rng() % 200),
                    50.0 + static_cast<double>(rng() % 800), 80});
    std::vector<std::pair<std::string, int>> hosts;
    const int nodes = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < nodes; ++i)
      hosts.emplace_back("10.0.0." + std::to_string(1 + rng() % types), 1 + static_cast<int>(rng() % 8));
    const Cluster c = Cluster::from_parts(hosts, cf, "hostfile", "cluster.json");
    std::vector<int> sequence(c.device_types().size());
    for (std::size_t t = 0; t < sequence.size(); ++t) sequence[t] = static_cast<int>(t);
    std::shuffle(sequence.begin(), sequence.end(), rng);
    const RankLayout layout(c, sequence);
    NetworkOptions o;
    o.intra_latency_s = 1e-6 * (1 + rng() % 5);
    o.inter_latency_s = 1e-5 * (1 + rng() % 5);
    const Network n(c, layout, o);
    const int R = layout.num_ranks();
    for (int q = 0; q < 40; ++q) {
      const int stride = 1 + static_cast<int>(rng() % 8), first = static_cast<int>(rng() % R);
      const int most = (R - 1 - first) / stride + 1;
      const int count = 1 + static_cast<int>(rng() % most);
      const double bytes = q % 10 == 0 ? 0.0 : 1e6 * (1 + rng() % 5000);
      INFO("trial " << trial << ": " << R << " ranks; first " << first << ", stride " << stride << ", count " << count);
      CHECK(n.all_reduce_seconds_strided(RankStride{first, stride, count}, bytes) ==
            reference_strided(n, layout, first, stride, count, bytes, false));
      CHECK(n.ring_all_reduce_seconds_strided(RankStride{first, stride, count}, bytes) ==
            reference_strided(n, layout, first, stride, count, bytes, true));
    }
  }
}

TEST_CASE("NCCL's tree: logarithmic latency over nodes, the ring's bandwidth term", "[network][seqpar]") {
  // 16 nodes of 8 GPUs, 50 GB/s inter, 400 GB/s intra; a dp group of one GPU per node (stride 8).
  std::vector<ClusterfileEntry> cf = {{"10.0.0.1", "H100", 50, 400, 80}};
  std::vector<std::pair<std::string, int>> hosts(16, {"10.0.0.1", 8});
  const Cluster c = Cluster::from_parts(hosts, cf, "hostfile", "cluster.json");
  const RankLayout layout(c, {0});
  NetworkOptions o;
  o.intra_latency_s = 5e-6;
  o.inter_latency_s = 20e-6;
  const Network n(c, layout, o);
  const RankStride group{0, 8, 16};
  const double bw = 50e9;
  // A small message: the ring pays 2 x 15 inter-node latencies, the tree 2 x log2(16) = 8.
  const double small = 1e4;
  const double ring = 2 * 15 * 20e-6 + 2 * 15.0 / 16 * small / bw;
  const double tree = 2 * 4 * 20e-6 + 2 * 15.0 / 16 * small / bw;
  CHECK(n.ring_all_reduce_seconds_strided(group, small) == Approx(ring).epsilon(1e-12));
  CHECK(n.all_reduce_seconds_strided(group, small) == Approx(tree).epsilon(1e-12));
  std::vector<int> ranks;
  for (int i = 0; i < 16; ++i) ranks.push_back(8 * i);
  CHECK(n.tree_all_reduce_seconds(ranks, small) == Approx(tree).epsilon(1e-12));
  CHECK(n.all_reduce_seconds(ranks, small) == Approx(tree).epsilon(1e-12));
  // Inside one node the tree is a chain: no better than the ring.
  const RankStride node{0, 1, 8};
  CHECK(n.all_reduce_seconds_strided(node, small) == n.ring_all_reduce_seconds_strided(node, small));
}
