// Balancers: the data load balancer, LayerComputeBalancer and LayerLoadBalancer::partition_layer.
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
// Profiles are the reference's synthetic sets (test::synthetic_profiles), the
// cluster is gen_hostfile.py 16 (32 GPUs: V100 nodes first in the hostfile).
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include <ostream>
#include <string>
#include <vector>

#include "metis/intra_stage.h"
#include "metis/layer_balancer.h"
#include "sim/analytic_profiles.h"
#include "sim/data_load_balancer.h"
#include "sim/rank_layout.h"
#include "tests/fixtures.h"

using namespace hetplan;

namespace {

// Failure messages print doubles with enough digits to tell them apart.
[[maybe_unused]] const bool kFullPrecision = (Catch::StringMaker<double>::precision = 17, true);

// Profile (and cluster) type indices: types sorted by name.
constexpr int A100 = 0, V100 = 1;

struct DataCase {
  std::vector<int> rank_types;
  Strategy strategy;
  int bs;
  std::vector<int> result;
};

// partition_data(bs) for dp groups of a stage; replica i's speed is that of its first rank.
const std::vector<DataCase> kDataCases = {
    {{0, 0, 0, 0, 1, 1, 1, 1}, {8, 1}, 128, {25, 25, 25, 25, 7, 7, 7, 7}},
    {{0, 0, 0, 0, 1, 1, 1, 1}, {4, 2}, 64, {25, 25, 7, 7}},
    {{0, 0, 0, 0, 1, 1, 1, 1}, {2, 4}, 7, {5, 2}},
    {{0, 0, 0, 0, 1, 1, 1, 1}, {8, 1}, 5, {1, 1, 1, 1, 1, 0, 0, 0}},
    {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {4, 4}, 16, {3, 2, 2, 9}},
    {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {16, 1}, 3, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0}},
};

// LayerLoadBalancer.norm_layer_duration (A100 tp1_bs1 layer times over their sum).
const std::vector<double> kLcDemand10 = {0.0012214807407832581, 0.12463081172581232, 0.12463081172581232,
                                         0.12463081172581232, 0.12463081172581232, 0.12463081172581232,
                                         0.12463081172581232, 0.12463081172581232, 0.12463081172581232,
                                         0.0017320254527182226};
const std::vector<double> kLcDemand20 = {0.000543772571268725, 0.05548250962024681, 0.05548250962024681,
                                         0.05548250962024681, 0.05548250962024681, 0.05548250962024681,
                                         0.05548250962024681, 0.05548250962024681, 0.05548250962024681,
                                         0.05548250962024681, 0.05548250962024681, 0.05548250962024681,
                                         0.05548250962024681, 0.05548250962024681, 0.05548250962024681,
                                         0.05548250962024681, 0.05548250962024681, 0.05548250962024681,
                                         0.05548250962024681, 0.0007710542642887114};

struct ComputeCase {
  int num_layers;
  std::vector<double> capacity;
  std::vector<int> partition;
};

// The same ten stage capacities with the 10- and 20-layer demands.
const std::vector<ComputeCase> kComputeCases = {
    {10, {1.0}, {0, 10}},  // [1.0]
    {10, {0.5, 0.5}, {0, 5, 10}},  // [0.5,0.5]
    {10, {0.3, 0.7}, {0, 3, 10}},  // [0.3,0.7]
    {10, {0.7, 0.3}, {0, 7, 10}},  // [0.7,0.3]
    {10, {0.25, 0.25, 0.25, 0.25}, {0, 3, 5, 7, 10}},  // [0.25]*4
    {10, {0.1, 0.2, 0.3, 0.4}, {0, 2, 4, 6, 10}},  // [0.1,0.2,0.3,0.4]
    {10, {0.05, 0.05, 0.05, 0.85}, {0, 1, 1, 1, 9}},  // [0.05]*3+[0.85]
    {10, {0.14285714285714285, 0.14285714285714285, 0.14285714285714285, 0.14285714285714285, 0.14285714285714285,
          0.14285714285714285, 0.14285714285714285}, {0, 2, 4, 5, 6, 7, 8, 10}},  // [1/7]*7
    {10, {0.07692307692307693, 0.07692307692307693, 0.07692307692307693, 0.07692307692307693, 0.07692307692307693,
          0.07692307692307693, 0.07692307692307693, 0.07692307692307693, 0.07692307692307693, 0.07692307692307693,
          0.07692307692307693, 0.07692307692307693, 0.07692307692307693}, {0, 1, 2, 3, 4, 4, 5, 6, 7, 7, 8, 9, 9,
                                                                           10}},  // [1/13]*13
    {10, {0.9, 0.05, 0.05}, {0, 8, 8, 9}},  // [0.9,0.05,0.05]
    {20, {1.0}, {0, 20}},  // [1.0]
    {20, {0.5, 0.5}, {0, 10, 20}},  // [0.5,0.5]
    {20, {0.3, 0.7}, {0, 6, 20}},  // [0.3,0.7]
    {20, {0.7, 0.3}, {0, 14, 20}},  // [0.7,0.3]
    {20, {0.25, 0.25, 0.25, 0.25}, {0, 5, 10, 15, 20}},  // [0.25]*4
    {20, {0.1, 0.2, 0.3, 0.4}, {0, 3, 7, 12, 20}},  // [0.1,0.2,0.3,0.4]
    {20, {0.05, 0.05, 0.05, 0.85}, {0, 2, 3, 4, 20}},  // [0.05]*3+[0.85]
    {20, {0.14285714285714285, 0.14285714285714285, 0.14285714285714285, 0.14285714285714285, 0.14285714285714285,
          0.14285714285714285, 0.14285714285714285}, {0, 3, 6, 8, 11, 14, 17, 20}},  // [1/7]*7
    {20, {0.07692307692307693, 0.07692307692307693, 0.07692307692307693, 0.07692307692307693, 0.07692307692307693,
          0.07692307692307693, 0.07692307692307693, 0.07692307692307693, 0.07692307692307693, 0.07692307692307693,
          0.07692307692307693, 0.07692307692307693, 0.07692307692307693}, {0, 2, 3, 5, 7, 8, 9, 11, 12, 14, 15, 17,
                                                                           18, 20}},  // [1/13]*13
    {20, {0.9, 0.05, 0.05}, {0, 17, 18, 20}},  // [0.9,0.05,0.05]
};

// One try of partition_layer: the compute split, its memory demand and, when
// it did not fit, what _adj_compute_performance returned.
struct Attempt {
  std::vector<double> share;
  std::vector<int> layer_partition;
  std::vector<double> memory_demand;
  bool adjusted;     // adj_compute_performance was called
  bool adjusted_ok;  // ... and did not return None
  std::vector<double> adjusted_share;
};

struct PartitionCase {
  int call_index;  // index among the 226 partition_layer calls of the row-1 search (base mode)
  const char* note;
  int ns_idx;  // 0: (A100, V100), 1: (V100, A100)
  std::vector<int> device_groups;
  int num_stage, batches;
  std::vector<Strategy> strategies;
  std::vector<double> compute_performance;  // StagePerformance.get_intra_stage_compute_performance
  std::vector<double> memory_capacity;      // get_device_group_memory_capacity
  bool ok;
  std::vector<int> layer_partition;
  int num_repartition;
  std::vector<double> memory_state;
  std::vector<double> failed_memory_stage;
  int new_partition_count;
  std::vector<Attempt> trace;
};

const std::vector<PartitionCase> kPartitionCases = {
    {0, "hetero [32], fits first time",
     0, {32}, 1, 128,
     {{1, 32}},
     {1.0},
     {1572864.0},
     true, {0, 10}, 1,
     {1307263.999},
     {}, 0,
     {
         {{1.0},
          {0, 10},
          {265600.001},
          false, false, {}}}},
    {1, "hetero [32] dp=2, fits first time",
     0, {32}, 1, 64,
     {{2, 16}},
     {1.0},
     {1572864.0},
     true, {0, 10}, 1,
     {1307263.999},
     {}, 0,
     {
         {{1.0},
          {0, 10},
          {265600.001},
          false, false, {}}}},
    {4, "hetero [32], _adj_compute_performance returns None -> fail (num_repartition -1)",
     0, {32}, 1, 8,
     {{16, 2}},
     {1.0},
     {1572864.0},
     false, {}, -1,
     {},
     {-551936.0010000002}, 1,
     {
         {{1.0},
          {0, 10},
          {2124800.001},
          true, false, {}}}},
    {5, "hetero [32], adj None -> fail",
     0, {32}, 1, 8,
     {{8, 4}},
     {1.0},
     {1572864.0},
     false, {}, -1,
     {},
     {-1614336.0010000002}, 1,
     {
         {{1.0},
          {0, 10},
          {3187200.001},
          true, false, {}}}},
    {26, "homogeneous [16,16], fits first time",
     0, {16, 16}, 2, 128,
     {{1, 16}, {1, 16}},
     {0.7777777777777778, 0.2222222222222222},
     {1310720.0, 262144.0},
     true, {0, 7, 10}, 1,
     {1147239.999, 160023.999},
     {}, 0,
     {
         {{0.7777777777777778, 0.2222222222222222},
          {0, 7, 10},
          {163480.001, 102120.001},
          false, false, {}}}},
    {70, "7 stages with hetero stage 3, repartition 2",
     0, {4, 4, 4, 8, 4, 4, 4}, 7, 8,
     {{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}},
     {0.20059862743701, 0.20059862743701, 0.20059862743701, 0.22626243702867543, 0.05731389355343144,
      0.05731389355343144, 0.05731389355343144},
     {327680.0, 327680.0, 327680.0, 393216.0, 65536.0, 65536.0, 65536.0},
     true, {0, 3, 5, 7, 8, 8, 9, 10}, 2,
     {247119.999, 286219.999, 286219.999, 144455.999, 65535.999, 44805.998999999996, 4875.999000000003},
     {267849.999, 286219.999, 286219.999, -104304.00099999999, 65535.999, 65535.999, 44805.998999999996}, 1,
     {
         {{0.20059862743701, 0.20059862743701, 0.20059862743701, 0.22626243702867543, 0.05731389355343144,
           0.05731389355343144, 0.05731389355343144},
          {0, 2, 4, 6, 8, 8, 8, 9},
          {59830.001, 41460.001, 41460.001, 497520.001, 0.001, 0.001, 20730.001},
          true, true, {0.2229967673043395, 0.2171898421535504, 0.2128884161159288, 0.16094430220665817,
                       0.05991490703045129, 0.05972223936548685, 0.05954384337940868}},
         {{0.2229967673043395, 0.2171898421535504, 0.2128884161159288, 0.16094430220665817, 0.05991490703045129,
           0.05972223936548685, 0.05954384337940868},
          {0, 3, 5, 7, 8, 8, 9, 10},
          {80560.001, 41460.001, 41460.001, 248760.001, 0.001, 20730.001, 60660.001},
          false, false, {}}}},
    {71, "repartition 2; result drops a layer (ends at 9)",
     0, {4, 4, 4, 8, 4, 4, 4}, 7, 8,
     {{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {2, 2}},
     {0.20154796978882072, 0.20154796978882072, 0.20154796978882072, 0.22733323455525709, 0.05758513422537736,
      0.05758513422537736, 0.05285258762752592},
     {327680.0, 327680.0, 327680.0, 393216.0, 65536.0, 65536.0, 65536.0},
     true, {0, 3, 5, 7, 8, 8, 8, 9}, 2,
     {247119.999, 286219.999, 286219.999, 144455.999, 65535.999, 65535.999, 44805.998999999996},
     {267849.999, 286219.999, 286219.999, -104304.00099999999, 65535.999, 65535.999, 44805.998999999996}, 1,
     {
         {{0.20154796978882072, 0.20154796978882072, 0.20154796978882072, 0.22733323455525709, 0.05758513422537736,
           0.05758513422537736, 0.05285258762752592},
          {0, 2, 4, 6, 8, 8, 8, 9},
          {59830.001, 41460.001, 41460.001, 497520.001, 0.001, 0.001, 20730.001},
          true, true, {0.224182704506104, 0.2182784971129581, 0.21391438574376342, 0.16170597861650987,
                       0.06019675447086084, 0.06000211622691448, 0.05490560525159941}},
         {{0.224182704506104, 0.2182784971129581, 0.21391438574376342, 0.16170597861650987, 0.06019675447086084,
           0.06000211622691448, 0.05490560525159941},
          {0, 3, 5, 7, 8, 8, 8, 9},
          {80560.001, 41460.001, 41460.001, 248760.001, 0.001, 0.001, 20730.001},
          false, false, {}}}},
    {95, "repartition 3",
     0, {4, 4, 4, 8, 4, 4, 4}, 7, 1,
     {{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}},
     {0.1946863889308981, 0.1946863889308981, 0.1946863889308981, 0.24906678555224995, 0.05562468255168518,
      0.05562468255168518, 0.05562468255168518},
     {327680.0, 327680.0, 327680.0, 393216.0, 65536.0, 65536.0, 65536.0},
     true, {0, 3, 5, 7, 7, 8, 9, 10}, 3,
     {247119.999, 286219.999, 286219.999, 393215.999, 44805.998999999996, 44805.998999999996, 4875.999000000003},
     {267849.999, 286219.999, 286219.999, -601824.0009999999, 65535.999, 44805.998999999996, 4875.999000000003}, 2,
     {
         {{0.1946863889308981, 0.1946863889308981, 0.1946863889308981, 0.24906678555224995, 0.05562468255168518,
           0.05562468255168518, 0.05562468255168518},
          {0, 2, 4, 6, 8, 8, 9, 10},
          {59830.001, 41460.001, 41460.001, 995040.0009999999, 0.001, 20730.001, 60660.001},
          true, true, {0.2553719463374355, 0.23924294989744382, 0.22740634218521016, 0.08858271078987726,
                       0.06249093100069903, 0.061970263217200824, 0.0597670570341657}},
         {{0.2553719463374355, 0.23924294989744382, 0.22740634218521016, 0.08858271078987726, 0.06249093100069903,
           0.061970263217200824, 0.0597670570341657},
          {0, 3, 5, 7, 8, 8, 9, 10},
          {80560.001, 41460.001, 41460.001, 497520.001, 0.001, 20730.001, 60660.001},
          true, true, {0.26257797013708856, 0.24409151428199768, 0.23079836611970359, 0.0630103819391115,
                       0.06318915535596463, 0.06261492474885011, 0.06034628379018124}},
         {{0.26257797013708856, 0.24409151428199768, 0.23079836611970359, 0.0630103819391115, 0.06318915535596463,
           0.06261492474885011, 0.06034628379018124},
          {0, 3, 5, 7, 7, 8, 9, 10},
          {80560.001, 41460.001, 41460.001, 0.001, 20730.001, 20730.001, 60660.001},
          false, false, {}}}},
    {96, "fails after 3 attempts (num_repartition -1, new_partition_count 3)",
     0, {4, 4, 4, 8, 4, 4, 4}, 7, 1,
     {{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {2, 2}},
     {0.19558047133786488, 0.19558047133786488, 0.19558047133786488, 0.25021060578716675, 0.0558801346679614,
      0.0558801346679614, 0.0512877108633157},
     {327680.0, 327680.0, 327680.0, 393216.0, 65536.0, 65536.0, 65536.0},
     false, {}, -1,
     {},
     {267849.999, 286219.999, 286219.999, -601824.0009999999, 65535.999, 44805.998999999996, 4875.999000000003}, 3,
     {
         {{0.19558047133786488, 0.19558047133786488, 0.19558047133786488, 0.25021060578716675, 0.0558801346679614,
           0.0558801346679614, 0.0512877108633157},
          {0, 2, 4, 6, 8, 8, 9, 10},
          {59830.001, 41460.001, 41460.001, 995040.0009999999, 0.001, 20730.001, 60660.001},
          true, true, {0.25677560284481205, 0.2404464188135438, 0.22847930619804308, 0.08898952013958876,
                       0.0627736254371783, 0.06224869875184974, 0.05510210271017753}},
         {{0.25677560284481205, 0.2404464188135438, 0.22847930619804308, 0.08898952013958876, 0.0627736254371783,
           0.06224869875184974, 0.05510210271017753},
          {0, 3, 5, 7, 8, 8, 9, 10},
          {80560.001, 41460.001, 41460.001, 497520.001, 0.001, 20730.001, 60660.001},
          true, true, {0.2640579146856259, 0.2453325758332936, 0.2318898263665248, 0.06329975231706851,
                       0.06347430129843265, 0.06289536469127176, 0.05563518956792716}},
         {{0.2640579146856259, 0.2453325758332936, 0.2318898263665248, 0.06329975231706851, 0.06347430129843265,
           0.06289536469127176, 0.05563518956792716},
          {0, 3, 5, 7, 8, 8, 9, 10},
          {80560.001, 41460.001, 41460.001, 497520.001, 0.001, 20730.001, 60660.001},
          true, true, {0.2692841222383357, 0.24879948112545866, 0.2342960274722213, 0.04502618552293653,
                       0.06396751910391126, 0.06335048532764398, 0.05601034985243196}}}},
    {128, "homogeneous [4]*8, fits first time",
     0, {4, 4, 4, 4, 4, 4, 4, 4}, 8, 128,
     {{1, 4}, {1, 4}, {1, 4}, {1, 4}, {1, 4}, {1, 4}, {1, 4}, {1, 4}},
     {0.19444444444444445, 0.19444444444444445, 0.19444444444444445, 0.19444444444444445, 0.05555555555555555,
      0.05555555555555555, 0.05555555555555555, 0.05555555555555555},
     {327680.0, 327680.0, 327680.0, 327680.0, 65536.0, 65536.0, 65536.0, 65536.0},
     true, {0, 2, 4, 6, 7, 8, 8, 9, 10}, 1,
     {267849.999, 286219.999, 286219.999, 306949.999, 44805.998999999996, 65535.999, 44805.998999999996,
      4875.999000000003},
     {}, 0,
     {
         {{0.19444444444444445, 0.19444444444444445, 0.19444444444444445, 0.19444444444444445, 0.05555555555555555,
           0.05555555555555555, 0.05555555555555555, 0.05555555555555555},
          {0, 2, 4, 6, 7, 8, 8, 9, 10},
          {59830.001, 41460.001, 41460.001, 20730.001, 20730.001, 0.001, 20730.001, 60660.001},
          false, false, {}}}},
    {136, "node_sequence (V100,A100), num_stage field 1 < len(device_groups) 2, fits",
     1, {16, 16}, 1, 128,
     {{1, 16}, {1, 16}},
     {0.2222222222222222, 0.7777777777777778},
     {262144.0, 1310720.0},
     true, {0, 3, 10}, 1,
     {181583.999, 1125679.999},
     {}, 0,
     {
         {{0.2222222222222222, 0.7777777777777778},
          {0, 3, 10},
          {80560.001, 185040.001},
          false, false, {}}}},
    {184, "node_sequence (V100,A100), hetero stage, fits",
     1, {4, 4, 4, 8, 4, 4, 4}, 7, 128,
     {{1, 4}, {1, 4}, {1, 4}, {1, 8}, {1, 4}, {1, 4}, {1, 4}},
     {0.06451612903225806, 0.06451612903225806, 0.06451612903225806, 0.12903225806451613, 0.22580645161290322,
      0.22580645161290322, 0.22580645161290322},
     {65536.0, 65536.0, 65536.0, 393216.0, 327680.0, 327680.0, 327680.0},
     true, {0, 1, 2, 3, 4, 6, 8, 10}, 1,
     {26435.999000000003, 44805.998999999996, 44805.998999999996, 372485.999, 286219.999, 286219.999, 246289.999},
     {}, 0,
     {
         {{0.06451612903225806, 0.06451612903225806, 0.06451612903225806, 0.12903225806451613, 0.22580645161290322,
           0.22580645161290322, 0.22580645161290322},
          {0, 1, 2, 3, 4, 6, 8, 10},
          {39100.001, 20730.001, 20730.001, 20730.001, 41460.001, 41460.001, 81390.001},
          false, false, {}}}},
    {191, "node_sequence (V100,A100), fails after 3 attempts",
     1, {4, 4, 4, 8, 4, 4, 4}, 7, 1,
     {{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}},
     {0.05562468255168519, 0.05562468255168519, 0.05562468255168519, 0.24906678555225004, 0.19468638893089815,
      0.19468638893089815, 0.19468638893089815},
     {65536.0, 65536.0, 65536.0, 393216.0, 327680.0, 327680.0, 327680.0},
     false, {}, -1,
     {},
     {26435.999000000003, 44805.998999999996, 44805.998999999996, -601824.0009999999, 286219.999, 306949.999,
      246289.999}, 3,
     {
         {{0.05562468255168519, 0.05562468255168519, 0.05562468255168519, 0.24906678555225004, 0.19468638893089815,
           0.19468638893089815, 0.19468638893089815},
          {0, 1, 2, 3, 5, 7, 8, 10},
          {39100.001, 20730.001, 20730.001, 995040.0009999999, 41460.001, 20730.001, 81390.001},
          true, true, {0.07258544601230758, 0.0713290931633726, 0.07016580348843279, 0.0885827107898773,
                       0.24181039196665424, 0.22959305784627304, 0.22054318072006474}},
         {{0.07258544601230758, 0.0713290931633726, 0.07016580348843279, 0.0885827107898773, 0.24181039196665424,
           0.22959305784627304, 0.22054318072006474},
          {0, 2, 2, 3, 4, 6, 8, 10},
          {59830.001, 0.001, 20730.001, 497520.001, 41460.001, 41460.001, 81390.001},
          true, true, {0.07463414759638551, 0.07318104575472333, 0.07184413152006872, 0.06301038193911154,
                       0.24714643507757697, 0.2333073127607782, 0.22320691460486516}},
         {{0.07463414759638551, 0.07318104575472333, 0.07184413152006872, 0.06301038193911154, 0.24714643507757697,
           0.2333073127607782, 0.22320691460486516},
          {0, 2, 2, 3, 4, 6, 8, 10},
          {59830.001, 0.001, 20730.001, 497520.001, 41460.001, 41460.001, 81390.001},
          true, true, {0.07610449096290621, 0.07450622467794062, 0.07304198826013865, 0.04482035147389525,
                       0.2509464738945699, 0.2359343605720928, 0.22508515899710424}}}},
    {192, "node_sequence (V100,A100), repartition 2",
     1, {4, 4, 4, 8, 4, 4, 4}, 7, 1,
     {{4, 1}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {4, 1}},
     {0.05679155767217861, 0.05679155767217861, 0.05679155767217861, 0.2333139714255888, 0.1987704518526251,
      0.1987704518526251, 0.1987704518526251},
     {65536.0, 65536.0, 65536.0, 393216.0, 327680.0, 327680.0, 327680.0},
     true, {0, 1, 2, 3, 4, 6, 8, 10}, 2,
     {26435.999000000003, 44805.998999999996, 44805.998999999996, 144455.999, 286219.999, 286219.999, 246289.999},
     {26435.999000000003, 44805.998999999996, 44805.998999999996, -104304.00099999999, 286219.999, 306949.999,
      246289.999}, 1,
     {
         {{0.05679155767217861, 0.05679155767217861, 0.05679155767217861, 0.2333139714255888, 0.1987704518526251,
           0.1987704518526251, 0.1987704518526251},
          {0, 1, 2, 3, 5, 7, 8, 10},
          {39100.001, 20730.001, 20730.001, 497520.001, 41460.001, 20730.001, 81390.001},
          true, true, {0.06339046749643745, 0.06290165936130716, 0.06244905923618653, 0.16596017800955884,
                       0.21710494766191002, 0.21235155985950283, 0.20883053185771971}},
         {{0.06339046749643745, 0.06290165936130716, 0.06244905923618653, 0.16596017800955884, 0.21710494766191002,
           0.21235155985950283, 0.20883053185771971},
          {0, 1, 2, 3, 4, 6, 8, 10},
          {39100.001, 20730.001, 20730.001, 248760.001, 41460.001, 41460.001, 81390.001},
          false, false, {}}}},
};

}  // namespace

TEST_CASE("data load balancer splits a micro-batch over heterogeneous replicas", "[balancers][data_load_balancer]") {
  REQUIRE_SHARED_DATA();
  const ProfileSet& profiles = test::synthetic_profiles(10);
  for (std::size_t i = 0; i < kDataCases.size(); ++i) {
    const DataCase& c = kDataCases[i];
    INFO("case " << i << ": dp " << c.strategy.dp << " tp " << c.strategy.tp << " bs " << c.bs);
    CHECK(partition_data(profiles, c.rank_types, c.strategy, c.bs) == c.result);
  }
}

TEST_CASE("data load balancer: the remainder goes as a stable sort by fractional part would give it",
          "[balancers][data_load_balancer]") {
  // Its reference form (Metis's): floor each replica's proportional share, then hand the remaining samples one
  // by one to the replicas in a stable sort by fractional part, largest first. partition_data groups the
  // replicas by their (few) distinct fractional parts instead; the two must agree exactly.
  const auto dir = test::scratch_dir("balancer-analytic");
  AnalyticOptions o;
  o.model.num_layers = 6;
  o.max_bs = 1;
  o.max_tp = 2;
  o.device_types = {"A100", "H100", "V100", "A10040GB"};
  generate_analytic_profiles(o, dir.string());
  const ProfileSet profiles = ProfileSet::load(dir.string(), 6);
  const int n_types = static_cast<int>(profiles.device_types().size());
  REQUIRE(n_types == 4);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int dp = 1 + static_cast<int>(rng() % 200), tp = 1 + static_cast<int>(rng() % 2);
    const int bs = dp + static_cast<int>(rng() % (4 * dp));
    const int used = 1 + static_cast<int>(rng() % n_types);
    std::vector<int> types(dp);
    for (int& t : types) t = static_cast<int>(rng() % used);
    if (trial % 3 == 0) std::sort(types.begin(), types.end());  // runs of one type, as stages have
    std::vector<int> got(dp);
    REQUIRE(partition_data(profiles, types.data(), Strategy{dp, tp}, bs, got.data()));
    // The reference.
    std::vector<double> share(dp), frac(dp);
    double total = 0;
    for (int i = 0; i < dp; ++i) total += share[i] = 1.0 / profiles.find(types[i], tp, 1)->total_layer_ms;
    std::vector<int> want(dp), order(dp);
    long assigned = 0;
    for (int i = 0; i < dp; ++i) {
      const double w = bs * (share[i] / total);
      want[i] = static_cast<int>(w);
      frac[i] = w - want[i];
      assigned += want[i];
      order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return frac[a] > frac[b]; });
    for (long i = 0; i < bs - assigned; ++i) want[order[i]] += 1;
    INFO("trial " << trial << ": dp " << dp << ", tp " << tp << ", bs " << bs << ", types used " << used);
    REQUIRE(got == want);
  }
}

TEST_CASE("layer compute balancer: normalised layer demand", "[balancers][layer_compute_balancer]") {
  REQUIRE_SHARED_DATA();
  CHECK(test::synthetic_profiles(10).model().norm_layer_duration == kLcDemand10);
  CHECK(test::synthetic_profiles(20).model().norm_layer_duration == kLcDemand20);
}

TEST_CASE("layer compute balancer: partitions of 10 and 20 layers", "[balancers][layer_compute_balancer]") {
  LayerComputeBalancer b10(kLcDemand10, 7);
  LayerComputeBalancer b20(kLcDemand20, 7);
  CHECK(b10.num_layers() == 10);
  CHECK(b20.num_layers() == 20);
  for (std::size_t i = 0; i < kComputeCases.size(); ++i) {
    const ComputeCase& c = kComputeCases[i];
    INFO("case " << i << ": " << c.num_layers << " layers, " << c.capacity.size() << " stages");
    LayerComputeBalancer& b = c.num_layers == 10 ? b10 : b20;
    const int stages = static_cast<int>(c.capacity.size());
    std::vector<int> partition(stages + 1, -1);
    b.run(c.capacity.data(), stages, partition.data());
    CHECK(partition == c.partition);
  }
}

TEST_CASE("layer compute balancer: a fresh balancer gives the same partitions", "[balancers][layer_compute_balancer]") {
  // Scratch space is reused between calls; each call must not depend on the previous one.
  for (std::size_t i = kComputeCases.size(); i-- > 0;) {
    const ComputeCase& c = kComputeCases[i];
    INFO("case " << i);
    LayerComputeBalancer b(c.num_layers == 10 ? kLcDemand10 : kLcDemand20);
    const int stages = static_cast<int>(c.capacity.size());
    std::vector<int> partition(stages + 1, -1);
    b.run(c.capacity.data(), stages, partition.data());
    CHECK(partition == c.partition);
  }
}

TEST_CASE("partition_layer reproduces the reference's calls in the row-1 search", "[balancers][partition_layer]") {
  REQUIRE_SHARED_DATA();
  const ProfileSet& profiles = test::synthetic_profiles(10);
  const Cluster cluster = test::table1_cluster(16);
  REQUIRE(cluster.device_types() == std::vector<std::string>{"A100", "V100"});
  REQUIRE(profiles.device_types() == cluster.device_types());
  const RankLayout layouts[2] = {RankLayout(cluster, {A100, V100}), RankLayout(cluster, {V100, A100})};
  const IntraStageSearch search(profiles, IntraStageOptions{128, 128, false});
  LayerLoadBalancer balancer(profiles, profiles.model().norm_layer_duration);
  LayerComputeBalancer compute(profiles.model().norm_layer_duration);

  for (const PartitionCase& c : kPartitionCases) {
    INFO("call " << c.call_index << ": " << c.note);
    const RankLayout& layout = layouts[c.ns_idx];
    const std::vector<int>& rank_types = layout.rank_types();  // profile types equal cluster types here
    const std::vector<int> groups = c.device_groups;
    InterStagePlan plan;
    plan.ns_idx = c.ns_idx;
    plan.device_groups = &groups;
    plan.num_stage = c.num_stage;
    plan.batches = c.batches;
    plan.gbs = 128;
    const int stages = plan.num_stages();
    REQUIRE(static_cast<int>(c.strategies.size()) == stages);

    // The inputs the search hands to partition_layer.
    std::vector<double> share(stages), capacity(stages);
    search.compute_share(plan, rank_types, c.strategies.data(), share.data());
    CHECK(share == c.compute_performance);
    int begin = 0;
    for (int s = 0; s < stages; ++s) {
      capacity[s] = layout.memory_capacity_mb(begin, begin + groups[s]);
      begin += groups[s];
    }
    CHECK(capacity == c.memory_capacity);

    // Its five outputs.
    LayerPartitionResult out;
    balancer.partition_layer(plan, rank_types, c.strategies.data(), c.compute_performance.data(),
                             c.memory_capacity.data(), &out);
    CHECK(out.ok == c.ok);
    CHECK(out.num_repartition == c.num_repartition);
    if (c.ok) {
      CHECK(out.layer_partition == c.layer_partition);
      CHECK(out.memory_state == c.memory_state);
    }
    CHECK(out.failed_memory_stage == c.failed_memory_stage);
    CHECK(out.new_partition_count == c.new_partition_count);

    // Each attempt inside it.
    for (std::size_t a = 0; a < c.trace.size(); ++a) {
      const Attempt& t = c.trace[a];
      INFO("attempt " << a + 1);
      std::vector<int> partition(stages + 1, -1);
      compute.run(t.share.data(), stages, partition.data());
      CHECK(partition == t.layer_partition);
      std::vector<double> demand(stages);
      balancer.stage_memory_demand(plan, rank_types, c.strategies.data(), t.layer_partition.data(), demand.data());
      CHECK(demand == t.memory_demand);
      if (t.adjusted) {
        std::vector<double> adjusted(stages);
        const bool ok = LayerLoadBalancer::adjust_compute_share(t.share.data(), c.memory_capacity.data(),
                                                                t.memory_demand.data(), stages, adjusted.data());
        CHECK(ok == t.adjusted_ok);
        if (ok && t.adjusted_ok) CHECK(adjusted == t.adjusted_share);
        if (ok && a + 1 < c.trace.size()) CHECK(c.trace[a + 1].share == t.adjusted_share);
      }
    }
    CHECK(c.trace.front().share == c.compute_performance);
  }
}
