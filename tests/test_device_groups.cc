// Device groups (shapes, permute, device_groups_for_stages) against the reference.
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

#include <vector>

#include "metis/device_groups.h"

using namespace hetplan;

namespace {

using Groups = std::vector<std::vector<int>>;

// permute(s): the merged groups of each placement, and the same placements flattened.
void check_permute(const DeviceGroups& s, int max_permute_len, const std::vector<Groups>& groups,
                   const std::vector<DeviceGroups>& flattened, std::size_t count) {
  const auto got = permute_groups(s, max_permute_len);
  CHECK(got.size() == count);
  CHECK(got == groups);
  std::vector<DeviceGroups> flat;
  for (const auto& perm : got) {
    DeviceGroups f;
    for (const auto& g : perm) f.insert(f.end(), g.begin(), g.end());
    flat.push_back(f);
  }
  CHECK(flat == flattened);
}

void check_device_groups(int stages, int num_gpus, double variance, int max_permute_len,
                         const std::vector<DeviceGroups>& expected) {
  const auto got = device_groups_for_stages(stages, num_gpus, variance, max_permute_len);
  CHECK(got.size() == expected.size());
  CHECK(got == expected);
}

}  // namespace

TEST_CASE("permute {1, 1, 1, 1, 1, 1, 2} with max_permute_len 6", "[device_groups][permute]") {
  check_permute({1, 1, 1, 1, 1, 1, 2}, 6,
                {{{2}, {1, 1}, {1, 1}, {1, 1}},
       {{1, 1}, {2}, {1, 1}, {1, 1}},
       {{1, 1}, {1, 1}, {2}, {1, 1}},
       {{1, 1}, {1, 1}, {1, 1}, {2}}},
                {{2, 1, 1, 1, 1, 1, 1},
       {1, 1, 2, 1, 1, 1, 1},
       {1, 1, 1, 1, 2, 1, 1},
       {1, 1, 1, 1, 1, 1, 2}},
                4);
}

TEST_CASE("permute {1, 1, 1, 1, 2, 2} with max_permute_len 3", "[device_groups][permute]") {
  check_permute({1, 1, 1, 1, 2, 2}, 3,
                {{{2}, {2}, {1, 1, 1, 1}},
       {{1, 1, 1, 1}, {2}, {2}},
       {{2}, {1, 1, 1, 1}, {2}}},
                {{2, 2, 1, 1, 1, 1},
       {1, 1, 1, 1, 2, 2},
       {2, 1, 1, 1, 1, 2}},
                3);
}

TEST_CASE("permute {2, 2, 4} with max_permute_len 128", "[device_groups][permute]") {
  check_permute({2, 2, 4}, 128,
                {{{4}, {2}, {2}},
       {{2}, {4}, {2}},
       {{2}, {2}, {4}}},
                {{4, 2, 2},
       {2, 4, 2},
       {2, 2, 4}},
                3);
}

TEST_CASE("permute {1, 1, 1, 1, 1, 1, 1, 1} with max_permute_len 3", "[device_groups][permute]") {
  check_permute({1, 1, 1, 1, 1, 1, 1, 1}, 3,
                {{{1, 1, 1, 1}, {1, 1, 1, 1}}},
                {{1, 1, 1, 1, 1, 1, 1, 1}},
                1);
}

TEST_CASE("permute {1, 1, 2, 2, 2, 4} with max_permute_len 4", "[device_groups][permute]") {
  check_permute({1, 1, 2, 2, 2, 4}, 4,
                {{{4}, {2}, {2}, {1, 1, 2}},
       {{1, 1, 2}, {4}, {2}, {2}},
       {{4}, {1, 1, 2}, {2}, {2}},
       {{2}, {4}, {1, 1, 2}, {2}},
       {{1, 1, 2}, {2}, {4}, {2}},
       {{2}, {1, 1, 2}, {4}, {2}},
       {{4}, {2}, {1, 1, 2}, {2}},
       {{2}, {4}, {2}, {1, 1, 2}},
       {{2}, {2}, {4}, {1, 1, 2}},
       {{1, 1, 2}, {2}, {2}, {4}},
       {{2}, {1, 1, 2}, {2}, {4}},
       {{2}, {2}, {1, 1, 2}, {4}}},
                {{4, 2, 2, 1, 1, 2},
       {1, 1, 2, 4, 2, 2},
       {4, 1, 1, 2, 2, 2},
       {2, 4, 1, 1, 2, 2},
       {1, 1, 2, 2, 4, 2},
       {2, 1, 1, 2, 4, 2},
       {4, 2, 1, 1, 2, 2},
       {2, 4, 2, 1, 1, 2},
       {2, 2, 4, 1, 1, 2},
       {1, 1, 2, 2, 2, 4},
       {2, 1, 1, 2, 2, 4},
       {2, 2, 1, 1, 2, 4}},
                12);
}

TEST_CASE("device groups: 1 stages of 32 GPUs, variance 1, max_permute_len 128",
          "[device_groups]") {
  CHECK(device_group_shapes(32) == std::vector<int>{1, 2, 4, 8, 16, 32});
  check_device_groups(1, 32, 1.0, 128,
                      {{32}});
}

TEST_CASE("device groups: 2 stages of 32 GPUs, variance 1, max_permute_len 128",
          "[device_groups]") {
  CHECK(device_group_shapes(32) == std::vector<int>{1, 2, 4, 8, 16, 32});
  check_device_groups(2, 32, 1.0, 128,
                      {{16, 16}});
}

TEST_CASE("device groups: 3 stages of 32 GPUs, variance 1, max_permute_len 128 (legitimately empty)",
          "[device_groups]") {
  CHECK(device_group_shapes(32) == std::vector<int>{1, 2, 4, 8, 16, 32});
  check_device_groups(3, 32, 1.0, 128,
                      {});
}

TEST_CASE("device groups: 7 stages of 32 GPUs, variance 1, max_permute_len 128",
          "[device_groups]") {
  CHECK(device_group_shapes(32) == std::vector<int>{1, 2, 4, 8, 16, 32});
  check_device_groups(7, 32, 1.0, 128,
                      {{8, 4, 4, 4, 4, 4, 4},
       {4, 8, 4, 4, 4, 4, 4},
       {4, 4, 8, 4, 4, 4, 4},
       {4, 4, 4, 8, 4, 4, 4},
       {4, 4, 4, 4, 8, 4, 4},
       {4, 4, 4, 4, 4, 8, 4},
       {4, 4, 4, 4, 4, 4, 8}});
}

TEST_CASE("device groups: 4 stages of 16 GPUs, variance 0.5, max_permute_len 4",
          "[device_groups]") {
  CHECK(device_group_shapes(16) == std::vector<int>{1, 2, 4, 8, 16});
  check_device_groups(4, 16, 0.5, 4,
                      {{8, 4, 2, 2},
       {2, 8, 4, 2},
       {8, 2, 4, 2},
       {2, 8, 2, 4},
       {2, 2, 8, 4},
       {8, 2, 2, 4},
       {4, 8, 2, 2},
       {2, 4, 8, 2},
       {4, 2, 8, 2},
       {2, 4, 2, 8},
       {2, 2, 4, 8},
       {4, 2, 2, 8},
       {4, 4, 4, 4}});
}

TEST_CASE("device groups: 5 stages of 24 GPUs, variance 1, max_permute_len 128",
          "[device_groups]") {
  CHECK(device_group_shapes(24) == std::vector<int>{1, 2, 4, 8, 16});
  check_device_groups(5, 24, 1.0, 128,
                      {{8, 4, 4, 4, 4},
       {4, 8, 4, 4, 4},
       {4, 4, 8, 4, 4},
       {4, 4, 4, 8, 4},
       {4, 4, 4, 4, 8}});
}

TEST_CASE("device groups: 6 stages of 16 GPUs, variance 0, max_permute_len 3",
          "[device_groups]") {
  CHECK(device_group_shapes(16) == std::vector<int>{1, 2, 4, 8, 16});
  check_device_groups(6, 16, 0.0, 3,
                      {{8, 4, 1, 1, 1, 1},
       {1, 1, 1, 1, 8, 4},
       {8, 1, 1, 1, 1, 4},
       {4, 8, 1, 1, 1, 1},
       {1, 1, 1, 1, 4, 8},
       {4, 1, 1, 1, 1, 8},
       {8, 2, 2, 1, 1, 2},
       {1, 1, 2, 8, 2, 2},
       {8, 1, 1, 2, 2, 2},
       {2, 2, 8, 1, 1, 2},
       {1, 1, 2, 2, 2, 8},
       {2, 2, 1, 1, 2, 8},
       {4, 4, 1, 1, 2, 4},
       {1, 1, 2, 4, 4, 4},
       {4, 1, 1, 2, 4, 4},
       {4, 4, 2, 2, 2, 2},
       {2, 2, 2, 2, 4, 4},
       {4, 2, 2, 2, 2, 4}});
}

TEST_CASE("device group shapes are the powers of two up to the GPU count", "[device_groups]") {
  CHECK(device_group_shapes(1) == std::vector<int>{1});
  CHECK(device_group_shapes(16) == std::vector<int>{1, 2, 4, 8, 16});
  CHECK(device_group_shapes(24) == std::vector<int>{1, 2, 4, 8, 16});
  CHECK(device_group_shapes(32) == std::vector<int>{1, 2, 4, 8, 16, 32});
}
