// Sequence parallelism, context parallelism and overlapped data-parallel
// communication (issue 34): the pure formulas (sim/dp_overlap.h,
// sim/sequence_parallel.h), what PlanCostModel makes of them, the plan file's
// keys and the search's overlap dimension.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "fixtures.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "planner/search_settings.h"
#include "sim/analytic_profiles.h"
#include "sim/dp_overlap.h"
#include "sim/gpu_specs.h"
#include "sim/layer_time_model.h"
#include "sim/model_shape.h"
#include "sim/network.h"
#include "sim/plan_cost.h"
#include "sim/plan_file.h"
#include "sim/roofline.h"
#include "sim/sequence_parallel.h"

namespace hetplan {
namespace {

// 2 V100 nodes then 2 A100 nodes of 4 GPUs, analytic profiles up to tp 4 and 64 samples.
struct Cluster16 {
  Cluster cluster;
  ProfileSet profiles;
  ModelConfig model;
  Cluster16()
      : cluster(Cluster::load(std::string(HETPLAN_SOURCE_DIR) + "/hostfiles/a100_v100_16.hostfile",
                              std::string(HETPLAN_SOURCE_DIR) + "/hostfiles/clusterfile.json")),
        profiles(load()) {}
  static ProfileSet load() {
    const auto dir = test::scratch_dir("seqpar-analytic");
    AnalyticOptions o;
    o.model.num_layers = 10;
    o.max_bs = 64;
    o.max_tp = 4;
    o.device_types = {"A100", "V100"};
    generate_analytic_profiles(o, dir.string());
    return ProfileSet::load(dir.string(), 10);
  }
  PlanSimulator simulator(const TrainingSetup& setup) const {
    SimulationOptions so;
    so.setup = setup;
    return PlanSimulator(cluster, profiles, shape_from_model_config(model), model.sequence_length, so);
  }
};

const Cluster16& cluster16() {
  static const Cluster16 c;
  return c;
}

// ZeRO-2/3's pack of one micro-batch's gradients into the fp32 reduce-scatter buckets (sim/dp_overlap.md, "The
// pack"), derived here: `params` bf16 gradients read (2 bytes each) and fp32 written (4), at the layer time
// model's streaming fraction of the GPU's datasheet HBM bandwidth.
double pack_ms(double params, const std::string& gpu) {
  const GpuSpec* g = find_gpu_spec(gpu);
  REQUIRE(g != nullptr);
  return params * (2 + 4) / (g->memory_bw_gbs * 1e9 * RateDefaults{}.memory_efficiency) * 1e3;
}

}  // namespace

TEST_CASE("dp overlap: buckets, the exposed tail and the SM-sharing stretch", "[seqpar][overlap]") {
  CHECK(megatron_default_bucket_params(8) == 4e7);
  CHECK(megatron_default_bucket_params(64) == 6.4e7);
  CHECK(bucket_count(1e8, 0, 8) == 3);      // 40M per bucket
  CHECK(bucket_count(1e8, 0, 64) == 2);     // 64M per bucket
  CHECK(bucket_count(1e8, 1e9, 8) == 1);
  CHECK(bucket_count(0, 0, 8) == 1);
  // 4 buckets of 1 ms against an 8 ms backward: all but the last bucket hide.
  CHECK(exposed_after_window(1, 4, 8) == 1);
  // 4 buckets of 3 ms: the chain outruns the window; 12 - 8 x 3/4 = 6 ms stay.
  CHECK(exposed_after_window(3, 4, 8) == 6);
  // One bucket: nothing overlaps.
  CHECK(exposed_after_window(5, 1, 8) == 5);
  CHECK(overlap_slowdown_s(5, 3, 1.1) == Approx(0.3).epsilon(1e-12));
  CHECK(overlap_slowdown_s(2, 3, 1.1) == Approx(0.2).epsilon(1e-12));
  CHECK(overlap_slowdown_s(2, 3, 1.0) == 0);
}

TEST_CASE("context parallelism: K/V bytes per ring step and the exposed exchange", "[seqpar][cp]") {
  ModelShape m;  // GPT-2 XL: 25 heads of 64, no GQA
  // 2 samples x 1024 / 2 tokens x 25 x 64 / 2 (tp) x 2 (K, V) x 2 bytes.
  CHECK(cp_kv_step_bytes(m, 1024, 2, 2, 2) == 2.0 * 1024 * 25 * 64 / 2 * 2 * 2 / 2);
  m.num_kv_heads = 5;  // GQA: a fifth of the K/V
  CHECK(cp_kv_step_bytes(m, 1024, 2, 2, 2) == 2.0 * 1024 * 5 * 64 / 2 * 2 * 2 / 2);
  CHECK(ring_exposed_s(1, 5, 1) == 0);
  CHECK(ring_exposed_s(4, 1, 8) == 0);           // each step's 1 s hides under 2 s of attention
  CHECK(ring_exposed_s(4, 3, 8) == 3 * (3 - 2));  // 1 s of each of the 3 exchanges shows
  // The backward: 4 steps of 4 s of compute (2 x 8 / 4); steps 0 and 3 carry one exchange, steps 1 and 2
  // two, and the last dK/dV go home after the compute.
  CHECK(ring_backward_exposed_s(1, 5, 1) == 0);
  CHECK(ring_backward_exposed_s(4, 1, 8) == 1);                                  // only the last one shows
  CHECK(ring_backward_exposed_s(4, 3, 8) == 0 + 2 * (6 - 4) + 0 + 3);            // 2 x 3 s over 4 s twice
  CHECK(ring_backward_exposed_s(4, 5, 8) == (5 - 4) + 2 * (10 - 4) + (5 - 4) + 5);
  CHECK(ring_backward_exposed_s(2, 5, 8) == 5);  // cp 2: each step's 8 s hide its 5 s; the last 5 s show
  const double share = attention_flop_share(m, 1024);
  CHECK(share == Approx(m.attention_forward_flops_per_token(1024) / m.block_forward_flops_per_token(1024)));
  CHECK(share > 0);
  CHECK(share < 1);
}

TEST_CASE("overlap in PlanCostModel: each ZeRO stage's collectives leave only their tail", "[seqpar][overlap][plan_cost]") {
  const Cluster16& s = cluster16();
  std::vector<TrainingSetup> setups(8);
  for (int k = 0; k < 8; ++k) {
    setups[k].zero_stage = k % 4;
    setups[k].accounting = ZeroAccounting::kMegatron;
    setups[k].overlap.grad_reduce = setups[k].overlap.param_gather = k >= 4;
  }
  const PlanSimulator sim = s.simulator(setups[0]);
  const RankLayout layout(s.cluster, {0, 1});
  const ModelShape shape = shape_from_model_config(s.model);
  const double n = shard_params(shape, 0, 5, 2, setups[0]).on_rank(1);
  for (auto& st : setups) st.overlap.grad_bucket_params = n / 3.5;  // 4 buckets
  const PlanCostModel model(sim, layout, setups);
  const StageChoice c{0, 4, Strategy{4, 1}, 0, 5};
  FastStageCost f[8];
  std::string why;
  REQUIRE(model.stage(c, 0, 2, 8, 8, f, &why));
  const Network net(s.cluster, layout, sim.options().network);
  const RankStride dp{0, 1, 4};
  const double ar_grad = net.all_reduce_seconds_strided(dp, n * 4) * 1e3;
  const double ar_weights = net.all_reduce_seconds_strided(dp, n * 2) * 1e3;
  const double bucket_grad = net.all_reduce_seconds_strided(dp, n * 4 / 4) * 1e3;
  const double bucket_weights = net.all_reduce_seconds_strided(dp, n * 2 / 4) * 1e3;
  const double tied = net.all_reduce_seconds_strided(RankStride{0, 15, 2},
                                                     static_cast<double>(shape.vocab_size) * shape.hidden_size * 4) *
                      1e3;
  const double k = kCommComputeSlowdown - 1;
  const double W = f[0].backward_ms, F = f[0].forward_ms;
  // ZeRO-2/3 pack every micro-batch's gradients on the backward's path: part of the window.
  const std::string gpu = s.cluster.device_types()[layout.type_of(0)];
  CHECK(gpu == "A100");
  const double P = pack_ms(n, gpu), WP = W + P;
  CHECK(f[1].backward_ms == W);  // ZeRO-1 packs nothing (its hooks add into the fp32 buffer: the accumulation)
  CHECK(f[2].backward_ms == Approx(WP + net.all_reduce_seconds_strided(dp, n * 4) * 1e3 / 2).epsilon(1e-12));
  // The stage holds the embedding, whose gradient is the backward's last: its reduction is the least tail.
  const double emb = net.all_reduce_seconds_strided(dp, static_cast<double>(shape.embedding_params()) * 4) * 1e3;
  auto tail = [&](double per_bucket, double last) { return std::max(exposed_after_window(per_bucket, 4, W), last); };
  auto tail_p = [&](double per_bucket, double last) {
    return std::max(exposed_after_window(per_bucket, 4, WP), last);
  };
  // ZeRO-0: the bucketed all-reduce during the last backward.
  CHECK(f[4].allreduce_ms == Approx(tail(bucket_grad, emb) + k * std::min(W, ar_grad) + tied).epsilon(1e-12));
  CHECK(f[4].allreduce_ms < f[0].allreduce_ms);
  // ZeRO-1: the reduce-scatter in the backward, the weight gather in the next forward.
  CHECK(f[5].allreduce_ms == Approx(tail(bucket_grad / 2, emb / 2) + k * std::min(W, ar_grad / 2) +
                                    exposed_after_window(bucket_weights / 2, 4, F) + k * std::min(F, ar_weights / 2) +
                                    tied)
                                 .epsilon(1e-12));
  CHECK(f[5].allreduce_ms < f[1].allreduce_ms);
  // ZeRO-2: each micro-batch's reduce-scatter hides in its backward.
  CHECK(f[6].backward_ms ==
        Approx(WP + tail_p(bucket_grad / 2, emb / 2) + k * std::min(WP, ar_grad / 2)).epsilon(1e-12));
  CHECK(f[6].backward_ms < f[2].backward_ms);
  // ZeRO-3: the gathers prefetched in the forward, gather + reduce-scatter in the backward.
  CHECK(f[7].forward_ms ==
        Approx(F + exposed_after_window(bucket_weights / 2, 4, F) + k * std::min(F, ar_weights / 2)).epsilon(1e-12));
  CHECK(f[7].backward_ms == Approx(WP + tail_p(bucket_grad / 2 + bucket_weights / 2, emb / 2) +
                                   k * std::min(WP, ar_grad / 2 + ar_weights / 2))
                                .epsilon(1e-12));
  CHECK(f[7].forward_ms < f[3].forward_ms);
  // A single replica has nothing to overlap.
  FastStageCost one[8];
  REQUIRE(model.stage(StageChoice{0, 1, Strategy{1, 1}, 0, 5}, 0, 2, 8, 8, one, &why));
  CHECK(one[4].forward_ms == one[0].forward_ms);
  CHECK(one[4].backward_ms == one[0].backward_ms);
}

TEST_CASE("ZeRO-3 gathers: waited for without prefetch, the head kept for its backward, the tied embedding twice",
          "[seqpar][overlap][plan_cost]") {
  // The whole model on one stage of 4 replicas: its last layer (the head) keeps its weights from its forward
  // to its backward, and the tied embedding is gathered by the embedding and again by the head.
  const Cluster16& s = cluster16();
  std::vector<TrainingSetup> setups(3);
  for (auto& st : setups) {
    st.zero_stage = 3;
    st.accounting = ZeroAccounting::kMegatron;
  }
  setups[1].overlap.grad_reduce = true;  // reduce-scatters overlapped, gathers not prefetched (suite34's plans)
  setups[2].overlap.grad_reduce = setups[2].overlap.param_gather = true;
  const PlanSimulator sim = s.simulator(setups[0]);
  const RankLayout layout(s.cluster, {0, 1});
  ModelShape shape = shape_from_model_config(s.model);
  REQUIRE(shape.tied_embeddings);
  const double n = shard_params(shape, 0, 10, 1, setups[0]).on_rank(1);
  for (auto& st : setups) st.overlap.grad_bucket_params = n / 15.5;  // 16 buckets, each smaller than the embedding
  FastStageCost base[1], f[3];
  std::string why;
  std::vector<TrainingSetup> zero0(1);
  REQUIRE(PlanCostModel(sim, layout, zero0).stage(StageChoice{0, 4, Strategy{4, 1}, 0, 10}, 0, 1, 8, 8, base, &why));
  REQUIRE(PlanCostModel(sim, layout, setups).stage(StageChoice{0, 4, Strategy{4, 1}, 0, 10}, 0, 1, 8, 8, f, &why));
  const Network net(s.cluster, layout, sim.options().network);
  const RankStride dp{0, 1, 4};
  const double ag = net.all_reduce_seconds_strided(dp, n * 2) * 1e3 / 2;
  const double rs = net.all_reduce_seconds_strided(dp, n * 4) * 1e3 / 2;
  const double vh = static_cast<double>(shape.vocab_size) * shape.hidden_size;
  const double fwd_share = (n + vh) / n, bwd_share = (n - vh - static_cast<double>(shape.norm_params())) / n;
  const double F = base[0].forward_ms, W = base[0].backward_ms + pack_ms(n, "A100");  // with the pack
  // No overlap: every gather and the reduce-scatter exposed.
  CHECK(f[0].forward_ms == Approx(F + ag * fwd_share).epsilon(1e-12));
  CHECK(f[0].backward_ms == Approx(W + ag * bwd_share + rs).epsilon(1e-12));
  // Overlapped reduce-scatters only: each layer's gather is still waited for, in the backward too, and on the
  // one communicator it queues behind the reduce-scatter started before it, so that is waited for too: the
  // overlap hides nothing (replay's suite34 run 2 trace: 15.0 of 16.9 ms of reduce-scatters exposed, no GEMM
  // beside any collective).
  CHECK(f[1].forward_ms == Approx(F + ag * fwd_share).epsilon(1e-12));
  CHECK(f[1].backward_ms == Approx(W + ag * bwd_share + rs).epsilon(1e-12));
  CHECK(f[1].backward_ms == f[0].backward_ms);
  // Both: the gathers hide too (less than waiting for them).
  CHECK(f[2].backward_ms < f[1].backward_ms);
  CHECK(f[2].forward_ms < f[1].forward_ms);
}

TEST_CASE("overlap probe: comm_overlap.json read from the profile folder, its reduce and gather factors apart",
          "[seqpar][overlap][plan_cost]") {
  const auto dir = test::scratch_dir("overlap-probe");
  const std::string path = (dir / "probe.json").string();
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write(R"({"kind": "probe", "compute_slowdown": {"reduce": 1.42, "gather": 1.12}, "details": {}})");
  const OverlapSlowdowns read = read_overlap_probe(path);
  CHECK(read.reduce == 1.42);
  CHECK(read.gather == 1.12);
  for (const char* bad : {R"({"compute_slowdown": {"reduce": 0.9, "gather": 1.1}})",
                          R"({"compute_slowdown": {"reduce": 1.2}})", R"({"slowdown": 1.2})", "not json"}) {
    write(bad);
    CHECK_THROWS_AS(read_overlap_probe(path), InputError);
  }
  // A profile folder with the file: ProfileSet::load takes it; without: the documented defaults.
  const Cluster16& s = cluster16();
  CHECK_FALSE(s.profiles.overlap_measured());
  CHECK(s.profiles.overlap_slowdowns().reduce == kCommComputeSlowdown);
  CHECK(s.profiles.overlap_slowdowns().gather == kCommComputeSlowdown);
  const auto folder = test::scratch_dir("overlap-probe-profiles");
  AnalyticOptions o;
  o.model.num_layers = 10;
  o.max_bs = 8;
  o.max_tp = 1;
  o.device_types = {"A100", "V100"};
  generate_analytic_profiles(o, folder.string());
  std::ofstream(folder / kOverlapProbeFile) << R"({"compute_slowdown": {"reduce": 1.42, "gather": 1.12}})";
  const ProfileSet measured = ProfileSet::load(folder.string(), 10);
  CHECK(measured.overlap_measured());
  CHECK(measured.overlap_slowdowns().reduce == 1.42);
  CHECK(measured.overlap_slowdowns().gather == 1.12);
  CHECK(measured.overlap_slowdowns().ring == 0);  // not probed: the gather figure stands for it
  CHECK(measured.overlap_slowdowns().ring_stretch() == 1.12);
  std::ofstream(folder / kOverlapProbeFile) << R"({"compute_slowdown": {"reduce": 1.42, "gather": 1.12, "ring": 1.07}})";
  CHECK(ProfileSet::load(folder.string(), 10).overlap_slowdowns().ring_stretch() == 1.07);
  std::ofstream(folder / kOverlapProbeFile) << R"({"compute_slowdown": {"reduce": 1.42, "gather": 1.12, "ring": 0.5}})";
  CHECK_THROWS_AS(ProfileSet::load(folder.string(), 10), InputError);
  std::ofstream(folder / kOverlapProbeFile) << R"({"compute_slowdown": {"reduce": "fast"}})";
  CHECK_THROWS_AS(ProfileSet::load(folder.string(), 10), InputError);

  // ZeRO-1 overlapped: the reduce-scatter in the backward stretches it by the reduce factor, the gather in the
  // forward by the gather factor; a run's --comm-slowdown (compute_slowdown > 0) takes both.
  ProfileSet profiles = s.profiles;
  profiles.set_overlap_slowdowns(OverlapSlowdowns{1.42, 1.12});
  std::vector<TrainingSetup> setups(2);
  for (auto& st : setups) {
    st.zero_stage = 1;
    st.accounting = ZeroAccounting::kMegatron;
    st.overlap.grad_reduce = st.overlap.param_gather = true;
  }
  setups[1].overlap.compute_slowdown = 1.2;
  SimulationOptions so;
  so.setup = setups[0];
  const ModelShape shape = shape_from_model_config(s.model);
  const PlanSimulator sim(s.cluster, profiles, shape, s.model.sequence_length, so);
  const RankLayout layout(s.cluster, {0, 1});
  const double n = shard_params(shape, 0, 5, 2, setups[0]).on_rank(1);
  for (auto& st : setups) st.overlap.grad_bucket_params = n / 3.5;  // 4 buckets
  const PlanCostModel model(sim, layout, setups);
  FastStageCost f[2];
  std::string why;
  REQUIRE(model.stage(StageChoice{0, 4, Strategy{4, 1}, 0, 5}, 0, 2, 8, 8, f, &why));
  const Network net(s.cluster, layout, sim.options().network);
  const RankStride dp{0, 1, 4};
  const double rs = net.all_reduce_seconds_strided(dp, n * 4) * 1e3 / 2;
  const double ag = net.all_reduce_seconds_strided(dp, n * 2) * 1e3 / 2;
  const double rs_b = net.all_reduce_seconds_strided(dp, n) * 1e3 / 2;
  const double ag_b = net.all_reduce_seconds_strided(dp, n / 2) * 1e3 / 2;
  const double emb = net.all_reduce_seconds_strided(dp, static_cast<double>(shape.embedding_params()) * 4) * 1e3 / 2;
  const double tied = net.all_reduce_seconds_strided(RankStride{0, 15, 2},
                                                     static_cast<double>(shape.vocab_size) * shape.hidden_size * 4) *
                      1e3;
  const double W = f[0].backward_ms, F = f[0].forward_ms;
  const double exposed = std::max(exposed_after_window(rs_b, 4, W), emb) + exposed_after_window(ag_b, 4, F) + tied;
  CHECK(f[0].allreduce_ms == Approx(exposed + 0.42 * std::min(W, rs) + 0.12 * std::min(F, ag)).epsilon(1e-12));
  CHECK(f[1].allreduce_ms == Approx(exposed + 0.2 * std::min(W, rs) + 0.2 * std::min(F, ag)).epsilon(1e-12));
}

TEST_CASE("context parallelism in PlanCostModel: shares per cp group, 1/cp of the compute, activations per chunk",
          "[seqpar][cp][plan_cost]") {
  const Cluster16& s = cluster16();
  std::vector<TrainingSetup> setups(2);
  setups[1].context_parallel = 2;
  const PlanSimulator sim = s.simulator(setups[0]);
  const RankLayout layout(s.cluster, {0, 1});  // A100 nodes first
  const PlanCostModel model(sim, layout, setups);
  const StageChoice c{0, 4, Strategy{4, 1}, 1, 9};  // 4 A100s, the 8 blocks only (stage 1 of 3)
  FastStageCost f{}, g{}, half{};
  StageDetail d1, d2, dh;
  std::string why;
  // cp 2: two groups of two ranks, each group 4 samples of the micro-batch of 8, every rank of a group the same.
  REQUIRE(model.explain_stage(c, 1, 3, 4, 8, 1, &g, &d2, &why));
  CHECK(d2.shares == std::vector<int>{4, 4, 4, 4});
  REQUIRE(model.explain_stage(c, 1, 3, 4, 8, 0, &f, &d1, &why));
  CHECK(d1.shares == std::vector<int>{2, 2, 2, 2});
  // The same groups as dp 2 without cp (4 samples per replica): each cp rank computes about half of that.
  REQUIRE(model.explain_stage(StageChoice{0, 2, Strategy{2, 1}, 1, 9}, 1, 3, 4, 8, 0, &half, &dh, &why));
  CHECK(dh.shares == std::vector<int>{4, 4});
  CHECK(g.forward_ms < 0.6 * half.forward_ms);
  CHECK(g.forward_ms > 0.5 * half.forward_ms);
  // Each cp rank holds 4 samples of half-length sequences, the dp-2 replica 4 whole ones: fewer activations.
  CHECK(g.peak_memory_bytes < half.peak_memory_bytes);
  // dp must be a multiple of cp.
  CHECK_FALSE(model.explain_stage(StageChoice{0, 3, Strategy{3, 1}, 1, 9}, 1, 3, 4, 6, 1, &g, &d2, &why));
  CHECK(why.find("multiple of the context-parallel size 2") != std::string::npos);
}

TEST_CASE("context parallelism in PlanCostModel: a cp rank's layers cost the profile of share / cp samples",
          "[seqpar][cp][plan_cost]") {
  // A rank of a cp-2 group with a share of 2 samples runs s/2 tokens of each: the work of one whole sample
  // (its tokens, and half the group's causal attention), which the bs-1 profile measured, not half of the
  // bs-2 profile (whose per-op host time is spread over twice the work). Odd shares keep 1/cp of their own.
  const Cluster16& s = cluster16();
  std::vector<TrainingSetup> setups(2);
  setups[1].context_parallel = 2;
  const PlanSimulator sim = s.simulator(setups[0]);
  const RankLayout layout(s.cluster, {0, 1});
  const PlanCostModel model(sim, layout, setups);
  const StageChoice c{0, 4, Strategy{4, 1}, 1, 9};
  std::string why;
  auto compute_ms = [&](int micro_batch, int setup, StageDetail* d) {
    FastStageCost f{};
    REQUIRE(model.explain_stage(c, 1, 3, 4, micro_batch, setup, &f, d, &why));
    return f.forward_ms - d->cp_exchange_forward_ms - d->cp_merge_forward_ms;
  };
  const int type = s.profiles.type_index("A100");
  REQUIRE(type >= 0);
  const LayerProfile* bs1 = s.profiles.find(type, 1, 1);
  const LayerProfile* bs2 = s.profiles.find(type, 1, 2);
  REQUIRE((bs1 != nullptr && bs2 != nullptr));
  StageDetail cp2, dp4;
  // cp 2, micro-batch 4: two groups of 2 samples; every rank the bs-1 profile's forward, as dp 4 of 1 sample.
  const double with_cp = compute_ms(4, 1, &cp2);
  const double without = compute_ms(4, 0, &dp4);
  CHECK(cp2.shares == std::vector<int>{2, 2, 2, 2});
  CHECK(dp4.shares == std::vector<int>{1, 1, 1, 1});
  CHECK(with_cp == Approx(without).epsilon(1e-9));
  // The rule removed (1/cp of the bs-2 profile) gives another figure: the profiles' bs 1 is not half their bs 2.
  CHECK(std::abs(bs1->forward_time(1, 9) - bs2->forward_time(1, 9) / 2) > 1e-3);
}

TEST_CASE("context parallelism: a cp ring across nodes exposes its K/V exchange", "[seqpar][cp][plan_cost]") {
  const Cluster16& s = cluster16();
  std::vector<TrainingSetup> setups(1);
  setups[0].context_parallel = 2;
  const PlanSimulator sim = s.simulator(setups[0]);
  const RankLayout layout(s.cluster, {0, 1});  // A100 nodes first: ranks 0-3 and 4-7
  const PlanCostModel model(sim, layout, setups);
  const ModelShape shape = shape_from_model_config(s.model);
  const Network net(s.cluster, layout, sim.options().network);
  const int blocks = 8;
  FastStageCost f{};
  StageDetail across, inside;
  std::string why;
  // dp 2 x tp 4: the cp ring's two ranks (0 and 4) sit on two nodes, 25 GB/s apart; 8 samples each.
  REQUIRE(model.explain_stage(StageChoice{0, 8, Strategy{2, 4}, 1, 9}, 1, 3, 4, 8, 0, &f, &across, &why));
  const double step = net.p2p_seconds(0, 4, cp_kv_step_bytes(shape, s.model.sequence_length, 2, 4, 8)) * 1e3;
  CHECK(across.cp_exchange_forward_ms > 0);
  CHECK(across.cp_exchange_forward_ms < blocks * step);  // part of each exchange hides under attention
  CHECK(across.cp_exchange_backward_ms > across.cp_exchange_forward_ms);
  // dp 2 x tp 2 inside one node (NVLink): the same exchange per rank is 2x the bytes over a 12x faster link.
  REQUIRE(model.explain_stage(StageChoice{0, 4, Strategy{2, 2}, 1, 9}, 1, 3, 4, 8, 0, &f, &inside, &why));
  CHECK(inside.cp_exchange_forward_ms < across.cp_exchange_forward_ms);
  // Without cp there is no exchange.
  const PlanCostModel plain(sim, layout, {TrainingSetup{}});
  StageDetail none;
  REQUIRE(plain.explain_stage(StageChoice{0, 8, Strategy{2, 4}, 1, 9}, 1, 3, 4, 8, 0, &f, &none, &why));
  CHECK(none.cp_exchange_forward_ms == 0);
}

// The ring's merging (sim/sequence_parallel.h, ring_merge_bytes): derived step by step for every rank of
// the ring from which rows and keys each step covers, the most any rank moves is the closed form's.
TEST_CASE("context parallelism: the ring's merge bytes, per step and rank", "[seqpar][cp]") {
  ModelShape m;  // GPT-2 XL: 25 heads of 64, no GQA
  const long long seq = 1024;
  const int tp = 2;
  const double samples = 2;
  CHECK(ring_merge_bytes(m, seq, 1, tp, samples).forward == 0);
  CHECK(ring_merge_bytes(m, seq, 1, tp, samples).backward == 0);
  for (const int kv_heads : {25, 5}) {
    m.num_kv_heads = kv_heads;
    for (const int cp : {2, 4, 8}) {
      const double c = seq / (2.0 * cp);                                      // tokens per chunk
      const double q_row = samples * m.num_heads * m.head_dim / tp * 2.0;      // bytes per query row (bf16)
      const double kv_row = samples * 2.0 * kv_heads * m.head_dim / tp * 2.0;  // K and V per key (bf16)
      // The rank that moves the most over its forward and backward (the last of equals).
      double fwd = 0, bwd = 0;
      for (int r = 0; r < cp; ++r) {
        double f = 0, b = 0;
        for (int step = 1; step < cp; ++step) {
          const int src = (r - step + cp) % cp;
          const double rows = src < r ? 2 * c : c, keys = src < r ? c : 2 * c;
          f += 3 * rows * q_row;                      // result, partial in; result out
          b += 3 * rows * q_row + 3 * keys * kv_row;  // dQ and the travelling dK/dV
        }
        if (f + b >= fwd + bwd) {
          fwd = f;
          bwd = b;
        }
      }
      const RingMergeBytes got = ring_merge_bytes(m, seq, cp, tp, samples);
      CHECK(got.forward == Approx(fwd).epsilon(1e-12));
      CHECK(got.backward == Approx(bwd).epsilon(1e-12));
    }
  }
  // GPT-2 XL at cp 4, tp 2, 2 samples: O = 512 x 25 x 64 / 2 x 2 bytes, KV twice that.
  m.num_kv_heads = 25;
  CHECK(ring_merge_bytes(m, seq, 4, tp, samples).forward == 3.0 * 3 * 819200);
  CHECK(ring_merge_bytes(m, seq, 4, tp, samples).backward == 3.0 * 3 * (819200 + 1638400 / 2));
}

// The ring's own copies (sim/sequence_parallel.h, ring_copy_bytes): the K/V pack of the forward, the dK/dV pack
// of the backward, and the per-call passes of the fused backward (dot(dO, O), the fp32 dQ's conversion) that
// every backward step after the first runs again over the slowest rank's 2 c rows.
TEST_CASE("context parallelism: the ring's copies besides the merge", "[seqpar][cp]") {
  ModelShape m;  // GPT-2 XL: 25 heads of 64
  const long long seq = 1024;
  const int tp = 2;
  const double samples = 2;
  CHECK(ring_copy_bytes(m, seq, 1, tp, samples).forward == 0);
  CHECK(ring_copy_bytes(m, seq, 1, tp, samples).backward == 0);
  // cp 4: O = 2 x 256 tokens x 25 x 64 / 2 x 2 bytes = 819200; KV (K and V) twice that.
  const double O = 819200, KV = 1638400;
  CHECK(ring_copy_bytes(m, seq, 4, tp, samples).forward == 2 * KV);
  CHECK(ring_copy_bytes(m, seq, 4, tp, samples).backward == 2 * KV + 5 * 3 * O);
  // Grouped-query heads: the packs shrink with K and V, the per-step passes over the query rows do not.
  m.num_kv_heads = 5;
  CHECK(ring_copy_bytes(m, seq, 4, tp, samples).forward == 2 * KV / 5);
  CHECK(ring_copy_bytes(m, seq, 4, tp, samples).backward == 2 * KV / 5 + 5 * 3 * O);
  CHECK(ring_copy_bytes(m, seq, 2, tp, samples).backward == 2 * (2 * KV / 5) + 5 * 1 * (2 * O));
}

// The attention steps that hide an exchange run beside NCCL's kernel: (slowdown - 1) x the overlap.
TEST_CASE("context parallelism: the steps' stretch beside the exchange", "[seqpar][cp]") {
  CHECK(ring_forward_stretch_s(1, 5, 1, 1.5) == 0);
  CHECK(ring_backward_stretch_s(1, 5, 1, 1.5) == 0);
  CHECK(ring_forward_stretch_s(4, 3, 8, 1) == 0);  // no stretch measured
  CHECK(ring_backward_stretch_s(4, 3, 8, 1) == 0);
  CHECK(ring_forward_stretch_s(4, 1, 8, 1.5) == 3 * 0.5 * 1);   // each 1 s exchange beside 2 s of attention
  CHECK(ring_forward_stretch_s(4, 3, 8, 1.5) == 3 * 0.5 * 2);   // the 2 s step is beside 2 of the 3 s
  // Backward, W = 4 s: s beside steps 0 and 3, 2 s beside steps 1 and 2.
  CHECK(ring_backward_stretch_s(4, 1, 8, 1.5) == 0.5 * (1 + 2 + 2 + 1));
  CHECK(ring_backward_stretch_s(4, 3, 8, 1.5) == 0.5 * (3 + 4 + 4 + 3));
  CHECK(ring_backward_stretch_s(2, 5, 8, 1.5) == 0.5 * (5 + 5));  // cp 2: both exchanges beside a step
}

// PlanCostModel charges both: the stretch at the profiles' measured stretch beside a 16-bit all-gather (the
// "gather" of comm_overlap.json), the copies with the merge through the same roofline.
TEST_CASE("context parallelism in PlanCostModel: the stretch and the copies", "[seqpar][cp][plan_cost]") {
  const Cluster16& s = cluster16();
  const ModelShape shape = shape_from_model_config(s.model);
  TrainingSetup cp2;
  cp2.context_parallel = 2;
  SimulationOptions so;
  so.setup = cp2;
  const RankLayout layout(s.cluster, {0, 1});  // A100 nodes first
  auto detail = [&](double gather, StageDetail* d, double ring = 0) {
    ProfileSet profiles = s.profiles;
    profiles.set_overlap_slowdowns(OverlapSlowdowns{1.0, gather, ring});
    const PlanSimulator sim(s.cluster, profiles, shape, s.model.sequence_length, so);
    const PlanCostModel model(sim, layout, {cp2});
    FastStageCost f{};
    std::string why;
    // dp 2 x tp 2 inside one node: the cp ring is ranks 0 and 2, 8 samples each.
    REQUIRE(model.explain_stage(StageChoice{0, 4, Strategy{2, 2}, 1, 9}, 1, 3, 4, 8, 0, &f, d, &why));
  };
  StageDetail none, twice;
  detail(1.0, &none);
  detail(2.0, &twice);
  const Network net(s.cluster, layout, SimulationOptions{}.network);
  const int blocks = 8;
  const double step = net.ring_step_seconds(0, 2, cp_kv_step_bytes(shape, s.model.sequence_length, 2, 2, 8)) * 1e3;
  // At a stretch of 2 each exchange adds the time it overlaps a step. Forward: the step's attention
  // (attention / 2) is shorter than the exchange, whose rest shows (none's exposed time, step - attention / 2),
  // so the stretch adds step - exposed per block. Backward: both exchanges hide under a step's
  // W = attention, so each adds its whole length.
  const double fwd = twice.cp_exchange_forward_ms - none.cp_exchange_forward_ms;
  const double bwd = twice.cp_exchange_backward_ms - none.cp_exchange_backward_ms;
  REQUIRE(none.cp_exchange_forward_ms > 0);
  CHECK(fwd == Approx(blocks * step - none.cp_exchange_forward_ms).epsilon(1e-9));
  CHECK(bwd == Approx(2 * blocks * step).epsilon(1e-9));
  // A probe of the ring's own send/receive (compute_slowdown.ring) takes the gather's place.
  StageDetail ring;
  detail(1.0, &ring, 2.0);
  CHECK(ring.cp_exchange_forward_ms == twice.cp_exchange_forward_ms);
  CHECK(ring.cp_exchange_backward_ms == twice.cp_exchange_backward_ms);
  detail(2.0, &ring, 1.0);
  CHECK(ring.cp_exchange_forward_ms == none.cp_exchange_forward_ms);
  // The copies go with the merge through one roofline: the forward's and the backward's bytes keep their ratio.
  const RingMergeBytes merge = ring_merge_bytes(shape, s.model.sequence_length, 2, 2, 8);
  const RingMergeBytes copies = ring_copy_bytes(shape, s.model.sequence_length, 2, 2, 8);
  REQUIRE(none.cp_merge_backward_ms > 0);
  CHECK(none.cp_merge_forward_ms / none.cp_merge_backward_ms ==
        Approx((merge.forward + copies.forward) / (merge.backward + copies.backward)).epsilon(1e-12));
  CHECK(none.cp_merge_forward_ms == twice.cp_merge_forward_ms);
}

// A ring step goes through NCCL: inside a node it runs at the measured collective bandwidth, not the
// clusterfile's datasheet link (which p2p_seconds keeps); across nodes both are the inter-node link.
TEST_CASE("network: a ring step at the collective bandwidth", "[seqpar][cp][network]") {
  const Cluster16& s = cluster16();
  const RankLayout layout(s.cluster, {0, 1});  // A100 nodes first: ranks 0-3 and 4-7
  NetworkOptions o;
  o.intra_collective_bytes_per_s.assign(s.cluster.device_types().size(), 100e9);
  const Network net(s.cluster, layout, o);
  const double bytes = 8e6;
  CHECK(net.ring_step_seconds(0, 1, bytes) == Approx(o.intra_latency_s + bytes / 100e9).epsilon(1e-12));
  CHECK(net.p2p_seconds(0, 1, bytes) == Approx(o.intra_latency_s + bytes / net.link_bandwidth(0, 1)).epsilon(1e-12));
  CHECK(net.ring_step_seconds(0, 1, bytes) > net.p2p_seconds(0, 1, bytes));  // 100 GB/s < the A100's 300 GB/s link
  CHECK(net.ring_step_seconds(0, 4, bytes) == Approx(net.p2p_seconds(0, 4, bytes)).epsilon(1e-12));
  CHECK(net.ring_step_seconds(0, 0, bytes) == 0);
}

// PlanCostModel's ring: the merge through the roofline at the A100's achieved HBM rate, on the forward and
// the backward; the exchange at the measured collective bandwidth (two slower settings: the exposed
// exchange grows by exactly the blocks' extra step time).
TEST_CASE("context parallelism in PlanCostModel: the ring's merge and its exchange at the collective bandwidth",
          "[seqpar][cp][plan_cost]") {
  const Cluster16& s = cluster16();
  std::vector<TrainingSetup> setups(1);
  setups[0].context_parallel = 2;
  const ModelShape shape = shape_from_model_config(s.model);
  const RankLayout layout(s.cluster, {0, 1});
  const StageChoice c{0, 4, Strategy{4, 1}, 1, 9};  // 4 A100s, the 8 blocks only (stage 1 of 3)
  const int blocks = 8;
  auto stage = [&](double collective_bytes_per_s, FastStageCost* f, StageDetail* d) {
    SimulationOptions so;
    so.setup = setups[0];
    so.network.intra_collective_bytes_per_s.assign(s.cluster.device_types().size(), collective_bytes_per_s);
    const PlanSimulator sim(s.cluster, s.profiles, shape, s.model.sequence_length, so);
    const PlanCostModel model(sim, layout, setups);
    std::string why;
    REQUIRE(model.explain_stage(c, 1, 3, 4, 8, 0, f, d, &why));
  };
  FastStageCost f10{}, f20{};
  StageDetail d10, d20;
  stage(10e9, &f10, &d10);
  stage(20e9, &f20, &d20);
  // Each cp rank: 4 samples (a group's share of 8 over dp 4 / cp 2).
  const RingMergeBytes merge = ring_merge_bytes(shape, s.model.sequence_length, 2, 1, 4);
  const RingMergeBytes copies = ring_copy_bytes(shape, s.model.sequence_length, 2, 1, 4);
  const double rate = achieved_bytes_per_s(find_gpu_spec("A100")->memory_bw_gbs, RateDefaults{}.memory_efficiency);
  CHECK(d10.cp_merge_forward_ms == Approx(blocks * (merge.forward + copies.forward) / rate * 1e3).epsilon(1e-12));
  CHECK(d10.cp_merge_backward_ms == Approx(blocks * (merge.backward + copies.backward) / rate * 1e3).epsilon(1e-12));
  CHECK(d10.cp_merge_forward_ms > 0);
  const double bytes = cp_kv_step_bytes(shape, s.model.sequence_length, 2, 1, 4);
  REQUIRE(d20.cp_exchange_forward_ms > 0);  // exposed at both settings (so the difference is exact)
  CHECK(d10.cp_exchange_forward_ms - d20.cp_exchange_forward_ms ==
        Approx(blocks * (bytes / 10e9 - bytes / 20e9) * 1e3).epsilon(1e-9));
  // The backward's ring carries 2 cp - 1 steps' bytes (K/V out, dK/dV round and home): 3 at cp 2.
  CHECK(d10.cp_exchange_backward_ms - d20.cp_exchange_backward_ms ==
        Approx(blocks * 3 * (bytes / 10e9 - bytes / 20e9) * 1e3).epsilon(1e-9));
  // Both land on the stage's forward and backward.
  CHECK(f10.forward_ms - f20.forward_ms == Approx(d10.cp_exchange_forward_ms - d20.cp_exchange_forward_ms).epsilon(1e-9));
  CHECK(f10.backward_ms - f20.backward_ms ==
        Approx(d10.cp_exchange_backward_ms - d20.cp_exchange_backward_ms).epsilon(1e-9));
  // The stage without cp whose replicas are the cp groups (dp 2, 4 samples each): a cp rank computes half
  // of its replica's forward and backward, plus the ring's exchange and merge; what is not halved (the
  // pass's own overhead outside the layers) splits by the backward share on both: with the ring's parts
  // taken out, forward and backward leave that overhead in the backward share's proportion.
  SimulationOptions so;
  const PlanSimulator plain_sim(s.cluster, s.profiles, shape, s.model.sequence_length, so);
  const PlanCostModel plain(plain_sim, layout, {TrainingSetup{}});
  FastStageCost half{};
  StageDetail dh;
  std::string why;
  REQUIRE(plain.explain_stage(StageChoice{0, 2, Strategy{2, 1}, 1, 9}, 1, 3, 4, 8, 0, &half, &dh, &why));
  const double bs = so.backward_share;
  const double outside_fwd = 2 * (f10.forward_ms - d10.cp_exchange_forward_ms - d10.cp_merge_forward_ms) - half.forward_ms;
  const double outside_bwd =
      2 * (f10.backward_ms - d10.cp_exchange_backward_ms - d10.cp_merge_backward_ms) - half.backward_ms;
  CHECK(outside_fwd * bs == Approx(outside_bwd * (1 - bs)).epsilon(1e-9));
}

// Sequence parallelism's collectives (sim/sequence_parallel.h): each all-reduce of the activations becomes an
// all-gather and a reduce-scatter, two calls at the gather bandwidth. Values derived by hand.
TEST_CASE("sequence parallelism: all-gather + reduce-scatter in place of each all-reduce", "[seqpar][sp]") {
  // A block: 2 all-reduces per pass, each now 2 x 60 us against 80: +40 us each.
  const SpCollectiveExtra block = sp_collective_extra_s(80e-6, 60e-6, 1, false, false);
  CHECK(block.forward_s == Approx(2 * 40e-6).epsilon(1e-12));
  CHECK(block.backward_s == Approx(2 * 40e-6).epsilon(1e-12));
  // The embedding reduce-scatters (forward: 60 - 80) and all-gathers in the backward (+60); the head the
  // other way round.
  const SpCollectiveExtra ends = sp_collective_extra_s(80e-6, 60e-6, 0, true, true);
  CHECK(ends.forward_s == Approx(-20e-6 + 60e-6).epsilon(1e-12));
  CHECK(ends.backward_s == Approx(60e-6 - 20e-6).epsilon(1e-12));
  const SpCollectiveExtra all = sp_collective_extra_s(80e-6, 60e-6, 10, true, false);
  CHECK(all.forward_s == Approx(10 * 80e-6 - 20e-6).epsilon(1e-12));
  CHECK(all.backward_s == Approx(10 * 80e-6 + 60e-6).epsilon(1e-12));
}

TEST_CASE("network: an all-gather or reduce-scatter call inside a node", "[seqpar][sp][network]") {
  const Cluster16& s = cluster16();
  const RankLayout layout(s.cluster, {0, 1});  // A100 nodes first: ranks 0-3 and 4-7
  NetworkOptions o;
  o.intra_collective_bytes_per_s.assign(s.cluster.device_types().size(), 300e9);
  const Network net(s.cluster, layout, o);
  const double bytes = 21e6;
  // 2 GPUs: one ring step, but a call costs the all-reduce's 2 steps of latency; half the bytes at
  // 0.81 x 300 GB/s.
  CHECK(net.intra_node_gather_seconds(0, 2, bytes) == Approx(2 * 11e-6 + bytes / 2 / (0.81 * 300e9)).epsilon(1e-12));
  // 4 GPUs: 3 steps, 3/4 of the bytes.
  CHECK(net.intra_node_gather_seconds(0, 4, bytes) == Approx(3 * 11e-6 + 0.75 * bytes / (0.81 * 300e9)).epsilon(1e-12));
  CHECK(net.intra_node_gather_seconds(0, 1, bytes) == 0);
  // Together they cost more than the all-reduce they replace (22 us + 21 MB / 300 GB/s).
  CHECK(2 * net.intra_node_gather_seconds(0, 2, bytes) - net.intra_node_all_reduce_seconds(0, 2, bytes) ==
        Approx(2 * 11e-6 + bytes / 300e9 * (1 / 0.81 - 1)).epsilon(1e-9));
}

// PlanCostModel: a tp 2 stage of the whole model costs, with sequence parallelism, exactly the collectives'
// extra on top of the same stage without it (forward and backward); memory and sends aside, nothing else moves.
TEST_CASE("sequence parallelism in PlanCostModel: the extra collectives on the forward and the backward",
          "[seqpar][sp][plan_cost]") {
  const Cluster16& s = cluster16();
  const ModelShape shape = shape_from_model_config(s.model);
  const RankLayout layout(s.cluster, {0, 1});
  const int layers = shape.metis_num_layers();
  const StageChoice c{0, 2, Strategy{1, 2}, 0, layers};  // 2 A100s, every layer
  TrainingSetup plain_setup, sp_setup;
  sp_setup.sequence_parallel = true;
  SimulationOptions so;
  so.network.intra_collective_bytes_per_s.assign(s.cluster.device_types().size(), 250e9);
  const PlanSimulator sim(s.cluster, s.profiles, shape, s.model.sequence_length, so);
  const PlanCostModel model(sim, layout, {plain_setup, sp_setup});
  FastStageCost plain{}, sp{};
  StageDetail d;
  std::string why;
  const int micro_batch = 2;
  REQUIRE(model.explain_stage(c, 0, 1, 4, micro_batch, 0, &plain, &d, &why));
  REQUIRE(model.explain_stage(c, 0, 1, 4, micro_batch, 1, &sp, &d, &why));
  const Network net(s.cluster, layout, so.network);
  const double bytes = micro_batch * static_cast<double>(s.model.sequence_length) * shape.hidden_size * 2;
  const double ar = net.intra_node_all_reduce_seconds(0, 2, bytes), g = net.intra_node_gather_seconds(0, 2, bytes);
  const int blocks = layers - 2;
  // Forward: per block 2 x (2 g - ar); the embedding's g - ar, the head's g. Backward: the embedding's g, the
  // head's g - ar.
  const double per_block = 2 * (2 * g - ar);
  CHECK(sp.forward_ms - plain.forward_ms == Approx((blocks * per_block + (g - ar) + g) * 1e3).epsilon(1e-9));
  CHECK(sp.backward_ms - plain.backward_ms == Approx((blocks * per_block + g + (g - ar)) * 1e3).epsilon(1e-9));
  CHECK(sp.forward_ms > plain.forward_ms);
  // tp 1: nothing to gather.
  FastStageCost one_plain{}, one_sp{};
  REQUIRE(model.explain_stage(StageChoice{0, 1, Strategy{1, 1}, 0, layers}, 0, 1, 4, micro_batch, 0, &one_plain, &d, &why));
  REQUIRE(model.explain_stage(StageChoice{0, 1, Strategy{1, 1}, 0, layers}, 0, 1, 4, micro_batch, 1, &one_sp, &d, &why));
  CHECK(one_sp.forward_ms == one_plain.forward_ms);
  CHECK(one_sp.backward_ms == one_plain.backward_ms);
}

TEST_CASE("plan file: sequence_parallel, context_parallel and overlap round-trip", "[seqpar][plan_file]") {
  ordered_json j = {{"node_sequence", {"A100"}}, {"device_groups", {4}}, {"strategies", {{4, 1}}}, {"batches", 2},
                    {"layer_partition", {0, 10}}, {"gbs", 8},
                    {"model", {{"num_layers", 10}, {"hidden_size", 1024}, {"sequence_length", 2048},
                               {"vocab_size", 50257}, {"attention_heads", 16}}},
                    {"sequence_parallel", true}, {"context_parallel", 2},
                    {"overlap", {{"grad_reduce", true}, {"param_gather", false}, {"grad_bucket_params", 1e7}}}};
  const PlanFile f = plan_file_from_json(j, "p.json");
  CHECK(f.sequence_parallel);
  CHECK(f.context_parallel == 2);
  CHECK(f.overlap.grad_reduce);
  CHECK_FALSE(f.overlap.param_gather);
  CHECK(f.overlap.grad_bucket_params == 1e7);
  const ordered_json back = plan_file_to_json(f);
  CHECK(back["sequence_parallel"] == true);
  CHECK(back["context_parallel"] == 2);
  CHECK(back["overlap"]["grad_reduce"] == true);
  CHECK(back["overlap"]["grad_bucket_params"] == 1e7);
  j["context_parallel"] = 0;
  CHECK_THROWS_AS(plan_file_from_json(j, "p.json"), InputError);
  // A cp group feeds on its group's samples: micro-batches of 2 feed dp 4 at cp 2, of 1 only at cp 4 (and
  // at cp 2 they cannot feed its two groups); cp must divide dp.
  j["context_parallel"] = 2;
  j["batches"] = 8;
  CHECK_THROWS_WITH(plan_file_from_json(j, "p.json"),
                    Catch::Contains("cannot feed the 2 data-parallel replicas of stage 0 (its dp / context_parallel)"));
  j["context_parallel"] = 4;
  CHECK(plan_file_from_json(j, "p.json").context_parallel == 4);
  j["context_parallel"] = 3;
  CHECK_THROWS_WITH(plan_file_from_json(j, "p.json"),
                    Catch::Contains("key 'context_parallel' = 3: does not divide stage 0's dp 4"));
  j["batches"] = 2;
  j["context_parallel"] = 2;
  j["overlap"]["grad_reduce"] = "yes";
  CHECK_THROWS_WITH(plan_file_from_json(j, "p.json"), "p.json: key 'overlap.grad_reduce' must be true or false");
}

TEST_CASE("search settings: overlap as a dimension", "[seqpar][overlap]") {
  std::vector<TrainingSetup> base(2);
  base[1].zero_stage = 1;
  CHECK(with_overlap_dimension(base, "off").size() == 2);
  const auto on = with_overlap_dimension(base, "on");
  REQUIRE(on.size() == 2);
  CHECK(on[0].overlap.grad_reduce);
  CHECK_FALSE(on[0].overlap.param_gather);  // nothing to gather without ZeRO
  CHECK(on[1].overlap.param_gather);
  const auto both = with_overlap_dimension(base, "auto");
  REQUIRE(both.size() == 4);
  CHECK_FALSE(both[0].overlap.any());
  CHECK(both[1].overlap.any());
  CHECK_THROWS_WITH(with_overlap_dimension(base, "maybe"), "--overlap: 'maybe': expected off, on or auto");
  TrainingSetup t;
  t.sequence_parallel = true;
  t.context_parallel = 4;
  t.overlap.grad_reduce = true;
  CHECK(parallel_setup_suffix(t) == ", sequence parallel, cp 4, overlapped communication");
}

}  // namespace hetplan

namespace hetplan {

TEST_CASE("simulate --context-parallel and --overlap-grad-reduce: costed, recorded, and checked", "[seqpar][cli]") {
  const auto dir = test::scratch_dir("seqpar-cli");
  const std::string bin = HETPLAN_BINARY, src = HETPLAN_SOURCE_DIR;
  REQUIRE(test::run_hetplan("gen-profiles --analytic 10 8 --types A100 --max-tp 2 --out " + (dir / "prof").string())
              .exit_code == 0);
  // One stage of the 8 A100s (dp 8), micro-batches of 8.
  const std::string plan = (dir / "plan.json").string();
  std::ofstream(plan) << R"({"node_sequence": ["A100"], "device_groups": [8], "strategies": [[8, 1]], "batches": 2,
    "layer_partition": [0, 10], "gbs": 16, "model": {"num_layers": 10, "hidden_size": 1600, "sequence_length": 1024,
    "vocab_size": 50257, "attention_heads": 25}})";
  const std::string common = "simulate --plan " + plan + " --hostfile " + src + "/hostfiles/a100_v100_16.hostfile" +
                             " --clusterfile " + src + "/hostfiles/clusterfile.json --profiles " + (dir / "prof").string();
  const auto base = test::run_hetplan(common + " --json " + (dir / "base.json").string());
  REQUIRE(base.exit_code == 0);
  const auto cp = test::run_hetplan(common + " --context-parallel 2 --overlap-grad-reduce --json " +
                                    (dir / "cp.json").string());
  REQUIRE(cp.exit_code == 0);
  CHECK(cp.output.find("cp 2, overlapped grad reduce") != std::string::npos);
  const ordered_json j = read_json_file((dir / "cp.json").string());
  CHECK(j["plan"]["context_parallel"] == 2);
  CHECK(j["plan"]["overlap"]["grad_reduce"] == true);
  CHECK(j["iteration_ms"].get<double>() != read_json_file((dir / "base.json").string())["iteration_ms"].get<double>());
  const auto bad = test::run_hetplan(common + " --context-parallel 3");
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("dp 8 is not a multiple of the context-parallel size 3") != std::string::npos);
  // The compute stretch beside the collectives: the default, then the profile folder's probe, then the flag.
  CHECK(j["overlap_compute_slowdown"]["source"] == "default (kCommComputeSlowdown)");
  CHECK(j["overlap_compute_slowdown"]["reduce"].get<double>() == kCommComputeSlowdown);
  std::ofstream(dir / "prof" / kOverlapProbeFile) << R"({"compute_slowdown": {"reduce": 1.5, "gather": 1.25}})";
  const auto probed = test::run_hetplan(common + " --overlap-grad-reduce --json " + (dir / "probed.json").string());
  REQUIRE(probed.exit_code == 0);
  CHECK(probed.output.find("overlap: compute beside reductions x1.500, beside gathers x1.250") != std::string::npos);
  const ordered_json pj = read_json_file((dir / "probed.json").string());
  CHECK(pj["overlap_compute_slowdown"]["source"].get<std::string>().find(kOverlapProbeFile) != std::string::npos);
  const auto forced = test::run_hetplan(common + " --overlap-grad-reduce --comm-slowdown 1.035");
  CHECK(forced.output.find("x1.035 (--comm-slowdown)") != std::string::npos);
  std::ofstream(dir / "prof" / kOverlapProbeFile) << R"({"compute_slowdown": {"reduce": 0.5, "gather": 1.25}})";
  const auto broken = test::run_hetplan(common + " --overlap-grad-reduce");
  CHECK(broken.exit_code == 2);
  CHECK(broken.output.find("compute_slowdown.reduce' must be a number in [1, 10]") != std::string::npos);
  std::filesystem::remove(dir / "prof" / kOverlapProbeFile);
}

}  // namespace hetplan

namespace hetplan {

// Megatron's scatter/gather of pipeline sends (Narayanan et al. SC'21, Sec. 4.1): each tp rank sends 1/tp of
// the boundary activation over its own link, and the receiving stage all-gathers the pieces over its tp ranks.
// Under sequence parallelism the tensor is already split by tp: the send alone.
TEST_CASE("simulate: pipeline sends pay the receiver's tp all-gather, except under sequence parallelism",
          "[seqpar][scatter_gather]") {
  const auto dir = test::scratch_dir("scatter-gather");
  const std::string src = HETPLAN_SOURCE_DIR;
  REQUIRE(test::run_hetplan("gen-profiles --analytic 10 2 --types A100 --max-tp 8 --hidden-size 1024 --heads 16 "
                            "--seq-len 2048 --vocab-size 51200 --out " + (dir / "prof").string())
              .exit_code == 0);
  std::ofstream(dir / "hostfile") << "0.0.0.4 slots=8\n0.0.0.4 slots=8\n";
  // Two stages of tp 8, one node each: the sends cross nodes (25 GB/s per rail), the gather stays inside
  // (300 GB/s, the clusterfile's A100 intra bandwidth, with --collectives clusterfile).
  const std::string plan = (dir / "plan.json").string();
  std::ofstream(plan) << R"({"node_sequence": ["A100"], "device_groups": [8, 8], "strategies": [[1, 8], [1, 8]],
    "batches": 2, "layer_partition": [0, 5, 10], "gbs": 4, "model": {"num_layers": 10, "hidden_size": 1024,
    "sequence_length": 2048, "vocab_size": 51200, "attention_heads": 16}})";
  const std::string common = "simulate --plan " + plan + " --hostfile " + (dir / "hostfile").string() +
                             " --clusterfile " + src + "/hostfiles/clusterfile.json --collectives clusterfile" +
                             " --profiles " + (dir / "prof").string();
  REQUIRE(test::run_hetplan(common + " --json " + (dir / "plain.json").string()).exit_code == 0);
  REQUIRE(test::run_hetplan(common + " --sequence-parallel --json " + (dir / "sp.json").string()).exit_code == 0);
  const ordered_json plain = read_json_file((dir / "plain.json").string());
  const ordered_json sp = read_json_file((dir / "sp.json").string());
  const double bytes = 2.0 * 2048 * 1024 * 2;  // micro-batch 2 x seq x hidden, 16-bit
  // The send: 1/tp of it over the inter-node rail, after the inter-node latency (20 us).
  const double send_ms = (20e-6 + bytes / 8 / 25e9) * 1e3;
  // The gather: a ring all-gather over 8 GPUs, 7 steps of 11 us and 7/8 of the bytes at 300 GB/s.
  const double gather_ms = (7 * 11e-6 + 7.0 / 8 * bytes / 300e9) * 1e3;
  CHECK(sp["stages"][0]["send_forward_ms"].get<double>() == Approx(send_ms).epsilon(1e-9));
  CHECK(sp["stages"][1]["send_backward_ms"].get<double>() == Approx(send_ms).epsilon(1e-9));
  CHECK(plain["stages"][0]["send_forward_ms"].get<double>() == Approx(send_ms + gather_ms).epsilon(1e-9));
  CHECK(plain["stages"][1]["send_backward_ms"].get<double>() == Approx(send_ms + gather_ms).epsilon(1e-9));
}

}  // namespace hetplan
