// Issue 33 item 3: a rank's device memory in use (sim/device_memory.h) = allocated peak + the caching
// allocator's reserve + the framework constant + NCCL's communicators, and the search keeps only plans
// whose every rank fits that plus the headroom.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "fixtures.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "planner/plan_search.h"
#include "sim/device_memory.h"
#include "sim/memory_model.h"
#include "sim/plan_simulator.h"

namespace hetplan {
namespace {

constexpr double kMiB = 1024.0 * 1024;

const ProfileSet& profiles6() {
  static std::unique_ptr<ProfileSet> set;
  if (!set)
    set = std::make_unique<ProfileSet>(
        ProfileSet::load(test::six_layer_profile_dir({"A100", "V100"}, "device-memory-profiles"), 6));
  return *set;
}

Cluster a100s(int gpus, double memory_gb) {
  return Cluster::from_parts({{"10.0.0.1", gpus}}, {{"10.0.0.1", "A100", 25, 300, memory_gb}}, "hosts", "clusterfile");
}

SimulationOptions options(bool device_memory, double headroom_fraction) {
  SimulationOptions o;
  o.setup.framework_bytes = -1;  // the profiles' (none here: the default)
  o.max_profiled_bs = 8;
  o.device_memory.enabled = device_memory;
  o.device_memory.headroom_fraction = headroom_fraction;
  return o;
}

PlanResult plan(std::vector<int> groups, std::vector<Strategy> st, std::vector<int> layers, int batches) {
  PlanResult p;
  p.node_sequence = {"A100"};
  p.device_groups = std::move(groups);
  p.strategies = std::move(st);
  p.layer_partition = std::move(layers);
  p.batches = batches;
  return p;
}

double peak_total(const PlanSimulation& s) {
  double peak = 0;
  for (const auto& r : s.ranks) peak = std::max(peak, r.breakdown.gpu_total());
  return peak;
}

RankPlacement at(int world, int tp, int dp, int pp, int stage, bool tied, int v = 1, int cp = 1) {
  RankPlacement p;
  p.world = world;
  p.tp = tp;
  p.dp = dp;
  p.pp = pp;
  p.stage = stage;
  p.tied = tied;
  p.virtual_stages = v;
  p.context_parallel = cp;
  return p;
}

}  // namespace

TEST_CASE("each rank joins the world, tp, dp and tied-embedding groups and two p2p groups per neighbour",
          "[device-memory]") {
  auto c = rank_communicators(at(8, 2, 2, 2, 0, true));  // first of two stages: world, tp, dp, embedding; 1 neighbour
  CHECK(c.collective == 4);
  CHECK(c.p2p == 2);
  c = rank_communicators(at(12, 1, 4, 3, 1, true));  // middle stage: no embedding group, two neighbours
  CHECK(c.collective == 2);
  CHECK(c.p2p == 4);
  c = rank_communicators(at(8, 4, 1, 2, 1, false));  // untied: no embedding group
  CHECK(c.collective == 2);
  CHECK(c.p2p == 2);
  c = rank_communicators(at(1, 1, 1, 1, 0, true));  // alone: no communicator, no NCCL
  CHECK(c.collective == 0);
  CHECK(c.p2p == 0);
  DeviceMemoryOptions o;
  CHECK(nccl_bytes(c, o) == 0);
  // NCCL's default buffers: Simple 4 MiB + LL 512 KiB + LL128 4,915,200 B per connection, 32 channels x
  // (ring + tree) per collective communicator.
  CHECK(o.collective_communicator_bytes() == 64 * (4194304.0 + 524288.0 + 4915200.0));
  CHECK(o.collective_communicator_bytes() / kMiB == Approx(588.0).epsilon(1e-3));
  c = rank_communicators(at(2, 1, 1, 2, 1, true));  // replay's pp 2 plans: world + embedding + fwd + bwd
  CHECK(nccl_bytes(c, o) == o.nccl_library_bytes + 2 * o.collective_communicator_bytes() + 2 * o.nccl_p2p_communicator_bytes);
  o.enabled = false;
  CHECK(nccl_bytes(c, o) == 0);
  CHECK(allocator_reserve_bytes(1e9, 5e8, o) == 0);
}

TEST_CASE("interleaved: the first and last stage join the wrap-around pairs' two p2p groups", "[device-memory]") {
  // Replay's make_groups: with v > 1 the last stage's chunk c feeds the first stage's chunk c + 1 over a
  // forward and a backward pair of their own; the middle stages join none.
  for (int pp : {2, 3, 4}) {
    INFO("pp " << pp);
    for (int stage = 0; stage < pp; ++stage) {
      const int neighbours = (stage > 0) + (stage + 1 < pp);
      const bool end = stage == 0 || stage == pp - 1;
      CHECK(rank_communicators(at(pp, 1, 1, pp, stage, true, 1)).p2p == 2 * neighbours);
      CHECK(rank_communicators(at(pp, 1, 1, pp, stage, true, 2)).p2p == 2 * neighbours + (end ? 2 : 0));
      CHECK(rank_communicators(at(pp, 1, 1, pp, stage, true, 2)).collective ==
            rank_communicators(at(pp, 1, 1, pp, stage, true, 1)).collective);
    }
  }
  // No pipeline, no wrap.
  CHECK(rank_communicators(at(2, 1, 2, 1, 0, true, 2)).p2p == 0);
}

TEST_CASE("context parallelism: each rank joins its cp ring's group (one p2p communicator)", "[device-memory][cp]") {
  // dp 2 carved into one cp 2 ring (the plan's dp counts the cp ranks): world, dp, and the ring's group.
  auto c = rank_communicators(at(2, 1, 2, 1, 0, false, 1, 2));
  CHECK(c.collective == 2);
  CHECK(c.p2p == 1);
  c = rank_communicators(at(2, 1, 2, 1, 0, false, 1, 1));
  CHECK(c.collective == 2);
  CHECK(c.p2p == 0);
  // With a pipeline: the neighbours' pairs as before, plus the ring.
  c = rank_communicators(at(16, 2, 4, 2, 1, true, 1, 2));
  CHECK(c.collective == 4);
  CHECK(c.p2p == 3);
}

TEST_CASE("simulate prices the wrap-around pairs of an interleaved plan and a cp ring's group",
          "[device-memory][cp][interleaved]") {
  const Cluster cluster = a100s(4, 80), pair = a100s(2, 80);
  const ModelShape shape = test::six_layer_shape();
  const DeviceMemoryOptions dm;
  {
    SimulationOptions plain = options(true, 0.03), inter = options(true, 0.03);
    inter.schedule = Schedule::kInterleaved1F1B;
    inter.virtual_stages = 2;
    const PlanResult p = plan({1, 1}, {{1, 1}, {1, 1}}, {0, 3, 6}, 4);
    const PlanSimulation a = PlanSimulator(pair, profiles6(), shape, 1024, plain).simulate(p, 16);
    const PlanSimulation b = PlanSimulator(pair, profiles6(), shape, 1024, inter).simulate(p, 16);
    REQUIRE(a.ranks.size() == 2);
    REQUIRE(b.ranks.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      // world + embedding; fwd + bwd with the other stage; interleaved: the wrap's fwd + bwd as well.
      CHECK(a.ranks[i].breakdown.nccl ==
            dm.nccl_library_bytes + 2 * dm.collective_communicator_bytes() + 2 * dm.nccl_p2p_communicator_bytes);
      CHECK(b.ranks[i].breakdown.nccl ==
            dm.nccl_library_bytes + 2 * dm.collective_communicator_bytes() + 4 * dm.nccl_p2p_communicator_bytes);
    }
  }
  {
    SimulationOptions dp = options(true, 0.03), cp = options(true, 0.03);
    cp.setup.context_parallel = 2;
    const PlanResult p = plan({4}, {{2, 2}}, {0, 6}, 4);
    const PlanSimulation a = PlanSimulator(cluster, profiles6(), shape, 1024, dp).simulate(p, 16);
    const PlanSimulation b = PlanSimulator(cluster, profiles6(), shape, 1024, cp).simulate(p, 16);
    REQUIRE(a.ranks.size() == 4);
    REQUIRE(b.ranks.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      // world, tp, dp; with cp 2 also the ring's group.
      CHECK(a.ranks[i].breakdown.nccl == dm.nccl_library_bytes + 3 * dm.collective_communicator_bytes());
      CHECK(b.ranks[i].breakdown.nccl ==
            dm.nccl_library_bytes + 3 * dm.collective_communicator_bytes() + dm.nccl_p2p_communicator_bytes);
    }
  }
}

TEST_CASE("the allocator reserve: the fraction of the peak, or the largest transient with segments of its own",
          "[device-memory]") {
  DeviceMemoryOptions o;
  // The head's logits are held as fp32: 4 bytes an element; the larger of the two transients counts, not the sum.
  CHECK(own_segment_bytes(1e8, 0) == 4e8);
  CHECK(own_segment_bytes(1e8, 3e8) == 4e8);
  CHECK(own_segment_bytes(1e8, 5e8) == 5e8);
  CHECK(own_segment_bytes(0, 0) == 0);
  CHECK(allocator_reserve_bytes(1e10, 0, o) == Approx(0.06 * 1e10).epsilon(1e-12));
  CHECK(allocator_reserve_bytes(1e10, 4e8, o) == Approx(6e8).epsilon(1e-12));  // the fraction is more
  CHECK(allocator_reserve_bytes(1e10, 2e9, o) == 2e9);                        // the transient is more
}

TEST_CASE("simulate: the head's fp32 logits and overlapped ZeRO-2/3's held buckets set the reserve where larger",
          "[device-memory][zero]") {
  const Cluster cluster = a100s(4, 80);
  const ModelShape shape = test::six_layer_shape();
  const int last = shape.metis_num_layers();
  REQUIRE(last == 6);
  // A small fraction, so that the transients decide (the fraction alone would give 0.001 x the peak).
  SimulationOptions o = options(true, 0.03);
  o.device_memory.allocator_reserve_fraction = 0.001;
  {
    // pp 2 of (dp 1, tp 2), 4 micro-batches of 16: stage 1 holds the head, 4 sequences a micro-batch.
    const PlanResult p = plan({2, 2}, {{1, 2}, {1, 2}}, {0, 3, 6}, 4);
    const PlanSimulation a = PlanSimulator(cluster, profiles6(), shape, 1024, o).simulate(p, 16);
    REQUIRE(a.ranks.size() == 4);
    const double logits = 4.0 * 4 * 1024 * static_cast<double>(shape.vocab_size) / 2;  // fp32 [4, 1024, V / tp]
    for (const auto& r : a.ranks) {
      INFO("rank " << r.rank);
      const MemoryBreakdown& x = r.breakdown;
      if (r.stage == 0) {
        CHECK(x.allocator_reserve == Approx(0.001 * x.allocated_peak()).epsilon(1e-12));
      } else {
        REQUIRE(logits > 0.001 * x.allocated_peak());
        CHECK(x.allocator_reserve == logits);
      }
    }
  }
  {
    // pp 2 of (dp 2, tp 1), ZeRO-2: with overlapped gradient reduction stage 0 holds the fp32 buckets of all
    // its layers' parameters at once; without, one at a time (the fraction).
    const PlanResult p = plan({2, 2}, {{2, 1}, {2, 1}}, {0, 3, 6}, 4);
    SimulationOptions plain = o, overlapped = o;
    plain.setup.zero_stage = overlapped.setup.zero_stage = 2;
    overlapped.setup.overlap.grad_reduce = true;
    const PlanSimulation a = PlanSimulator(cluster, profiles6(), shape, 1024, plain).simulate(p, 16);
    const PlanSimulation b = PlanSimulator(cluster, profiles6(), shape, 1024, overlapped).simulate(p, 16);
    REQUIRE(a.ranks.size() == 4);
    REQUIRE(b.ranks.size() == 4);
    const double buckets =
        shard_params(shape, 0, 3, 2, overlapped.setup).on_rank(1) * reduced_gradient_bytes(overlapped.setup);
    for (std::size_t i = 0; i < 2; ++i) {
      INFO("rank " << i);
      CHECK(a.ranks[i].breakdown.allocator_reserve == Approx(0.001 * a.ranks[i].breakdown.allocated_peak()).epsilon(1e-12));
      REQUIRE(buckets > 0.001 * b.ranks[i].breakdown.allocated_peak());
      CHECK(b.ranks[i].breakdown.allocator_reserve == buckets);
    }
  }
}

TEST_CASE("memory headroom (--memory-headroom) takes a share or an amount", "[device-memory][cli]") {
  DeviceMemoryOptions o;
  parse_memory_headroom("5%", "--memory-headroom", &o);
  CHECK(o.headroom_fraction == Approx(0.05));
  CHECK(o.headroom_bytes == 0);
  CHECK(o.usable_bytes(100.0) == Approx(95.0));
  parse_memory_headroom("2GiB", "--memory-headroom", &o);
  CHECK(o.headroom_fraction == 0);
  CHECK(o.headroom_bytes == 2.0 * 1024 * kMiB);
  parse_memory_headroom("512 MiB", "--memory-headroom", &o);
  CHECK(o.headroom_bytes == 512 * kMiB);
  for (const char* bad : {"", "x", "-1%", "60%", "3", "3 parsecs", "nan%"})
    CHECK_THROWS_AS(parse_memory_headroom(bad, "--memory-headroom", &o), InputError);
}

TEST_CASE("simulate prices each rank's device memory in use, term by term", "[device-memory]") {
  const Cluster cluster = a100s(4, 80);
  const ModelShape shape = test::six_layer_shape();
  const PlanSimulator with(cluster, profiles6(), shape, 1024, options(true, 0.03));
  const PlanSimulator without(cluster, profiles6(), shape, 1024, options(false, 0));
  // pp 2 of (dp 1, tp 2): stage 0's ranks join world, tp, embedding (tied GPT) and two p2p groups.
  const PlanResult p = plan({2, 2}, {{1, 2}, {1, 2}}, {0, 3, 6}, 4);
  const PlanSimulation a = with.simulate(p, 16), b = without.simulate(p, 16);
  REQUIRE(a.ranks.size() == 4);
  const DeviceMemoryOptions dm;
  for (std::size_t i = 0; i < a.ranks.size(); ++i) {
    const MemoryBreakdown& x = a.ranks[i].breakdown;
    const MemoryBreakdown& y = b.ranks[i].breakdown;
    CHECK(x.allocated_peak() == y.allocated_peak());  // the allocator's peak is not changed
    CHECK(x.framework == dm.default_framework_bytes);  // no measured framework_mb: the default
    CHECK(y.framework == 0);
    // Stage 1 holds the head: its fp32 logits (4 sequences of 1024 tokens, vocab / tp 2) take segments of their
    // own, more than 6% of its peak; stage 0 the fraction.
    const double logits = a.ranks[i].stage == 1 ? 4.0 * 4 * 1024 * static_cast<double>(shape.vocab_size) / 2 : 0;
    CHECK(x.allocator_reserve == Approx(std::max(0.06 * x.allocated_peak(), logits)).epsilon(1e-12));
    CHECK(x.nccl == dm.nccl_library_bytes + 3 * dm.collective_communicator_bytes() + 2 * dm.nccl_p2p_communicator_bytes);
    CHECK(x.gpu_total() == x.allocated_peak() + x.allocator_reserve + x.framework + x.nccl);
    CHECK(a.ranks[i].capacity_bytes == 80.0 * 1024 * kMiB);
    CHECK(a.ranks[i].usable_bytes == Approx(0.97 * 80.0 * 1024 * kMiB));
  }
  // A GPU that holds the allocated peak but not what the process uses: the plan fits only without the model.
  const double gb = (a.ranks[0].breakdown.allocated_peak() + 0.5 * a.ranks[0].breakdown.nccl) / (1024 * kMiB);
  const Cluster tight = a100s(4, gb);
  const PlanSimulation c = PlanSimulator(tight, profiles6(), shape, 1024, options(true, 0)).simulate(p, 16);
  const PlanSimulation d = PlanSimulator(tight, profiles6(), shape, 1024, options(false, 0)).simulate(p, 16);
  CHECK_FALSE(c.fits);
  CHECK(d.fits);
}

TEST_CASE("the framework constant is the one measured at tp 1 (the tp group's NCCL is priced apart)",
          "[device-memory][profiles]") {
  profiles6();  // writes its files
  const auto dir = test::scratch_dir("device-memory-framework");
  std::filesystem::copy(test::scratch_dir("device-memory-profiles"), dir,
                        std::filesystem::copy_options::overwrite_existing | std::filesystem::copy_options::recursive);
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    ordered_json j = read_json_file(f.path().string());
    const int tp = f.path().filename().string().find("_tp2_") != std::string::npos ? 2 : 1;
    j["execution_memory"]["framework_mb"] = 1000.0 + 100.0 * tp;  // as if the tp group's buffers were in it
    write_json_file(f.path().string(), j);
  }
  const ProfileSet measured = ProfileSet::load(dir.string(), 6);
  const Cluster cluster = a100s(4, 80);
  const ModelShape shape = test::six_layer_shape();
  const PlanResult p = plan({4}, {{2, 2}}, {0, 6}, 4);
  const PlanSimulation on = PlanSimulator(cluster, measured, shape, 1024, options(true, 0.03)).simulate(p, 16);
  const PlanSimulation off = PlanSimulator(cluster, measured, shape, 1024, options(false, 0)).simulate(p, 16);
  for (const auto& r : on.ranks) CHECK(r.breakdown.framework == 1100 * kMiB);
  for (const auto& r : off.ranks) CHECK(r.breakdown.framework == 1200 * kMiB);
}

TEST_CASE("the search's best plan fits its device memory in use plus the headroom", "[device-memory][search]") {
  const ModelShape shape = test::six_layer_shape();
  PlanSearchOptions o;
  o.gbs = 16;
  o.top_k = 1;
  // The best plan with only the allocated peak priced, on 80 GB.
  const Cluster roomy = a100s(4, 80);
  const PlanSimulator plain(roomy, profiles6(), shape, 1024, options(false, 0));
  const PlanSearchResult old_best = PlanSearch(roomy, profiles6(), plain, o).run();
  REQUIRE(old_best.top.size() == 1);
  const double old_peak = peak_total(plain.simulate(old_best.top[0].plan, 16));
  // GPUs just large enough for it that way: the device-memory model must choose another plan (or none).
  const Cluster tight = a100s(4, old_peak * 1.001 / (1024 * kMiB));
  const PlanSimulator old_model(tight, profiles6(), shape, 1024, options(false, 0));
  const PlanSearchResult still = PlanSearch(tight, profiles6(), old_model, o).run();
  REQUIRE(still.top.size() == 1);
  CHECK(still.top[0].plan.strategies == old_best.top[0].plan.strategies);
  const PlanSimulator model(tight, profiles6(), shape, 1024, options(true, 0.03));
  const PlanSearchResult now = PlanSearch(tight, profiles6(), model, o).run();
  for (const SearchedPlan& p : now.top) {
    const PlanSimulation s = model.simulate(p.plan, 16);
    CHECK(s.fits);
    for (const auto& r : s.ranks) CHECK(r.breakdown.gpu_total() <= 0.97 * r.capacity_bytes * (1 + 1e-12));
  }
  const PlanSimulation old_now = model.simulate(old_best.top[0].plan, 16);
  CHECK_FALSE(old_now.fits);
  if (!now.top.empty()) CHECK_FALSE(now.top[0].plan.cost == old_best.top[0].plan.cost);
}

}  // namespace hetplan
