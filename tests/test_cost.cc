// MetisCostModel: every term of HeteroCostEstimator.get_cost for 13 plans of the row-1 search.
//
// Reference values: livingshade/Metis @ 900445f (the Python reference), run
// with the two determinism patches (node sequences are the permutations of
// the device types sorted by name, in lexicographic order; the model-level
// profile and the layer-balancer normalisation are read from
// DeviceType.<first type by name>_tp1_bs1.json). Every number below was
// extracted from that run and is embedded as a literal; doubles carry the
// full Python repr digits and are compared with == (the search and cost code
// is meant to be bit-exact).
//
// Row 1: 10 layers (synthetic profiles), gen_hostfile.py 16 (32 GPUs), gbs
// 128, max profiled batch size 128, model GPT hidden 4096, sequence 1024,
// vocab 51200. The plans include heterogeneous stages and the num_stage quirk
// (label 1 with two device groups: only the first stage is costed).
#include <catch2/catch.hpp>

#include <vector>

#include "metis/metis_cost.h"
#include "sim/rank_layout.h"
#include "tests/fixtures.h"

using namespace hetplan;

namespace {

// Failure messages print doubles with enough digits to tell them apart.
[[maybe_unused]] const bool kFullPrecision = (Catch::StringMaker<double>::precision = 17, true);

// Per costed stage: the inputs of its dp and pp terms.
struct StageTerms {
  int mbs;
  double stage_parameters;
  double dp_bandwidth;
  double activation_size;  // not the last costed stage only
  double pp_bandwidth;     // not the last costed stage only
};

struct CostCase {
  int estimate_index;  // index in the search's estimate_costs list (base mode)
  int plan_idx;        // index of the inter-stage plan
  const char* note;
  int ns_idx;  // 0: (A100, V100), 1: (V100, A100)
  std::vector<int> device_groups;
  int num_stage, batches;
  std::vector<Strategy> strategies;
  std::vector<int> layer_partition;
  double execution, fb_sync, parameter_update, dp, pp, batch_generate;
  double total;
  std::vector<StageTerms> stages;
};

const std::vector<CostCase> kCostCases = {
    {0, 0, "hetero [32], batches 128",
     0, {32}, 1, 128,
     {{1, 32}}, {0, 10},
     1329.5936584472656, 941.9387817382812, 2.4568110704421997,
     0.0, 0.0, 117.0562744140625,
     2391.0455256700516,
     {
         {1, 75171968.0, 46.0, 0.0, 0.0}}},
    {3, 3, "hetero [32] (8,4): data-load-balanced micro-batches",
     0, {32}, 1, 16,
     {{8, 4}}, {0, 10},
     2489.9330139160156, 941.9387817382812, 19.654488563537598,
     21.81856636379076, 0.0, 14.632034301757812,
     3487.9768848833833,
     {
         {1, 601375744.0, 46.0, 0.0, 0.0}}},
    {7, 7, "best plan of row 1 (hetero [32], batches 1)",
     0, {32}, 1, 1,
     {{1, 32}}, {0, 10},
     1160.8753204345703, 631.065845489502, 2.4568110704421997,
     0.0, 0.0, 0.9145021438598633,
     1795.3124791383743,
     {
         {128, 75171968.0, 46.0, 0.0, 0.0}}},
    {9, 9, "[16,16] homogeneous stages",
     0, {16, 16}, 2, 64,
     {{2, 8}, {2, 8}}, {0, 7, 10},
     2357.5724363327026, 1883.8775634765625, 6.879070997238159,
     4.165888247282608, 0.08695652173913043, 58.52813720703125,
     4311.1100527825565,
     {
         {1, 200939520.0, 46.0, 4194304.0, 46.0},
         {1, 99748352.0, 50.0, 0.0, 0.0}}},
    {18, 18, "[8,8,8,8]",
     0, {8, 8, 8, 8}, 4, 32,
     {{4, 2}, {4, 2}, {4, 2}, {4, 2}}, {0, 4, 7, 8, 10},
     2086.4797830581665, 3514.8014068603516, 15.723590850830078,
     15.55472995923913, 0.2539130434782609, 29.264068603515625,
     5662.077492375581,
     {
         {1, 500183040.0, 46.0, 4194304.0, 46.0},
         {1, 303575040.0, 46.0, 4194304.0, 46.0},
         {1, 101191680.0, 50.0, 4194304.0, 50.0},
         {1, 297801728.0, 50.0, 0.0, 0.0}}},
    {48, 48, "7 stages, hetero stage 3, partition ends at 9 (layer dropped)",
     0, {4, 4, 4, 8, 4, 4, 4}, 7, 128,
     {{1, 4}, {1, 4}, {1, 4}, {1, 8}, {1, 4}, {1, 4}, {1, 4}}, {0, 2, 4, 5, 8, 8, 8, 9},
     4634.413838386536, 7535.51025390625, 3.9308977127075195,
     0.0, 0.5078260869565218, 117.0562744140625,
     12291.419090506512,
     {
         {1, 148899840.0, 46.0, 4194304.0, 46.0},
         {1, 101191680.0, 46.0, 4194304.0, 46.0},
         {1, 50595840.0, 46.0, 4194304.0, 46.0},
         {1, 75893760.0, 46.0, 4194304.0, 46.0},
         {1, 0.0, 50.0, 4194304.0, 50.0},
         {1, 0.0, 50.0, 4194304.0, 50.0},
         {1, 50595840.0, 50.0, 0.0, 0.0}}},
    {57, 52, "7 stages, hetero stage, num_repartition 2",
     0, {4, 4, 4, 8, 4, 4, 4}, 7, 8,
     {{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {2, 2}, {1, 4}}, {0, 3, 5, 7, 8, 8, 9, 10},
     4355.37177324295, 5048.526763916016, 23.585386276245117,
     24.815726902173914, 6.497391304347826, 7.316017150878906,
     9466.113058792613,
     {
         {4, 797982720.0, 46.0, 16777216.0, 46.0},
         {4, 404766720.0, 46.0, 16777216.0, 46.0},
         {4, 404766720.0, 46.0, 16777216.0, 46.0},
         {2, 202383360.0, 46.0, 8388608.0, 46.0},
         {16, 0.0, 50.0, 67108864.0, 50.0},
         {8, 101191680.0, 50.0, 209715200.0, 50.0},
         {16, 98305024.0, 50.0, 0.0, 0.0}}},
    {84, 55, "hetero stage with (2,4), batches 1",
     0, {4, 4, 4, 8, 4, 4, 4}, 7, 1,
     {{4, 1}, {4, 1}, {4, 1}, {2, 4}, {1, 4}, {1, 4}, {1, 4}}, {0, 2, 4, 6, 8, 8, 8, 9},
     10474.857330322266, 5048.526763916016, 15.723590850830078,
     18.521993885869566, 34.39304347826087, 0.9145021438598633,
     15592.937224597103,
     {
         {32, 595599360.0, 46.0, 134217728.0, 46.0},
         {32, 404766720.0, 46.0, 134217728.0, 46.0},
         {32, 404766720.0, 46.0, 134217728.0, 46.0},
         {64, 101191680.0, 46.0, 268435456.0, 46.0},
         {128, 0.0, 50.0, 536870912.0, 50.0},
         {128, 0.0, 50.0, 536870912.0, 50.0},
         {128, 50595840.0, 50.0, 0.0, 0.0}}},
    {111, 82, "[4]*8",
     0, {4, 4, 4, 4, 4, 4, 4, 4}, 8, 32,
     {{4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 2, 4, 6, 7, 8, 8, 9, 10},
     3586.9458317756653, 6275.721740722656, 15.723590850830078,
     18.521993885869566, 1.5078260869565216, 29.264068603515625,
     9927.685051925493,
     {
         {1, 595599360.0, 46.0, 4194304.0, 46.0},
         {1, 404766720.0, 46.0, 4194304.0, 46.0},
         {1, 404766720.0, 46.0, 4194304.0, 46.0},
         {1, 202383360.0, 46.0, 4194304.0, 46.0},
         {1, 202383360.0, 50.0, 4194304.0, 50.0},
         {1, 0.0, 50.0, 4194304.0, 50.0},
         {1, 202383360.0, 50.0, 52428800.0, 50.0},
         {1, 393220096.0, 50.0, 0.0, 0.0}}},
    {117, 88, "QUIRK node_sequence (V100,A100), num_stage field 1 with 2 device groups, batches 128",
     1, {16, 16}, 1, 128,
     {{1, 16}, {1, 16}}, {0, 3, 10},
     2403.553009033203, 1883.8775634765625, 1.4740866422653198,
     0.0, 0.0, 117.0562744140625,
     4405.960933566093,
     {
         {1, 49873920.0, 50.0, 0.0, 0.0}}},
    {123, 94, "QUIRK num_stage 1 with 2 device groups, batches 2",
     1, {16, 16}, 1, 2,
     {{16, 1}, {16, 1}}, {0, 3, 10},
     1639.5936012268066, 1465.0352001190186, 23.585386276245117,
     28.5380859375, 0.0, 1.8290042877197266,
     3158.58127784729,
     {
         {4, 797982720.0, 50.0, 0.0, 0.0}}},
    {126, 97, "node_sequence (V100,A100), num_stage 2, same groups (compare with quirk)",
     1, {16, 16}, 2, 64,
     {{2, 8}, {2, 8}}, {0, 3, 10},
     2434.372663497925, 538.250732421875, 6.879070997238159,
     4.165898862092392, 0.08695652173913043, 58.52813720703125,
     3042.2834595079007,
     {
         {1, 99747840.0, 50.0, 4194304.0, 46.0},
         {1, 200940032.0, 46.0, 0.0, 0.0}}},
    {165, 136, "node_sequence (V100,A100), hetero stage 3, batches 128",
     1, {4, 4, 4, 8, 4, 4, 4}, 7, 128,
     {{1, 4}, {1, 4}, {1, 4}, {1, 8}, {1, 4}, {1, 4}, {1, 4}}, {0, 1, 2, 3, 4, 6, 8, 10},
     4685.8479380607605, 2153.0029296875, 3.9308977127075195,
     0.0, 0.5078260869565218, 117.0562744140625,
     6960.345865961987,
     {
         {1, 98304000.0, 50.0, 4194304.0, 50.0},
         {1, 50595840.0, 50.0, 4194304.0, 50.0},
         {1, 50595840.0, 50.0, 4194304.0, 46.0},
         {1, 25297920.0, 46.0, 4194304.0, 46.0},
         {1, 101191680.0, 46.0, 4194304.0, 46.0},
         {1, 101191680.0, 46.0, 4194304.0, 46.0},
         {1, 148900864.0, 46.0, 0.0, 0.0}}},
};

}  // namespace

TEST_CASE("Metis cost model: total and terms of row-1 plans", "[cost]") {
  REQUIRE_SHARED_DATA();
  const ProfileSet& profiles = test::synthetic_profiles(10);
  const Cluster cluster = test::table1_cluster(16);
  REQUIRE(cluster.device_types() == std::vector<std::string>{"A100", "V100"});
  ModelConfig model;
  model.num_layers = 10;
  const MetisCostModel cost_model(profiles, model, {0, 1}, 128);
  const RankLayout layouts[2] = {RankLayout(cluster, {0, 1}), RankLayout(cluster, {1, 0})};

  for (const CostCase& c : kCostCases) {
    INFO("estimate " << c.estimate_index << " (plan " << c.plan_idx << "): " << c.note);
    const std::vector<int> groups = c.device_groups;
    InterStagePlan plan;
    plan.ns_idx = c.ns_idx;
    plan.device_groups = &groups;
    plan.num_stage = c.num_stage;
    plan.batches = c.batches;
    plan.gbs = 128;
    const RankLayout& layout = layouts[c.ns_idx];

    CostTerms t;
    SkippedPlan skip;
    REQUIRE(cost_model.cost(plan, layout, c.strategies.data(), c.layer_partition.data(), &t, &skip));
    CHECK(t.execution == c.execution);
    CHECK(t.fb_sync == c.fb_sync);
    CHECK(t.parameter_update == c.parameter_update);
    CHECK(t.dp == c.dp);
    CHECK(t.pp == c.pp);
    CHECK(t.batch_generate == c.batch_generate);
    CHECK(t.total == c.total);

    // Only the first num_stage stages are costed.
    REQUIRE(static_cast<int>(c.stages.size()) == std::min(c.num_stage, plan.num_stages()));
    int begin = 0;
    for (std::size_t s = 0; s < c.stages.size(); ++s) {
      INFO("stage " << s);
      const StageTerms& st = c.stages[s];
      const Strategy strategy = c.strategies[s];
      const int start = c.layer_partition[s], end = c.layer_partition[s + 1];
      CHECK(plan.gbs / strategy.dp / plan.batches == st.mbs);
      CHECK(cost_model.stage_parameters(strategy.tp, start, end) == st.stage_parameters);
      CHECK(layout.dp_bandwidth(begin, strategy.dp, strategy.tp) == st.dp_bandwidth);
      if (s + 1 < c.stages.size()) {
        CHECK(cost_model.activation_size(end, st.mbs, strategy.tp) == st.activation_size);
        CHECK(layout.pp_bandwidth(begin, begin + groups[s] + groups[s + 1]) == st.pp_bandwidth);
      }
      begin += groups[s];
    }
  }
}

TEST_CASE("Metis cost model: the num_stage label decides how many stages are costed", "[cost][quirk]") {
  REQUIRE_SHARED_DATA();
  // Plan 88 (label 1) and plan 96 (label 2) of row 1 have the same groups [16, 16] on (V100, A100).
  const ProfileSet& profiles = test::synthetic_profiles(10);
  const Cluster cluster = test::table1_cluster(16);
  ModelConfig model;
  model.num_layers = 10;
  const MetisCostModel cost_model(profiles, model, {0, 1}, 128);
  const RankLayout layout(cluster, {1, 0});
  const std::vector<int> groups{16, 16};
  const std::vector<Strategy> strategies{{1, 16}, {1, 16}};
  const std::vector<int> partition{0, 3, 10};
  InterStagePlan plan;
  plan.ns_idx = 1;
  plan.device_groups = &groups;
  plan.batches = 128;
  plan.gbs = 128;
  plan.num_stage = 1;
  CostTerms one, two;
  REQUIRE(cost_model.cost(plan, layout, strategies.data(), partition.data(), &one));
  CHECK(one.total == 4405.960933566093);  // the reference's cost of plan 88
  plan.num_stage = 2;
  REQUIRE(cost_model.cost(plan, layout, strategies.data(), partition.data(), &two));
  CHECK(one.total != two.total);
  CHECK(one.pp == 0.0);
  CHECK(two.pp > 0.0);
}
