// IntraStageSearch (the reference's IntraStagePlanGenerator DFS) and MetisSearch on row 1.
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
// Row 1: 10 layers (synthetic profiles), gen_hostfile.py 16 (32 GPUs, V100
// nodes first in the hostfile), gbs 128, max profiled tp and batch size 128,
// variance 1, max_permute_len 128; both modes (base Metis and --use_strat).
#include <catch2/catch.hpp>

#include <ostream>
#include <string>
#include <vector>

#include "metis/inter_stage.h"
#include "metis/intra_stage.h"
#include "metis/metis_search.h"
#include "sim/rank_layout.h"
#include "tests/fixtures.h"

using namespace hetplan;

namespace {

// Failure messages print doubles with enough digits to tell them apart.
[[maybe_unused]] const bool kFullPrecision = (Catch::StringMaker<double>::precision = 17, true);

// What the reference's has_next/next pair yields; count is generator.count
// after the has_next that returned True.
struct Yield {
  std::vector<Strategy> strategies;
  std::vector<int> layer_partition;
  int num_repartition;
  long long count;
};

struct PlanYields {
  int plan_idx;
  int ns_idx;
  std::vector<int> device_groups;
  int num_stage, batches;
  std::vector<Yield> yields;
};

// The first 40 inter-stage plans: the yields are the same in both modes.
const std::vector<PlanYields> kFirst40 = {
    {0, 0, {32}, 1, 128,
     {{{{1, 32}}, {0, 10}, 1, 5}}},
    {1, 0, {32}, 1, 64,
     {{{{2, 16}}, {0, 10}, 1, 4}}},
    {2, 0, {32}, 1, 32,
     {{{{4, 8}}, {0, 10}, 1, 3}}},
    {3, 0, {32}, 1, 16,
     {{{{8, 4}}, {0, 10}, 1, 2}}},
    {4, 0, {32}, 1, 8,
     {{{{2, 16}}, {0, 10}, 1, 7}}},
    {5, 0, {32}, 1, 4,
     {{{{1, 32}}, {0, 10}, 1, 10}}},
    {6, 0, {32}, 1, 2,
     {{{{1, 32}}, {0, 10}, 1, 10}}},
    {7, 0, {32}, 1, 1,
     {{{{1, 32}}, {0, 10}, 1, 10}}},
    {8, 0, {16, 16}, 2, 128,
     {{{{1, 16}, {1, 16}}, {0, 7, 10}, 1, 8}}},
    {9, 0, {16, 16}, 2, 64,
     {{{{2, 8}, {2, 8}}, {0, 7, 10}, 1, 6}}},
    {10, 0, {16, 16}, 2, 32,
     {{{{4, 4}, {4, 4}}, {0, 7, 10}, 1, 4}}},
    {11, 0, {16, 16}, 2, 16,
     {{{{8, 2}, {8, 2}}, {0, 7, 10}, 1, 2}}},
    {12, 0, {16, 16}, 2, 8,
     {{{{16, 1}, {16, 1}}, {0, 7, 10}, 1, 0}}},
    {13, 0, {16, 16}, 2, 4,
     {{{{16, 1}, {16, 1}}, {0, 7, 10}, 1, 0}}},
    {14, 0, {16, 16}, 2, 2,
     {{{{16, 1}, {16, 1}}, {0, 7, 10}, 1, 0}}},
    {15, 0, {16, 16}, 2, 1,
     {{{{16, 1}, {16, 1}}, {0, 7, 10}, 1, 0}}},
    {16, 0, {8, 8, 8, 8}, 4, 128,
     {{{{1, 8}, {1, 8}, {1, 8}, {1, 8}}, {0, 4, 7, 8, 10}, 1, 12}}},
    {17, 0, {8, 8, 8, 8}, 4, 64,
     {{{{2, 4}, {2, 4}, {2, 4}, {2, 4}}, {0, 4, 7, 8, 10}, 1, 8}}},
    {18, 0, {8, 8, 8, 8}, 4, 32,
     {{{{4, 2}, {4, 2}, {4, 2}, {4, 2}}, {0, 4, 7, 8, 10}, 1, 4}}},
    {19, 0, {8, 8, 8, 8}, 4, 16,
     {{{{8, 1}, {8, 1}, {8, 1}, {8, 1}}, {0, 4, 7, 8, 10}, 1, 0}}},
    {20, 0, {8, 8, 8, 8}, 4, 8,
     {{{{8, 1}, {8, 1}, {8, 1}, {8, 1}}, {0, 4, 7, 8, 10}, 1, 0}}},
    {21, 0, {8, 8, 8, 8}, 4, 4,
     {{{{8, 1}, {8, 1}, {8, 1}, {8, 1}}, {0, 4, 7, 8, 10}, 1, 0}}},
    {22, 0, {8, 8, 8, 8}, 4, 2,
     {{{{8, 1}, {8, 1}, {8, 1}, {8, 1}}, {0, 4, 7, 8, 10}, 1, 0}}},
    {23, 0, {8, 8, 8, 8}, 4, 1,
     {{{{8, 1}, {8, 1}, {8, 1}, {8, 1}}, {0, 4, 7, 8, 10}, 1, 0}}},
    {24, 0, {8, 4, 4, 4, 4, 4, 4}, 7, 128,
     {{{{1, 8}, {1, 4}, {1, 4}, {1, 4}, {1, 4}, {1, 4}, {1, 4}}, {0, 4, 6, 7, 8, 8, 9, 10}, 1, 15}}},
    {25, 0, {8, 4, 4, 4, 4, 4, 4}, 7, 64,
     {{{{2, 4}, {2, 2}, {2, 2}, {2, 2}, {2, 2}, {2, 2}, {2, 2}}, {0, 4, 6, 7, 8, 8, 9, 10}, 1, 8}}},
    {26, 0, {8, 4, 4, 4, 4, 4, 4}, 7, 32,
     {{{{4, 2}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 4, 6, 7, 8, 8, 8, 9}, 1, 1}}},
    {27, 0, {8, 4, 4, 4, 4, 4, 4}, 7, 16,
     {{{{8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 4, 6, 7, 8, 8, 9, 10}, 1, 0}}},
    {28, 0, {8, 4, 4, 4, 4, 4, 4}, 7, 8,
     {{{{8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 4, 6, 7, 8, 8, 9, 10}, 1, 0}}},
    {29, 0, {8, 4, 4, 4, 4, 4, 4}, 7, 4,
     {{{{8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 4, 6, 7, 8, 8, 9, 10}, 1, 0}}},
    {30, 0, {8, 4, 4, 4, 4, 4, 4}, 7, 2,
     {{{{8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 4, 6, 7, 8, 8, 9, 10}, 1, 0}}},
    {31, 0, {8, 4, 4, 4, 4, 4, 4}, 7, 1,
     {{{{8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 4, 6, 7, 8, 8, 9, 10}, 1, 0}}},
    {32, 0, {4, 8, 4, 4, 4, 4, 4}, 7, 128,
     {{{{1, 4}, {1, 8}, {1, 4}, {1, 4}, {1, 4}, {1, 4}, {1, 4}}, {0, 3, 6, 7, 8, 8, 9, 10}, 1, 15}}},
    {33, 0, {4, 8, 4, 4, 4, 4, 4}, 7, 64,
     {{{{2, 2}, {2, 4}, {2, 2}, {2, 2}, {2, 2}, {2, 2}, {2, 2}}, {0, 2, 5, 7, 8, 8, 9, 10}, 1, 8}}},
    {34, 0, {4, 8, 4, 4, 4, 4, 4}, 7, 32,
     {{{{4, 1}, {4, 2}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 6, 7, 8, 8, 8, 9}, 1, 1}}},
    {35, 0, {4, 8, 4, 4, 4, 4, 4}, 7, 16,
     {{{{4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 6, 7, 8, 8, 9, 10}, 1, 0}}},
    {36, 0, {4, 8, 4, 4, 4, 4, 4}, 7, 8,
     {{{{4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 6, 7, 8, 8, 9, 10}, 1, 0}}},
    {37, 0, {4, 8, 4, 4, 4, 4, 4}, 7, 4,
     {{{{4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 6, 7, 8, 8, 9, 10}, 1, 0}}},
    {38, 0, {4, 8, 4, 4, 4, 4, 4}, 7, 2,
     {{{{4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 6, 7, 8, 8, 9, 10}, 1, 0}}},
    {39, 0, {4, 8, 4, 4, 4, 4, 4}, 7, 1,
     {{{{4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 6, 7, 8, 8, 9, 10}, 1, 0}}},
};

// Every plan whose yields differ between the modes.
const std::vector<PlanYields> kModeDiffBase = {
    {52, 0, {4, 4, 4, 8, 4, 4, 4}, 7, 8,
     {{{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 1},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {2, 2}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {2, 2}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {2, 2}, {1, 4}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {1, 4}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {1, 4}, {1, 4}, {1, 4}}, {0, 2, 4, 6, 8, 8, 8, 9}, 1, 1}}},
    {53, 0, {4, 4, 4, 8, 4, 4, 4}, 7, 4,
     {{{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 1},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {2, 2}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {2, 2}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {2, 2}, {1, 4}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {1, 4}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {1, 4}, {1, 4}, {1, 4}}, {0, 2, 4, 6, 8, 8, 8, 9}, 1, 1}}},
    {54, 0, {4, 4, 4, 8, 4, 4, 4}, 7, 2,
     {{{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 1},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {2, 2}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {2, 2}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {2, 2}, {1, 4}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {1, 4}, {1, 4}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {1, 4}, {1, 4}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {2, 4}, {1, 4}, {1, 4}, {1, 4}}, {0, 2, 4, 6, 8, 8, 8, 9}, 1, 1}}},
    {55, 0, {4, 4, 4, 8, 4, 4, 4}, 7, 1,
     {{{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 7, 8, 9, 10}, 3, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {2, 2}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 6},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {2, 2}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {1, 4}, {4, 1}, {1, 4}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {1, 4}, {2, 2}, {1, 4}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {1, 4}, {1, 4}, {1, 4}}, {0, 3, 5, 7, 8, 8, 8, 9}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {2, 4}, {1, 4}, {1, 4}, {1, 4}}, {0, 2, 4, 6, 8, 8, 8, 9}, 1, 1}}},
    {143, 1, {4, 4, 4, 8, 4, 4, 4}, 7, 1,
     {{{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {4, 1}}, {0, 1, 2, 3, 4, 6, 8, 10}, 2, 5},
      {{{2, 2}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {4, 1}}, {0, 1, 2, 3, 4, 6, 8, 10}, 1, 1}}},
};

const std::vector<PlanYields> kModeDiffStrat = {
    {52, 0, {4, 4, 4, 8, 4, 4, 4}, 7, 8,
     {{{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 1},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {4, 1}}, {0, 2, 4, 6, 8, 8, 9, 10}, 1, 1}}},
    {53, 0, {4, 4, 4, 8, 4, 4, 4}, 7, 4,
     {{{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 1},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {4, 1}}, {0, 2, 4, 6, 8, 8, 8, 9}, 1, 1}}},
    {54, 0, {4, 4, 4, 8, 4, 4, 4}, 7, 2,
     {{{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 1},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {2, 4}, {4, 1}, {4, 1}, {4, 1}}, {0, 2, 4, 6, 8, 8, 9, 10}, 1, 1}}},
    {55, 0, {4, 4, 4, 8, 4, 4, 4}, 7, 1,
     {{{{4, 1}, {4, 1}, {4, 1}, {8, 1}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 7, 8, 9, 10}, 3, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {4, 1}}, {0, 3, 5, 7, 8, 8, 9, 10}, 2, 2},
      {{{4, 1}, {4, 1}, {4, 1}, {2, 4}, {4, 1}, {4, 1}, {4, 1}}, {0, 2, 4, 6, 8, 8, 9, 10}, 1, 1}}},
    {143, 1, {4, 4, 4, 8, 4, 4, 4}, 7, 1,
     {{{{4, 1}, {4, 1}, {4, 1}, {4, 2}, {4, 1}, {4, 1}, {4, 1}}, {0, 1, 2, 3, 4, 6, 8, 10}, 2, 5},
      {{{4, 1}, {4, 1}, {4, 1}, {2, 4}, {4, 1}, {4, 1}, {4, 1}}, {0, 1, 2, 3, 4, 6, 8, 10}, 1, 1}}},
};

// Sum of the counts of each of the 176 plans, by plan index.
const std::vector<long long> kSumCountsBase = {
    5, 4, 3, 2, 7, 10, 10, 10, 8, 6, 4, 2, 0, 0, 0, 0, 12, 8, 4, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0,
    0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 14, 14, 16, 19, 15, 8, 1, 0,
    0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 16, 8, 0, 0, 0, 0, 0, 0, 8, 6,
    4, 2, 0, 0, 0, 0, 8, 6, 4, 2, 0, 0, 0, 0, 12, 8, 4, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0,
    15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 6, 15, 8, 1, 0, 0, 0,
    0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 16, 8, 0, 0, 0, 0, 0, 0};
const std::vector<long long> kSumCountsStrat = {
    5, 4, 3, 2, 7, 10, 10, 10, 8, 6, 4, 2, 0, 0, 0, 0, 12, 8, 4, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0,
    0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 2, 2, 4, 5, 15, 8, 1, 0,
    0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 16, 8, 0, 0, 0, 0, 0, 0, 8, 6,
    4, 2, 0, 0, 0, 0, 8, 6, 4, 2, 0, 0, 0, 0, 12, 8, 4, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0,
    15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 6, 15, 8, 1, 0, 0, 0,
    0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 15, 8, 1, 0, 0, 0, 0, 0, 16, 8, 0, 0, 0, 0, 0, 0};

struct TopPlan {
  int rank;
  double cost;
  std::vector<std::string> node_sequence;
  std::vector<int> device_groups;
  std::vector<Strategy> strategies;
  int batches;
  std::vector<int> layer_partition;
  int num_repartition;
};

const std::vector<TopPlan> kTop10Base = {
    {1, 1795.3124791383743, {"A100", "V100"}, {32}, {{1, 32}}, 1, {0, 10}, 1},
    {2, 1796.2269812822342, {"A100", "V100"}, {32}, {{1, 32}}, 2, {0, 10}, 1},
    {3, 1798.055985569954, {"A100", "V100"}, {32}, {{1, 32}}, 4, {0, 10}, 1},
    {4, 2391.0455256700516, {"A100", "V100"}, {32}, {{1, 32}}, 128, {0, 10}, 1},
    {5, 2411.193260192871, {"V100", "A100"}, {16, 16}, {{16, 1}, {16, 1}}, 8, {0, 3, 10}, 1},
    {6, 2564.4328255860705, {"V100", "A100"}, {16, 16}, {{16, 1}, {16, 1}}, 4, {0, 3, 10}, 1},
    {7, 2625.830103376637, {"V100", "A100"}, {16, 16}, {{8, 2}, {8, 2}}, 16, {0, 3, 10}, 1},
    {8, 2677.9442335937333, {"A100", "V100"}, {32}, {{2, 16}}, 8, {0, 10}, 1},
    {9, 2878.333640637605, {"V100", "A100"}, {16, 16}, {{16, 1}, {16, 1}}, 2, {0, 3, 10}, 1},
    {10, 2928.5383516950196, {"V100", "A100"}, {8, 8, 8, 8}, {{8, 1}, {8, 1}, {8, 1}, {8, 1}}, 16, {0, 2, 3, 6, 10}, 1},
};

const std::vector<TopPlan> kTop10Strat = {
    {1, 1795.3124791383743, {"A100", "V100"}, {32}, {{1, 32}}, 1, {0, 10}, 1},
    {2, 1796.2269812822342, {"A100", "V100"}, {32}, {{1, 32}}, 2, {0, 10}, 1},
    {3, 1798.055985569954, {"A100", "V100"}, {32}, {{1, 32}}, 4, {0, 10}, 1},
    {4, 2391.0455256700516, {"A100", "V100"}, {32}, {{1, 32}}, 128, {0, 10}, 1},
    {5, 2411.193260192871, {"V100", "A100"}, {16, 16}, {{16, 1}, {16, 1}}, 8, {0, 3, 10}, 1},
    {6, 2564.4328255860705, {"V100", "A100"}, {16, 16}, {{16, 1}, {16, 1}}, 4, {0, 3, 10}, 1},
    {7, 2625.830103376637, {"V100", "A100"}, {16, 16}, {{8, 2}, {8, 2}}, 16, {0, 3, 10}, 1},
    {8, 2677.9442335937333, {"A100", "V100"}, {32}, {{2, 16}}, 8, {0, 10}, 1},
    {9, 2878.333640637605, {"V100", "A100"}, {16, 16}, {{16, 1}, {16, 1}}, 2, {0, 3, 10}, 1},
    {10, 2928.5383516950196, {"V100", "A100"}, {8, 8, 8, 8}, {{8, 1}, {8, 1}, {8, 1}, {8, 1}}, 16, {0, 2, 3, 6, 10}, 1},
};

InterStageOptions row1_inter_stage_options() { return InterStageOptions{2, 32, 128, 10, 1, 128}; }

// Runs the DFS on one plan and returns its yields.
std::vector<Yield> walk(IntraStageSearch& search, const InterStagePlan& plan, const RankLayout& layout) {
  std::vector<Yield> out;
  search.run(plan, layout, layout.rank_types(), [&](const IntraStageCandidate& c) {
    out.push_back(Yield{*c.strategies, c.partition->layer_partition, c.partition->num_repartition, c.count});
  });
  return out;
}

void check_yields(const std::vector<Yield>& got, const std::vector<Yield>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t y = 0; y < want.size(); ++y) {
    INFO("yield " << y);
    CHECK(got[y].strategies == want[y].strategies);
    CHECK(got[y].layer_partition == want[y].layer_partition);
    CHECK(got[y].num_repartition == want[y].num_repartition);
    CHECK(got[y].count == want[y].count);
  }
}

void check_plans(bool use_strat, const std::vector<PlanYields>& expected) {
  const ProfileSet& profiles = test::synthetic_profiles(10);
  const Cluster cluster = test::table1_cluster(16);
  InterStagePlanGenerator gen(row1_inter_stage_options());
  const std::vector<InterStagePlan> plans = gen.all();
  REQUIRE(plans.size() == 176);
  std::vector<RankLayout> layouts;
  for (const auto& ns : gen.node_sequences()) layouts.emplace_back(cluster, ns);
  IntraStageSearch search(profiles, IntraStageOptions{128, 128, use_strat});
  for (const PlanYields& e : expected) {
    INFO("plan " << e.plan_idx << (use_strat ? " (use_strat)" : " (base)"));
    const InterStagePlan& plan = plans[e.plan_idx];
    REQUIRE(plan.ns_idx == e.ns_idx);
    REQUIRE(*plan.device_groups == e.device_groups);
    REQUIRE(plan.num_stage == e.num_stage);
    REQUIRE(plan.batches == e.batches);
    check_yields(walk(search, plan, layouts[plan.ns_idx]), e.yields);
  }
}

}  // namespace

TEST_CASE("intra-stage DFS: yields of the first 40 row-1 plans, base mode", "[dfs]") {
  REQUIRE_SHARED_DATA();
  check_plans(false, kFirst40);
}

TEST_CASE("intra-stage DFS: yields of the first 40 row-1 plans, use_strat", "[dfs]") {
  REQUIRE_SHARED_DATA();
  check_plans(true, kFirst40);
}

TEST_CASE("intra-stage DFS: the plans where the two modes differ", "[dfs]") {
  REQUIRE_SHARED_DATA();
  SECTION("base") { check_plans(false, kModeDiffBase); }
  SECTION("use_strat") { check_plans(true, kModeDiffStrat); }
}

TEST_CASE("intra-stage DFS: total count over all 176 row-1 plans", "[dfs]") {
  REQUIRE_SHARED_DATA();
  const ProfileSet& profiles = test::synthetic_profiles(10);
  const Cluster cluster = test::table1_cluster(16);
  InterStagePlanGenerator gen(row1_inter_stage_options());
  const std::vector<InterStagePlan> plans = gen.all();
  REQUIRE(plans.size() == 176);
  std::vector<RankLayout> layouts;
  for (const auto& ns : gen.node_sequences()) layouts.emplace_back(cluster, ns);
  for (const bool use_strat : {false, true}) {
    INFO((use_strat ? "use_strat" : "base"));
    const std::vector<long long>& sums = use_strat ? kSumCountsStrat : kSumCountsBase;
    IntraStageSearch search(profiles, IntraStageOptions{128, 128, use_strat});
    long long total = 0;
    for (std::size_t i = 0; i < plans.size(); ++i) {
      long long plan_sum = 0;
      search.run(plans[i], layouts[plans[i].ns_idx], layouts[plans[i].ns_idx].rank_types(),
                 [&](const IntraStageCandidate& c) { plan_sum += c.count; });
      INFO("plan " << i);
      CHECK(plan_sum == sums[i]);
      total += plan_sum;
    }
    CHECK(total == (use_strat ? 562 : 612));
  }
}

TEST_CASE("MetisSearch: top 10 plans of row 1", "[dfs][search]") {
  REQUIRE_SHARED_DATA();
  const ProfileSet& profiles = test::synthetic_profiles(10);
  const Cluster cluster = test::table1_cluster(16);
  for (const bool use_strat : {false, true}) {
    INFO((use_strat ? "use_strat" : "base"));
    const std::vector<TopPlan>& want = use_strat ? kTop10Strat : kTop10Base;
    SearchOptions options = test::table1_search_options(10, use_strat);
    options.top_k = 10;
    const MetisSearch search(cluster, profiles, options);
    const SearchResult res = search.run();
    CHECK(res.count == (use_strat ? 562 : 612));
    CHECK(res.inter_stage_plans == 176);
    CHECK(res.skipped == 0);
    CHECK(res.candidates == (use_strat ? 183 : 206));  // the reference's estimates
    REQUIRE(res.top.size() == want.size());
    for (std::size_t r = 0; r < want.size(); ++r) {
      INFO("rank " << want[r].rank);
      const PlanResult& p = res.top[r];
      CHECK(p.cost == want[r].cost);
      CHECK(p.node_sequence == want[r].node_sequence);
      CHECK(p.device_groups == want[r].device_groups);
      CHECK(p.strategies == want[r].strategies);
      CHECK(p.batches == want[r].batches);
      CHECK(p.layer_partition == want[r].layer_partition);
      CHECK(p.num_repartition == want[r].num_repartition);
    }
  }
}
