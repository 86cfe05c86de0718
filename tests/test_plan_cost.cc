// PlanCostModel (the fast cost path) against PlanSimulator::run and
// simulate_timeline (the explain path), and the rank grid both use.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "fixtures.h"
#include "sim/analytic_profiles.h"
#include "sim/data_load_balancer.h"
#include "sim/gpu_specs.h"
#include "sim/layer_time_model.h"
#include "base/input_error.h"
#include "sim/model_shape.h"
#include "sim/plan_cost.h"
#include "base/json_util.h"

namespace hetplan {
namespace {

// The 16-GPU A100/V100 set of `hetplan gen-profiles --analytic 10 64 --types A100,V100 --max-tp 16`.
struct Setup16 {
  Cluster cluster;
  ProfileSet profiles;
  ModelConfig model;
  Setup16()
      : cluster(Cluster::load(std::string(HETPLAN_SOURCE_DIR) + "/hostfiles/a100_v100_16.hostfile",
                              std::string(HETPLAN_SOURCE_DIR) + "/hostfiles/clusterfile.json")),
        profiles(load()) {}
  static ProfileSet load() {
    const auto dir = test::scratch_dir("analytic-a100-v100");
    AnalyticOptions o;
    o.model.num_layers = 10;
    o.max_bs = 64;
    o.max_tp = 16;
    o.device_types = {"A100", "V100"};
    o.extensions = false;  // Metis's keys only: memory by the analytic terms
    generate_analytic_profiles(o, dir.string());
    return ProfileSet::load(dir.string(), 10);
  }
  PlanSimulator simulator(const TrainingSetup& setup, Schedule schedule = Schedule::k1F1B) const {
    SimulationOptions so;
    so.schedule = schedule;
    so.setup = setup;
    return PlanSimulator(cluster, profiles, shape_from_model_config(model), model.sequence_length, so);
  }
};

const Setup16& setup16() {
  static const Setup16 s;
  return s;
}

double rel_diff(double a, double b) { return a == b ? 0.0 : std::abs(a - b) / std::max(std::abs(a), std::abs(b)); }

std::vector<TrainingSetup> searched_setups() {
  std::vector<TrainingSetup> out;
  const std::pair<int, Recompute> settings[] = {
      {0, Recompute::kNone}, {1, Recompute::kSelective}, {2, Recompute::kNone}, {3, Recompute::kFull}};
  for (const auto& [zero, recompute] : settings) {
    TrainingSetup s;
    s.zero_stage = zero;
    s.recompute = recompute;
    s.framework_bytes = -1;
    out.push_back(s);
  }
  return out;
}

// Random per-micro-batch costs of a stage (or chunk), 0-10 ms: forward, backward, and, each zero one time in
// three, accumulation and the sends. The draws' order is part of each test's sequence.
void draw_micro_batch_costs(std::mt19937& rng, FastStageCost* c) {
  std::uniform_real_distribution<double> ms(0.0, 10.0);
  c->forward_ms = ms(rng);
  c->backward_ms = ms(rng);
  c->accumulation_ms = rng() % 3 == 0 ? 0.0 : ms(rng) / 10;
  c->send_forward_ms = rng() % 3 == 0 ? 0.0 : ms(rng) / 5;
  c->send_backward_ms = rng() % 3 == 0 ? 0.0 : ms(rng) / 5;
}

// Random per-iteration costs of a stage: the all-reduce (zero one time in four), the optimizer, and half the
// time a sustained-clock slowdown of up to 20%.
void draw_update_costs(std::mt19937& rng, FastStageCost* c) {
  std::uniform_real_distribution<double> ms(0.0, 10.0);
  c->allreduce_ms = rng() % 4 == 0 ? 0.0 : ms(rng) * 3;
  c->optimizer_ms = ms(rng);
  c->sustained_factor = rng() % 2 ? 1.0 : 1.0 + ms(rng) / 50;
}

}  // namespace

TEST_CASE("iteration_ms equals simulate_timeline's longest path", "[plan_cost]") {
  const Setup16& s = setup16();
  const PlanSimulator sim = s.simulator(TrainingSetup{});
  const RankLayout layout(s.cluster, {0, 1});
  const PlanCostModel model(sim, layout, {TrainingSetup{}});
  std::mt19937 rng(12345);
  PipelineScratch scratch;
  int stretched = 0, checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int p = std::uniform_int_distribution<int>(1, 8)(rng);
    const int m = std::uniform_int_distribution<int>(1, 32)(rng);
    const Schedule schedule = trial % 2 ? Schedule::kGpipe : Schedule::k1F1B;
    std::vector<FastStageCost> fast(p);
    for (auto& c : fast) {
      draw_micro_batch_costs(rng, &c);
      draw_update_costs(rng, &c);
    }
    for (int i = 0; i < p; ++i) {
      if (i == 0) fast[i].send_backward_ms = 0;
      if (i == p - 1) fast[i].send_forward_ms = 0;
    }
    TimelineInput tin;
    tin.microbatches = m;
    tin.schedule = schedule;
    for (const auto& f : fast) tin.stages.push_back(timeline_stage_times(f));
    // PlanSimulator::run's stretch of the pace-setting stage, found here independently.
    int pace = 0;
    for (int i = 1; i < p; ++i)
      if (fast[i].busy_ms(m) > fast[pace].busy_ms(m)) pace = i;
    if (fast[pace].sustained_factor > 1) {
      tin.stages[pace].forward_ms *= fast[pace].sustained_factor;
      tin.stages[pace].backward_ms *= fast[pace].sustained_factor;
      ++stretched;
    }
    REQUIRE(model.pace_stage(fast.data(), p, m) == (fast[pace].sustained_factor > 1 ? pace : -1));
    const double want = simulate_timeline(tin).iteration_ms;
    const double got = model.iteration_ms(fast.data(), p, m, schedule, &scratch);
    INFO("trial " << trial << " p " << p << " m " << m);
    REQUIRE(rel_diff(got, want) <= 1e-12);
    ++checked;
  }
  CHECK(checked == 400);
  CHECK(stretched > 50);
}

TEST_CASE("interleaved: iteration_ms with chunk costs equals simulate_timeline's longest path",
          "[plan_cost][interleaved]") {
  const Setup16& s = setup16();
  SimulationOptions so;
  so.schedule = Schedule::kInterleaved1F1B;
  so.virtual_stages = 2;
  const PlanSimulator sim(s.cluster, s.profiles, shape_from_model_config(s.model), s.model.sequence_length, so);
  const RankLayout layout(s.cluster, {0, 1});
  const PlanCostModel model(sim, layout, {TrainingSetup{}});
  std::mt19937 rng(4242);
  PipelineScratch scratch;
  int checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int p = std::uniform_int_distribution<int>(2, 6)(rng);
    const int v = std::uniform_int_distribution<int>(2, 4)(rng);
    const int m = p * std::uniform_int_distribution<int>(1, 5)(rng);
    std::vector<FastStageCost> stages(p), chunks(static_cast<std::size_t>(p) * v);
    for (auto& c : stages) draw_update_costs(rng, &c);
    for (auto& c : chunks) draw_micro_batch_costs(rng, &c);
    // The stage as a whole (for the pace): its chunks' sums.
    for (int k = 0; k < p * v; ++k) {
      stages[k % p].forward_ms += chunks[k].forward_ms;
      stages[k % p].backward_ms += chunks[k].backward_ms;
      stages[k % p].accumulation_ms += chunks[k].accumulation_ms;
    }
    TimelineInput tin;
    tin.microbatches = m;
    tin.schedule = Schedule::kInterleaved1F1B;
    tin.virtual_stages = v;
    for (const auto& f : stages) {
      StageCosts c;
      c.allreduce_ms = f.allreduce_ms;
      c.optimizer_ms = f.optimizer_ms;
      tin.stages.push_back(c);
    }
    const int pace = model.pace_stage(stages.data(), p, m);
    for (int k = 0; k < p * v; ++k) {
      const FastStageCost& f = chunks[k];
      StageCosts c;
      c.forward_ms = f.forward_ms;
      c.backward_ms = f.backward_ms;
      if (k % p == pace) {  // PlanSimulator::run's stretch of the pace-setting stage's chunks
        c.forward_ms *= stages[pace].sustained_factor;
        c.backward_ms *= stages[pace].sustained_factor;
      }
      c.accumulation_ms = f.accumulation_ms;
      c.send_forward_ms = k + 1 < p * v ? f.send_forward_ms : 0.0;
      c.send_backward_ms = k > 0 ? f.send_backward_ms : 0.0;
      tin.chunks.push_back(c);
    }
    chunks.front().send_backward_ms = chunks.back().send_forward_ms = 0;  // no such links
    const double want = simulate_timeline(tin).iteration_ms;
    const double got = model.iteration_ms(stages.data(), p, m, Schedule::kInterleaved1F1B, &scratch, chunks.data(), v);
    INFO("trial " << trial << " p " << p << " v " << v << " m " << m);
    REQUIRE(got == want);  // bit for bit
    ++checked;
  }
  CHECK(checked == 200);
}

TEST_CASE("interleaved: PlanSimulator::run's timeline equals the fast cost of its chunks, on random plans",
          "[plan_cost][interleaved]") {
  const Setup16& s = setup16();
  std::mt19937 rng(99);
  int plans = 0;
  for (const int v : {2, 3}) {
    SimulationOptions so;
    so.schedule = Schedule::kInterleaved1F1B;
    so.virtual_stages = v;
    const PlanSimulator sim(s.cluster, s.profiles, shape_from_model_config(s.model), s.model.sequence_length, so);
    const RankLayout layout(s.cluster, {0, 1});
    const PlanCostModel model(sim, layout, {so.setup});
    PipelineScratch scratch;
    for (int trial = 0; trial < 80; ++trial) {
      // 2 or 3 stages of contiguous ranks (dp only), each at least v of the 8 blocks.
      const int p = std::uniform_int_distribution<int>(2, 3)(rng);
      std::vector<int> groups(p, 16 / p);
      groups.back() = 16 - (p - 1) * (16 / p);
      std::vector<int> partition = {0};
      for (int i = 0; i < p - 1; ++i)
        partition.push_back(std::uniform_int_distribution<int>(partition.back() + 1, 10 - (p - 1 - i))(rng));
      partition.push_back(10);
      bool enough = true;  // every stage at least v blocks
      for (int i = 0; i < p; ++i) enough = enough && stage_blocks(partition[i], partition[i + 1], 10) >= v;
      if (!enough) continue;
      std::vector<Strategy> strategies;
      for (int g : groups) strategies.push_back(Strategy{g, 1});
      const int m = p * 2, gbs = m * 16;
      PlanSimulation out;
      std::string why;
      REQUIRE(sim.run(layout, groups, strategies.data(), partition.data(), m, gbs, &out, &why, false));
      // The fast path: whole stages (pace, all-reduce, optimizer), then the chunks.
      std::vector<StageChoice> choices;
      std::vector<FastStageCost> whole(p), chunks(static_cast<std::size_t>(p) * v);
      int begin = 0;
      for (int i = 0; i < p; ++i) {
        choices.push_back(StageChoice{begin, groups[i], strategies[i], partition[i], partition[i + 1]});
        REQUIRE(model.stage(choices[i], i, p, m, gbs / m, &whole[i]));
        begin += groups[i];
      }
      REQUIRE(model.chunk_costs(choices.data(), p, m, gbs / m, v, chunks.data()));
      INFO("v " << v << " trial " << trial);
      CHECK(model.iteration_ms(whole.data(), p, m, so.schedule, &scratch, chunks.data(), v) ==
            out.timeline.iteration_ms);
      // Chunks sum to the stage (the search's bound: busy time of the whole stage).
      for (int i = 0; i < p; ++i) {
        double f = 0, b = 0;
        for (int c = 0; c < v; ++c) {
          f += chunks[virtual_stage(p, i, c)].forward_ms;
          b += chunks[virtual_stage(p, i, c)].backward_ms;
        }
        CHECK(f + b >= (whole[i].forward_ms + whole[i].backward_ms) * (1 - 1e-9));
      }
      ++plans;
    }
  }
  CHECK(plans >= 30);
}

TEST_CASE("PlanCostModel agrees with PlanSimulator::run on random plans", "[plan_cost]") {
  const Setup16& s = setup16();
  const std::vector<TrainingSetup> setups = searched_setups();
  std::mt19937 rng(777);
  int plans = 0, fitting = 0, oom = 0, mixed = 0, dp_and_tp = 0, spanning = 0;
  for (const Schedule schedule : {Schedule::k1F1B, Schedule::kGpipe}) {
    std::vector<PlanSimulator> sims;
    for (const auto& st : setups) sims.push_back(s.simulator(st, schedule));
    for (const std::vector<int>& ns : {std::vector<int>{0, 1}, std::vector<int>{1, 0}}) {
      const RankLayout layout(s.cluster, ns);
      const PlanCostModel model(sims[0], layout, setups);
      REQUIRE(model.num_setups() == 4);
      PipelineScratch scratch;
      for (int trial = 0; trial < 40; ++trial) {
        // Random contiguous groups over 16 ranks, a (dp, tp) per stage, a random layer split.
        const int p = std::uniform_int_distribution<int>(1, 5)(rng);
        std::vector<int> cuts;
        while (static_cast<int>(cuts.size()) < p - 1) {
          const int c = std::uniform_int_distribution<int>(1, 15)(rng);
          if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
        }
        std::sort(cuts.begin(), cuts.end());
        cuts.insert(cuts.begin(), 0);
        cuts.push_back(16);
        std::vector<int> groups;
        std::vector<Strategy> strategies;
        for (int i = 0; i < p; ++i) {
          const int size = cuts[i + 1] - cuts[i];
          std::vector<int> tps;
          for (int tp = 1; tp <= size; tp *= 2)
            if (size % tp == 0) tps.push_back(tp);
          const int tp = tps[rng() % tps.size()];
          groups.push_back(size);
          strategies.push_back({size / tp, tp});
          if (!layout.homogeneous(cuts[i], cuts[i + 1])) ++mixed;
          if (tp > 1 && size / tp > 1) ++dp_and_tp;
          if (!tp_groups_inside_nodes(layout, cuts[i], strategies.back())) ++spanning;
        }
        std::vector<int> lcuts;
        while (static_cast<int>(lcuts.size()) < p - 1) {
          const int c = std::uniform_int_distribution<int>(1, 9)(rng);
          if (std::find(lcuts.begin(), lcuts.end(), c) == lcuts.end()) lcuts.push_back(c);
        }
        std::sort(lcuts.begin(), lcuts.end());
        std::vector<int> partition{0};
        partition.insert(partition.end(), lcuts.begin(), lcuts.end());
        partition.push_back(10);
        const int gbs = 64;
        const int batches = 1 << std::uniform_int_distribution<int>(0, 5)(rng);

        std::vector<FastStageCost> all(p * setups.size());
        for (int i = 0; i < p; ++i) {
          const StageChoice c{cuts[i], groups[i], strategies[i], partition[i], partition[i + 1]};
          REQUIRE(model.stage(c, i, p, batches, gbs / batches, &all[i * setups.size()]));
        }
        double brute = -1;
        for (std::size_t k = 0; k < setups.size(); ++k) {
          PlanSimulation ref;
          std::string why;
          REQUIRE(sims[k].run(layout, groups, strategies.data(), partition.data(), batches, gbs, &ref, &why, false));
          std::vector<FastStageCost> one(p);
          bool fits = true;
          for (int i = 0; i < p; ++i) {
            one[i] = all[i * setups.size() + k];
            fits = fits && one[i].fits;
            INFO("stage " << i);
            CHECK(ref.stages[i].forward_ms ==
                  (ref.stages[i].power_limited ? one[i].forward_ms * one[i].sustained_factor : one[i].forward_ms));
            CHECK(ref.stages[i].allreduce_ms == one[i].allreduce_ms);
          }
          const double got = model.iteration_ms(one.data(), p, batches, schedule, &scratch);
          INFO("plan " << plans << " setup " << k);
          REQUIRE(rel_diff(got, ref.timeline.iteration_ms) <= 1e-12);
          REQUIRE(fits == ref.fits);
          if (fits && (brute < 0 || got < brute)) brute = got;
          ++plans;
          (fits ? fitting : oom)++;
        }
        // The fastest fitting setup, with dominated setups never timed, is the brute-force minimum.
        double best_ms = -1;
        const int best = model.best_setup(all.data(), p, batches, schedule, &scratch, &best_ms);
        REQUIRE((best >= 0) == (brute >= 0));
        if (best >= 0) CHECK(best_ms == brute);
      }
    }
  }
  CHECK(plans == 2 * 2 * 40 * 4);
  CHECK(fitting > 20);
  CHECK(oom > 20);
  CHECK(mixed > 10);
  CHECK(dp_and_tp > 10);
  CHECK(spanning > 5);
}

TEST_CASE("rank grid: a mixed dp 2 x tp 2 stage gives each rank its own replica", "[plan_cost][grid]") {
  const Setup16& s = setup16();
  TrainingSetup setup;
  const PlanSimulator sim = s.simulator(setup);
  const RankLayout layout(s.cluster, {0, 1});  // A100 ranks 0-7, V100 ranks 8-15
  const PlanCostModel model(sim, layout, {setup});
  const int a100 = s.profiles.type_index("A100"), v100 = s.profiles.type_index("V100");
  // Ranks 6, 7 (A100) and 8, 9 (V100): replica 0 = {6, 7}, replica 1 = {8, 9} (tp fastest).
  const StageChoice c{6, 4, Strategy{2, 2}, 3, 6};
  FastStageCost f;
  StageDetail detail;
  std::string why;
  REQUIRE(model.explain_stage(c, 1, 3, 4, 16, 0, &f, &detail, &why));
  REQUIRE(detail.replica_types == std::vector<int>{a100, v100});
  const int types[2] = {a100, v100};
  int want[2];
  REQUIRE(partition_data(s.profiles, types, Strategy{2, 2}, 16, want));
  REQUIRE(detail.shares == std::vector<int>{want[0], want[1]});
  CHECK(want[0] + want[1] == 16);
  CHECK(want[0] > want[1]);  // the A100 replica is faster
  REQUIRE(detail.ranks.size() == 4);
  const ModelShape shape = shape_from_model_config(s.model);
  for (int i = 0; i < 4; ++i) {
    const RankMemory& r = detail.ranks[i];
    INFO("rank " << r.rank);
    CHECK(r.rank == 6 + i);
    CHECK(r.device == (i < 2 ? "A100" : "V100"));
    RankShard shard;
    shard.first_layer = 3;
    shard.end_layer = 6;
    shard.tp = 2;
    shard.dp = 2;
    shard.pp = 3;
    shard.stage = 1;
    shard.micro_batch = want[i / 2];
    shard.seq = s.model.sequence_length;
    shard.in_flight = 2;  // 1F1B, stage 1 of 3, 4 micro-batches
    shard.schedule = Schedule::k1F1B;
    shard.microbatches = 4;
    shard.gpus_per_node = 4;
    const MemoryBreakdown b = rank_memory(shape, setup, shard);
    CHECK(r.breakdown.activations == b.activations);
    CHECK(r.breakdown.allocated_peak() == b.allocated_peak());
    CHECK(r.breakdown.framework == b.framework);
    // What the device-memory model adds (sim/device_memory.h): world, tp, dp; two neighbours' p2p pairs.
    const DeviceMemoryOptions dm;
    RankPlacement where;
    where.world = 16;
    where.tp = 2;
    where.dp = 2;
    where.pp = 3;
    where.stage = 1;
    where.tied = shape.tied_embeddings;
    CHECK(r.breakdown.nccl == nccl_bytes(rank_communicators(where), dm));
    // A middle stage (no head) without ZeRO: no transient with segments of its own, the fraction.
    CHECK(r.breakdown.allocator_reserve == allocator_reserve_bytes(b.allocated_peak(), 0, dm));
    CHECK(r.breakdown.allocator_reserve == b.allocated_peak() * dm.allocator_reserve_fraction);
  }
  // Pinned: the A100 replica (ranks 6, 7) takes 11 of the 16 samples, the V100 one (8, 9) 5; each rank
  // holds 2 in-flight micro-batches of its own replica's share (activations linear in the share; the
  // analytic terms count each block's input, the received one included).
  CHECK(detail.shares == std::vector<int>{11, 5});
  CHECK(detail.ranks[0].breakdown.activations == 11626610688.0);
  CHECK(detail.ranks[1].breakdown.activations == 11626610688.0);
  CHECK(detail.ranks[2].breakdown.activations == 5284823040.0);
  CHECK(detail.ranks[3].breakdown.activations == 5284823040.0);
  CHECK(detail.ranks[0].breakdown.activations * 5 == detail.ranks[2].breakdown.activations * 11);
  // The dp all-reduce groups are {6, 8} and {7, 9}.
  const Network net(s.cluster, layout, sim.options().network);
  const double grad = shard_params(shape, 3, 6, 3, setup).on_rank(2) * 2;
  const double ar = std::max(net.all_reduce_seconds({6, 8}, grad), net.all_reduce_seconds({7, 9}, grad));
  CHECK(f.allreduce_ms == ar * 1e3);
  CHECK(ar > 0);
  // The grid helpers agree.
  CHECK(StageGrid(6, Strategy{2, 2}).rank(1, 0) == 8);
  CHECK(StageGrid(6, Strategy{2, 2}).replica(7) == 0);
  CHECK(StageGrid(6, Strategy{2, 2}).tp_index(9) == 1);
  // Hosts and local GPUs: A100 ranks 0-7 on 0.0.0.4 (its two hostfile lines), V100 8-15 on 0.0.0.1.
  const ParallelLayout grid(s.cluster, layout);
  CHECK(grid.host(0) == "0.0.0.4");
  CHECK(grid.host(8) == "0.0.0.1");
  CHECK(grid.local_gpu(5) == 5);
  CHECK(grid.local_gpu(9) == 1);
}

TEST_CASE("every sample is trained: a homogeneous stage splits the micro-batch evenly", "[plan_cost][grid]") {
  int shares[5];
  split_micro_batch(96 / 8, 3, shares);
  CHECK(std::vector<int>(shares, shares + 3) == std::vector<int>{4, 4, 4});
  split_micro_batch(96 / 8, 5, shares);
  CHECK(std::vector<int>(shares, shares + 5) == std::vector<int>{3, 3, 2, 2, 2});

  const Setup16& s = setup16();
  const PlanSimulator sim = s.simulator(TrainingSetup{});
  const RankLayout layout(s.cluster, {0, 1});
  const PlanCostModel model(sim, layout, {TrainingSetup{}});
  for (const auto& [dp, want] : {std::pair<int, std::vector<int>>{3, {4, 4, 4}}, {5, {3, 3, 2, 2, 2}}}) {
    FastStageCost f;
    StageDetail detail;
    std::string why;
    REQUIRE(model.explain_stage(StageChoice{0, dp, Strategy{dp, 1}, 0, 10}, 0, 1, 8, 96 / 8, 0, &f, &detail, &why));
    CHECK(detail.shares == want);
    for (const RankMemory& r : detail.ranks) {
      RankShard shard;
      shard.first_layer = 0;
      shard.end_layer = 10;
      shard.dp = dp;
      shard.micro_batch = want[r.rank];
      shard.seq = s.model.sequence_length;
      shard.in_flight = 1;
      shard.gpus_per_node = 4;
      CHECK(r.breakdown.activations ==
            rank_memory(shape_from_model_config(s.model), TrainingSetup{}, shard).activations);
    }
  }
  // batches must divide gbs.
  PlanResult plan;
  plan.node_sequence = {"A100", "V100"};
  plan.device_groups = {16};
  plan.strategies = {Strategy{16, 1}};
  plan.batches = 7;
  plan.layer_partition = {0, 10};
  try {
    sim.simulate(plan, 96);
    FAIL("expected InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("batches") != std::string::npos);
  }
}

TEST_CASE("a tp group across nodes pays its all-reduces over the inter-node link", "[plan_cost][grid]") {
  const Setup16& s = setup16();
  const PlanSimulator sim = s.simulator(TrainingSetup{});
  // The same GPUs with 8 per node: tp 8 fits inside one node there.
  const Cluster wide = Cluster::from_parts({{"0.0.0.1", 8}, {"0.0.0.4", 8}}, s.cluster.clusterfile());
  const PlanSimulator sim_wide(wide, s.profiles, shape_from_model_config(s.model), s.model.sequence_length,
                               sim.options());
  const RankLayout layout(s.cluster, {0, 1}), layout_wide(wide, {0, 1});
  CHECK_FALSE(tp_groups_inside_nodes(layout, 0, Strategy{1, 8}));
  CHECK(tp_groups_inside_nodes(layout, 0, Strategy{2, 4}));
  CHECK(tp_groups_inside_nodes(layout_wide, 0, Strategy{1, 8}));
  CHECK(tp_groups_inside_nodes(layout, 2, Strategy{2, 2}));        // {2, 3} on node 0, {4, 5} on node 1
  CHECK_FALSE(tp_groups_inside_nodes(layout, 2, Strategy{1, 4}));  // {2, 3, 4, 5} spans both
  const PlanCostModel narrow_model(sim, layout, {TrainingSetup{}}), wide_model(sim_wide, layout_wide, {TrainingSetup{}});
  const StageChoice c{0, 8, Strategy{1, 8}, 2, 6};  // 4 blocks, A100 ranks 0-7
  FastStageCost narrow, wide_cost;
  REQUIRE(narrow_model.stage(c, 0, 3, 4, 16, &narrow));
  REQUIRE(wide_model.stage(c, 0, 3, 4, 16, &wide_cost));
  const Network& net = narrow_model.network();
  const double bytes = 16.0 * s.model.sequence_length * s.model.hidden_size * 2;
  const double delta = net.ring_all_reduce_seconds({0, 1, 2, 3, 4, 5, 6, 7}, bytes) -
                       net.intra_node_all_reduce_seconds(0, 8, bytes);
  REQUIRE(delta > 0);
  CHECK(rel_diff(narrow.forward_ms - wide_cost.forward_ms, 2 * 4 * delta * 1e3) <= 1e-9);
  CHECK(rel_diff(narrow.backward_ms - wide_cost.backward_ms, 2 * 4 * delta * 1e3) <= 1e-9);
}

}  // namespace hetplan

namespace hetplan {

// Analytic A100/V100 profiles (10 layers, tp 1-2, bs 1-4), with the keys
// `hetplan profile` writes about memory patched in: per-layer stored
// activations (100 + l MB) and working sets (50 MB; 500 MB for the head),
// fused attention, 18 bytes per parameter, framework 1000 + 100 tp MB.
TEST_CASE("measured activations, working sets and per-tp framework constants price each rank", "[plan_cost][memory]") {
  const auto dir = test::scratch_dir("measured-activations");
  AnalyticOptions o;
  o.model.num_layers = 10;
  o.max_bs = 4;
  o.max_tp = 2;
  o.device_types = {"A100", "V100"};
  o.extensions = false;  // Metis's keys only: the memory keys below are patched in
  generate_analytic_profiles(o, dir.string());
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    ordered_json j = read_json_file(f.path().string());
    const int tp = f.path().filename().string().find("_tp2_") != std::string::npos ? 2 : 1;
    ordered_json act = ordered_json::array(), work = ordered_json::array();
    for (int l = 0; l < 10; ++l) {
      act.push_back(100.0 + l);
      work.push_back(l == 9 ? 500.0 : 50.0);
    }
    auto& em = j["execution_memory"];
    if (f.path().filename().string().find("_bs4.") == std::string::npos) {  // bs 4: not split (older profiles)
      em["layer_activation_mb"] = act;
      em["layer_working_mb"] = work;
    }
    em["attention"] = "fused";
    em["state_bytes_per_parameter"] = 18;
    em["recompute"] = "none";
    em["framework_mb"] = 1000.0 + 100.0 * tp;
    write_json_file(f.path().string(), j);
  }
  const ProfileSet profiles = ProfileSet::load(dir.string(), 10);
  {
    // A type name with inner hyphens (an emulated type, H200-33sm) is a type like any other.
    const auto renamed = test::scratch_dir("measured-activations-hyphen");
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      std::string name = f.path().filename().string();
      if (name.rfind("DeviceType.A100_", 0) == 0) name = "DeviceType.A100-40sm_" + name.substr(16);
      std::filesystem::copy_file(f.path(), renamed / name, std::filesystem::copy_options::overwrite_existing);
    }
    const ProfileSet h = ProfileSet::load(renamed.string(), 10);
    CHECK(h.device_types() == std::vector<std::string>{"A100-40sm", "V100"});
  }
  const Cluster cluster = Cluster::load(std::string(HETPLAN_SOURCE_DIR) + "/hostfiles/a100_v100_16.hostfile",
                                        std::string(HETPLAN_SOURCE_DIR) + "/hostfiles/clusterfile.json");
  const ModelConfig mc;
  const ModelShape shape = shape_from_model_config(mc);
  TrainingSetup base;
  base.framework_bytes = -1;
  const TrainingSetup setup = as_profiled(base, profiles, false, false);
  CHECK(setup.accounting == ZeroAccounting::kMegatron);
  CHECK(setup.flash_attention);
  CHECK(as_profiled(base, profiles, true, true).accounting == ZeroAccounting::kZeroPaper);
  CHECK(profiles.framework_mb(profiles.type_index("A100"), 2) == 1200.0);
  CHECK(profiles.framework_mb(profiles.type_index("A100"), 1) == 1100.0);

  SimulationOptions so;
  so.setup = setup;
  // The per-tp framework constant, as priced without the device-memory model (with it, tp 1's constant and
  // NCCL per communicator instead: tests/test_device_memory.cc).
  so.device_memory.enabled = false;
  const PlanSimulator sim(cluster, profiles, shape, mc.sequence_length, so);
  const RankLayout layout(cluster, {0, 1});
  TrainingSetup full = setup;
  full.recompute = Recompute::kFull;
  const PlanCostModel model(sim, layout, {setup, full});
  // Layers [3, 6) on A100 ranks 0-1 at (dp 1, tp 2), stage 1 of 3, 4 micro-batches of 2: 2 in flight.
  const StageChoice c{0, 2, Strategy{1, 2}, 3, 6};
  const double MiB = 1024.0 * 1024.0;
  const double stored = (103 + 104 + 105) * MiB, working = 50 * MiB;  // layer 5's backward, the last of the stage
  // One stage-boundary tensor of a micro-batch of 2 (bf16 hidden states). Stage 1 of 3 under 1F1B over 4
  // micro-batches runs F0 F1 B0 F2 B1 F3 B2 B3: at most 2 micro-batches live, each with its received input:
  // 2 (S + X). (RankShard, sim/memory_model.h; replay's held sends are not counted by default.)
  const double boundary = 2.0 * mc.sequence_length * shape.hidden_size * 2;
  auto worst_of_four = [&](double s) { return 2 * (s + boundary); };
  RankShard shard;
  shard.first_layer = 3;
  shard.end_layer = 6;
  shard.tp = 2;
  shard.pp = 3;
  shard.stage = 1;
  shard.micro_batch = 2;
  shard.seq = mc.sequence_length;
  shard.in_flight = 2;
  shard.gpus_per_node = 4;
  for (int k = 0; k < 2; ++k) {
    INFO("setting " << k);
    FastStageCost f;
    StageDetail d;
    std::string why;
    REQUIRE(model.explain_stage(c, 1, 3, 4, 2, k, &f, &d, &why));
    REQUIRE(d.ranks.size() == 2);
    const MemoryBreakdown& b = d.ranks[0].breakdown;
    CHECK(b.framework == 1200 * MiB);
    TrainingSetup s = k == 0 ? setup : full;
    s.framework_bytes = 1200 * MiB;
    const ShardParams sp = shard_params(shape, 3, 6, 3, s);
    const MemoryBreakdown states_only = rank_memory(shape, s, shard, sp);
    CHECK(b.states.total_gpu() == states_only.states.total_gpu());
    // Megatron's 18 bytes per parameter of the rank's shard.
    CHECK(b.states.total_gpu() == Approx(sp.on_rank(2) * 18).epsilon(1e-12));
    if (k == 0) {
      CHECK(b.activations == worst_of_four(stored));
      CHECK(b.recompute_workspace == working);
    } else {
      // Full recomputation the profile did not run: the stored bytes scale by the analytic ratio
      // (a block's input only), and the re-materialised block joins the working set.
      TrainingSetup none = s;
      none.recompute = Recompute::kNone;
      RankShard one = shard;
      one.in_flight = 1;
      const double ratio = rank_memory(shape, s, one, sp).activations / rank_memory(shape, none, one, sp).activations;
      CHECK(ratio < 0.2);
      CHECK(b.activations == Approx(worst_of_four(stored * ratio)).epsilon(1e-12));
      CHECK(b.recompute_workspace == Approx(working + states_only.recompute_workspace).epsilon(1e-12));
    }
    CHECK(b.gpu_total() == b.allocated_peak() + b.framework);
  }
  // A micro-batch whose file lacks the split (bs 4) scales the largest measured size below it (bs 2):
  // activations and working sets are linear in the batch.
  FastStageCost f;
  StageDetail d;
  std::string why;
  REQUIRE(model.explain_stage(c, 1, 3, 2, 4, 0, &f, &d, &why));
  // (2 micro-batches of 4: F0 F1 B0 B1, the worst before B0: 2 (S + X) at twice the size.)
  CHECK(d.ranks[0].breakdown.activations == 2 * (stored + boundary) * 2);
  CHECK(d.ranks[0].breakdown.recompute_workspace == working * 2);
  // With no split measured at all, the analytic terms.
  TrainingSetup fp32 = setup;
  fp32.precision = Precision::kFp32;  // measured bf16 activations do not describe an fp32 run
  const PlanCostModel model32(sim, layout, {fp32});
  d = StageDetail();
  REQUIRE(model32.explain_stage(c, 1, 3, 2, 4, 0, &f, &d, &why));
  shard.micro_batch = 4;
  shard.in_flight = 2;
  shard.schedule = Schedule::k1F1B;
  shard.microbatches = 2;
  fp32.framework_bytes = 1200 * MiB;
  CHECK(d.ranks[0].breakdown.activations == rank_memory(shape, fp32, shard).activations);

  // ZeRO-2/3 with layer units, layer by layer: the last stage (Metis layers 7-9, the head last)
  // at dp 2, one micro-batch of 2 in flight. While layer l's backward runs it holds its working set
  // (and, ZeRO-3, its gathered 16-bit unit) over what the layers before it still store; its fp32
  // bucket (with the 16-bit gradient being added) lives once its own activations are freed.
  // Not the largest unit on top of the largest working set, which no moment of the backward holds.
  std::vector<TrainingSetup> zs(2, setup);
  zs[0].zero_stage = 2;
  zs[1].zero_stage = 3;
  const PlanCostModel zmodel(sim, layout, zs);
  const StageChoice last{0, 2, Strategy{2, 1}, 7, 10};
  const double vh = static_cast<double>(shape.vocab_size) * shape.hidden_size;
  const double head_unit = vh + shape.norm_params();  // the tied head's copy on the last stage
  const double block_unit = static_cast<double>(shape.block_sharded_params() + shape.block_replicated_params());
  for (int k = 0; k < 2; ++k) {
    INFO("ZeRO-" << zs[k].zero_stage);
    const double gathered = k == 1 ? 2 : 0;
    double expect = 0, later = 0;
    for (int l = 9; l >= 7; --l) {
      const double unit = l == 9 ? head_unit : block_unit;
      const double held = (100.0 + l) * MiB;
      expect = std::max(expect, (l == 9 ? 500.0 : 50.0) * MiB + gathered * unit - later);
      expect = std::max(expect, (gathered + 6) * unit - later - held);
      later += held;
    }
    d = StageDetail();
    REQUIRE(zmodel.explain_stage(last, 2, 3, 4, 2, k, &f, &d, &why));
    const MemoryBreakdown& z = d.ranks[0].breakdown;
    CHECK(z.states.transient == 0);  // no unit is counted apart from the layer it belongs to
    CHECK(z.recompute_workspace == Approx(expect).epsilon(1e-12));
    // The last stage under 1F1B (F0 B0 F1 B1 ...): one micro-batch live with its received input (one
    // sample's hidden states): S + X.
    CHECK(z.activations == Approx(later + boundary / 2).epsilon(1e-12));
  }
}

}  // namespace hetplan

namespace hetplan {

TEST_CASE("ZeRO's collectives: once per iteration (0, 1), per micro-batch (2: reduce-scatter, 3: gathers too)",
          "[plan_cost][zero]") {
  const Setup16& s = setup16();
  std::vector<TrainingSetup> setups(4);
  for (int z = 0; z < 4; ++z) {
    setups[z].zero_stage = z;
    setups[z].accounting = ZeroAccounting::kMegatron;  // fp32 main gradients are what is reduced
  }
  const PlanSimulator sim = s.simulator(setups[0]);
  const RankLayout layout(s.cluster, {0, 1});
  const PlanCostModel model(sim, layout, setups);
  const StageChoice c{0, 4, Strategy{4, 1}, 0, 5};  // 4 A100 replicas, layers [0, 5), stage 0 of 2
  FastStageCost f[4];
  std::string why;
  REQUIRE(model.stage(c, 0, 2, 8, 8, f, &why));
  const ModelShape shape = shape_from_model_config(s.model);
  const double n = shard_params(shape, 0, 5, 2, setups[0]).on_rank(1);
  const Network net(s.cluster, layout, sim.options().network);
  const double ar_grad = net.all_reduce_seconds_strided(RankStride{0, 1, 4}, n * 4) * 1e3;
  const double ar_weights = net.all_reduce_seconds_strided(RankStride{0, 1, 4}, n * 2) * 1e3;
  // The model ties its embeddings and the stage is the first of 2: whatever the ZeRO stage, it also
  // all-reduces the embedding's fp32 gradient with the last stage (the other end of the ranks).
  REQUIRE(shape.tied_embeddings);
  const double tied_bytes = static_cast<double>(shape.vocab_size) * shape.hidden_size * 4;
  const double tied = net.all_reduce_seconds_strided(RankStride{0, 15, 2}, tied_bytes) * 1e3;
  CHECK(reduced_gradient_bytes(setups[0]) == 4);
  CHECK(f[0].allreduce_ms == Approx(ar_grad + tied).epsilon(1e-12));
  CHECK(f[1].allreduce_ms == Approx(ar_grad / 2 + ar_weights / 2 + tied).epsilon(1e-12));
  CHECK(f[1].forward_ms == f[0].forward_ms);
  CHECK(f[1].backward_ms == f[0].backward_ms);
  // ZeRO-2/3 also pack every micro-batch's bf16 gradients into the fp32 buckets they reduce-scatter: 2 bytes
  // read and 4 written per parameter at the streaming fraction of the A100's HBM (sim/dp_overlap.md, "The pack").
  const GpuSpec* a100 = find_gpu_spec("A100");
  REQUIRE(a100 != nullptr);
  const double pack = n * (2 + 4) / (a100->memory_bw_gbs * 1e9 * RateDefaults{}.memory_efficiency) * 1e3;
  CHECK(f[2].allreduce_ms == Approx(ar_weights / 2 + tied).epsilon(1e-12));
  CHECK(f[2].backward_ms == Approx(f[0].backward_ms + pack + ar_grad / 2).epsilon(1e-12));
  CHECK(f[3].allreduce_ms == Approx(tied).epsilon(1e-12));
  CHECK(f[3].forward_ms == Approx(f[0].forward_ms + ar_weights / 2).epsilon(1e-12));
  CHECK(f[3].backward_ms == Approx(f[0].backward_ms + pack + ar_weights / 2 + ar_grad / 2).epsilon(1e-12));
  // The optimizer steps a 1/dp shard from ZeRO-1 on.
  CHECK(f[1].optimizer_ms == Approx(f[0].optimizer_ms / 4).epsilon(1e-12));
}

}  // namespace hetplan

namespace hetplan {

// The search leaves out of its bound tables every stage whose ranks cannot hold state_bytes_lower_bound:
// that must never exceed the memory stage() finds, also where it prices measured activations layer by
// layer (ZeRO-2/3's gathered units are then counted per layer, not as one transient).
TEST_CASE("state_bytes_lower_bound is at most every rank's memory stage() finds, measured activations too",
          "[plan_cost][memory]") {
  const std::string src = HETPLAN_SOURCE_DIR;
  const Cluster cluster = Cluster::load(src + "/hostfiles/h200_1_h200-33sm_1.hostfile",
                                        src + "/hostfiles/clusterfile_h200_emulated.json");
  const ProfileSet profiles = ProfileSet::load(src + "/profiles/H200+H200-33sm-llama-3.2-1b-8l", 10);
  const ModelShape shape = read_hf_config(src + "/scripts/validation/llama-3.2-1b-8l.json");
  const RankLayout layout(cluster, {0, 1});
  int checked = 0;
  for (int zero = 0; zero <= 3; ++zero)
    for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      SimulationOptions so;
      so.setup.zero_stage = zero;
      so.setup.recompute = rc;
      so.setup.framework_bytes = -1;  // as profiled
      const PlanSimulator sim(cluster, profiles, shape, 2048, so);
      const PlanCostModel model(sim, layout, {so.setup});
      // One mixed stage of dp 2, and every two-stage split, at micro-batches 2 and 8.
      for (int b : {2, 8})
        for (int e = 1; e <= 10; ++e) {
          const std::vector<StageChoice> stages =
              e == 10 ? std::vector<StageChoice>{{0, 2, Strategy{2, 1}, 0, 10}}
                      : std::vector<StageChoice>{{0, 1, Strategy{1, 1}, 0, e}, {1, 1, Strategy{1, 1}, e, 10}};
          const int p = static_cast<int>(stages.size());
          for (int i = 0; i < p; ++i) {
            FastStageCost f;
            REQUIRE(model.stage(stages[i], i, p, 4, b, &f));
            const StageChoice& c = stages[i];
            INFO("ZeRO-" << zero << " " << to_string(rc) << " b " << b << " stage " << i << " of " << p << " layers ["
                         << c.layer_begin << ", " << c.layer_end << ")");
            CHECK(model.state_bytes_lower_bound(c.st.tp, c.st.dp, c.layer_begin, c.layer_end) <= f.peak_memory_bytes);
            ++checked;
          }
        }
    }
  CHECK(checked == 12 * 2 * (1 + 9 * 2));
}

}  // namespace hetplan
