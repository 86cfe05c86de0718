// Network: units, p2p over the link two ranks share, ring and hierarchical
// all-reduce, against the closed forms (Thakur et al. 2005, "Optimization of
// Collective Communication Operations in MPICH", Sec. 4: ring all-reduce moves
// 2 (p - 1) / p of the data per rank in 2 (p - 1) steps).
#include <catch2/catch.hpp>

#include "sim/input_error.h"
#include "sim/network.h"

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
