// InterStagePlanGenerator: the full plan sequences of the reference's generator.
//
// Reference values: livingshade/Metis @ 900445f (the Python reference), run
// with the two determinism patches (node sequences are the permutations of
// the device types sorted by name, in lexicographic order; the model-level
// profile and the layer-balancer normalisation are read from
// DeviceType.<first type by name>_tp1_bs1.json). Every number below was
// extracted from that run and is embedded as a literal; doubles carry the
// full Python repr digits and are compared with == (the search and cost code
// is meant to be bit-exact).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "metis/inter_stage.h"

using namespace hetplan;

namespace {

struct Block {
  int ns_idx;
  int num_stage;  // the label the reference yields
  std::vector<int> device_groups;
  std::vector<int> batches;  // one plan per entry, in order
};

struct Expected {
  int ns_idx, num_stage, batches;
  std::vector<int> device_groups;
};

std::vector<Expected> expand(const std::vector<Block>& blocks) {
  std::vector<Expected> out;
  for (const auto& b : blocks)
    for (int m : b.batches) out.push_back({b.ns_idx, b.num_stage, m, b.device_groups});
  return out;
}

// {A100,V100}, 32 devices, gbs 128, 10 layers, variance 1,
// max_permute_len 128: 176 plans, in order, as blocks of consecutive plans that
// share node sequence, num_stage label and device groups.
const std::vector<Block> kRow1Plans = {
    {0, 1, {32}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 2, {16, 16}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 4, {8, 8, 8, 8}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 7, {8, 4, 4, 4, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 7, {4, 8, 4, 4, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 7, {4, 4, 8, 4, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 7, {4, 4, 4, 8, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 7, {4, 4, 4, 4, 8, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 7, {4, 4, 4, 4, 4, 8, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 7, {4, 4, 4, 4, 4, 4, 8}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {0, 8, {4, 4, 4, 4, 4, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 1, {16, 16}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 2, {16, 16}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 4, {8, 8, 8, 8}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 7, {8, 4, 4, 4, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 7, {4, 8, 4, 4, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 7, {4, 4, 8, 4, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 7, {4, 4, 4, 8, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 7, {4, 4, 4, 4, 8, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 7, {4, 4, 4, 4, 4, 8, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 7, {4, 4, 4, 4, 4, 4, 8}, {128, 64, 32, 16, 8, 4, 2, 1}},
    {1, 8, {4, 4, 4, 4, 4, 4, 4, 4}, {128, 64, 32, 16, 8, 4, 2, 1}},
};
const std::vector<std::vector<std::string>> kRow1PlansNodeSequences = {
    {"A100", "V100"},
    {"V100", "A100"}};

// {A100,T4,V100}, 16 devices, gbs 8, 6 layers, variance 1,
// max_permute_len 128: 432 plans, in order, as blocks of consecutive plans that
// share node sequence, num_stage label and device groups.
const std::vector<Block> kThreeTypePlans = {
    {0, 1, {16}, {8, 4, 2, 1}},
    {0, 2, {8, 8}, {8, 4, 2, 1}},
    {0, 4, {4, 4, 4, 4}, {8, 4, 2, 1}},
    {0, 6, {4, 4, 2, 2, 2, 2}, {8, 4, 2, 1}},
    {0, 6, {2, 4, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {0, 6, {4, 2, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {0, 6, {2, 4, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {0, 6, {2, 2, 4, 4, 2, 2}, {8, 4, 2, 1}},
    {0, 6, {4, 2, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {0, 6, {2, 4, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {0, 6, {2, 2, 4, 2, 4, 2}, {8, 4, 2, 1}},
    {0, 6, {2, 2, 2, 4, 4, 2}, {8, 4, 2, 1}},
    {0, 6, {4, 2, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {0, 6, {2, 4, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {0, 6, {2, 2, 4, 2, 2, 4}, {8, 4, 2, 1}},
    {0, 6, {2, 2, 2, 4, 2, 4}, {8, 4, 2, 1}},
    {0, 6, {2, 2, 2, 2, 4, 4}, {8, 4, 2, 1}},
    {0, 6, {4, 2, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {1, 1, {8, 8}, {8, 4, 2, 1}},
    {1, 2, {8, 8}, {8, 4, 2, 1}},
    {1, 4, {4, 4, 4, 4}, {8, 4, 2, 1}},
    {1, 6, {4, 4, 2, 2, 2, 2}, {8, 4, 2, 1}},
    {1, 6, {2, 4, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {1, 6, {4, 2, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {1, 6, {2, 4, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {1, 6, {2, 2, 4, 4, 2, 2}, {8, 4, 2, 1}},
    {1, 6, {4, 2, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {1, 6, {2, 4, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {1, 6, {2, 2, 4, 2, 4, 2}, {8, 4, 2, 1}},
    {1, 6, {2, 2, 2, 4, 4, 2}, {8, 4, 2, 1}},
    {1, 6, {4, 2, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {1, 6, {2, 4, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {1, 6, {2, 2, 4, 2, 2, 4}, {8, 4, 2, 1}},
    {1, 6, {2, 2, 2, 4, 2, 4}, {8, 4, 2, 1}},
    {1, 6, {2, 2, 2, 2, 4, 4}, {8, 4, 2, 1}},
    {1, 6, {4, 2, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {2, 1, {8, 8}, {8, 4, 2, 1}},
    {2, 2, {8, 8}, {8, 4, 2, 1}},
    {2, 4, {4, 4, 4, 4}, {8, 4, 2, 1}},
    {2, 6, {4, 4, 2, 2, 2, 2}, {8, 4, 2, 1}},
    {2, 6, {2, 4, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {2, 6, {4, 2, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {2, 6, {2, 4, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {2, 6, {2, 2, 4, 4, 2, 2}, {8, 4, 2, 1}},
    {2, 6, {4, 2, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {2, 6, {2, 4, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {2, 6, {2, 2, 4, 2, 4, 2}, {8, 4, 2, 1}},
    {2, 6, {2, 2, 2, 4, 4, 2}, {8, 4, 2, 1}},
    {2, 6, {4, 2, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {2, 6, {2, 4, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {2, 6, {2, 2, 4, 2, 2, 4}, {8, 4, 2, 1}},
    {2, 6, {2, 2, 2, 4, 2, 4}, {8, 4, 2, 1}},
    {2, 6, {2, 2, 2, 2, 4, 4}, {8, 4, 2, 1}},
    {2, 6, {4, 2, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {3, 1, {8, 8}, {8, 4, 2, 1}},
    {3, 2, {8, 8}, {8, 4, 2, 1}},
    {3, 4, {4, 4, 4, 4}, {8, 4, 2, 1}},
    {3, 6, {4, 4, 2, 2, 2, 2}, {8, 4, 2, 1}},
    {3, 6, {2, 4, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {3, 6, {4, 2, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {3, 6, {2, 4, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {3, 6, {2, 2, 4, 4, 2, 2}, {8, 4, 2, 1}},
    {3, 6, {4, 2, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {3, 6, {2, 4, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {3, 6, {2, 2, 4, 2, 4, 2}, {8, 4, 2, 1}},
    {3, 6, {2, 2, 2, 4, 4, 2}, {8, 4, 2, 1}},
    {3, 6, {4, 2, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {3, 6, {2, 4, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {3, 6, {2, 2, 4, 2, 2, 4}, {8, 4, 2, 1}},
    {3, 6, {2, 2, 2, 4, 2, 4}, {8, 4, 2, 1}},
    {3, 6, {2, 2, 2, 2, 4, 4}, {8, 4, 2, 1}},
    {3, 6, {4, 2, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {4, 1, {8, 8}, {8, 4, 2, 1}},
    {4, 2, {8, 8}, {8, 4, 2, 1}},
    {4, 4, {4, 4, 4, 4}, {8, 4, 2, 1}},
    {4, 6, {4, 4, 2, 2, 2, 2}, {8, 4, 2, 1}},
    {4, 6, {2, 4, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {4, 6, {4, 2, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {4, 6, {2, 4, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {4, 6, {2, 2, 4, 4, 2, 2}, {8, 4, 2, 1}},
    {4, 6, {4, 2, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {4, 6, {2, 4, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {4, 6, {2, 2, 4, 2, 4, 2}, {8, 4, 2, 1}},
    {4, 6, {2, 2, 2, 4, 4, 2}, {8, 4, 2, 1}},
    {4, 6, {4, 2, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {4, 6, {2, 4, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {4, 6, {2, 2, 4, 2, 2, 4}, {8, 4, 2, 1}},
    {4, 6, {2, 2, 2, 4, 2, 4}, {8, 4, 2, 1}},
    {4, 6, {2, 2, 2, 2, 4, 4}, {8, 4, 2, 1}},
    {4, 6, {4, 2, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {5, 1, {8, 8}, {8, 4, 2, 1}},
    {5, 2, {8, 8}, {8, 4, 2, 1}},
    {5, 4, {4, 4, 4, 4}, {8, 4, 2, 1}},
    {5, 6, {4, 4, 2, 2, 2, 2}, {8, 4, 2, 1}},
    {5, 6, {2, 4, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {5, 6, {4, 2, 4, 2, 2, 2}, {8, 4, 2, 1}},
    {5, 6, {2, 4, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {5, 6, {2, 2, 4, 4, 2, 2}, {8, 4, 2, 1}},
    {5, 6, {4, 2, 2, 4, 2, 2}, {8, 4, 2, 1}},
    {5, 6, {2, 4, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {5, 6, {2, 2, 4, 2, 4, 2}, {8, 4, 2, 1}},
    {5, 6, {2, 2, 2, 4, 4, 2}, {8, 4, 2, 1}},
    {5, 6, {4, 2, 2, 2, 4, 2}, {8, 4, 2, 1}},
    {5, 6, {2, 4, 2, 2, 2, 4}, {8, 4, 2, 1}},
    {5, 6, {2, 2, 4, 2, 2, 4}, {8, 4, 2, 1}},
    {5, 6, {2, 2, 2, 4, 2, 4}, {8, 4, 2, 1}},
    {5, 6, {2, 2, 2, 2, 4, 4}, {8, 4, 2, 1}},
    {5, 6, {4, 2, 2, 2, 2, 4}, {8, 4, 2, 1}},
};
const std::vector<std::vector<std::string>> kThreeTypePlansNodeSequences = {
    {"A100", "T4", "V100"},
    {"A100", "V100", "T4"},
    {"T4", "A100", "V100"},
    {"T4", "V100", "A100"},
    {"V100", "A100", "T4"},
    {"V100", "T4", "A100"}};

// Compares the generator's plans with the reference's, plan by plan.
void check_sequence(const InterStageOptions& o, const std::vector<Block>& blocks,
                    const std::vector<std::vector<std::string>>& ns_names, const std::vector<std::string>& types,
                    std::size_t count) {
  InterStagePlanGenerator gen(o);
  const std::vector<InterStagePlan> plans = gen.all();
  const std::vector<Expected> want = expand(blocks);
  REQUIRE(want.size() == count);
  REQUIRE(plans.size() == count);
  for (std::size_t i = 0; i < count; ++i) {
    INFO("plan " << i);
    CHECK(plans[i].ns_idx == want[i].ns_idx);
    CHECK(*plans[i].device_groups == want[i].device_groups);
    CHECK(plans[i].num_stage == want[i].num_stage);
    CHECK(plans[i].batches == want[i].batches);
    CHECK(plans[i].gbs == o.gbs);
  }
  // Node sequence k, as type names (types sorted by name).
  REQUIRE(gen.node_sequences().size() == ns_names.size());
  for (std::size_t k = 0; k < ns_names.size(); ++k) {
    std::vector<std::string> names;
    for (int t : gen.node_sequences()[k]) names.push_back(types[t]);
    CHECK(names == ns_names[k]);
  }
}

std::vector<std::size_t> quirk_indices(const std::vector<InterStagePlan>& plans) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < plans.size(); ++i)
    if (plans[i].num_stage != plans[i].num_stages()) out.push_back(i);
  return out;
}

InterStageOptions row1_options() {
  return InterStageOptions{2, 32, 128, 10, 1.0, 128};
}

InterStageOptions three_type_options() {
  return InterStageOptions{3, 16, 8, 6, 1.0, 128};
}

}  // namespace

TEST_CASE("inter-stage plans: {A100,V100}, 32 GPUs, gbs 128, 10 layers (176 plans)", "[inter_stage]") {
  check_sequence(row1_options(), kRow1Plans, kRow1PlansNodeSequences, {"A100", "V100"}, 176);
}

TEST_CASE("inter-stage plans: {A100,T4,V100}, 16 GPUs, gbs 8, 6 layers (432 plans)", "[inter_stage]") {
  check_sequence(three_type_options(), kThreeTypePlans, kThreeTypePlansNodeSequences, {"A100", "T4", "V100"}, 432);
}

TEST_CASE("inter-stage plans keep the reference's num_stage quirk", "[inter_stage][quirk]") {
  SECTION("two types") {
    InterStagePlanGenerator gen(row1_options());
    const auto plans = gen.all();
    // The reference's plans 88..95: node sequence (V100, A100), labelled 1 stage, 2-stage groups.
    CHECK(quirk_indices(plans) == std::vector<std::size_t>{88, 89, 90, 91, 92, 93, 94, 95});
    for (std::size_t i = 88; i <= 95; ++i) {
      INFO("plan " << i);
      CHECK(plans[i].ns_idx == 1);
      CHECK(plans[i].num_stage == 1);
      CHECK(*plans[i].device_groups == std::vector<int>{16, 16});
      // ... and the same groups come again with their true label.
      CHECK(plans[i + 8].num_stage == 2);
      CHECK(*plans[i + 8].device_groups == std::vector<int>{16, 16});
      CHECK(plans[i + 8].batches == plans[i].batches);
    }
    // The single-stage plan [32] only appears for the first node sequence.
    for (const auto& p : plans)
      if (p.num_stages() == 1) CHECK(p.ns_idx == 0);
  }
  SECTION("three types") {
    InterStagePlanGenerator gen(three_type_options());
    const auto plans = gen.all();
    const auto quirk = quirk_indices(plans);
    // Plans 72..75, 144..147, ...: the first block of each node sequence after the first.
    CHECK(quirk == std::vector<std::size_t>{72, 73, 74, 75, 144, 145, 146, 147, 216, 217,
                                            218, 219, 288, 289, 290, 291, 360, 361, 362, 363});
    for (std::size_t i : quirk) {
      INFO("plan " << i);
      CHECK(plans[i].ns_idx >= 1);
      CHECK(plans[i].num_stage == 1);
      CHECK(plans[i].num_stages() == 2);
    }
    for (const auto& p : plans)
      if (p.num_stages() == 1) CHECK(p.ns_idx == 0);
  }
}
