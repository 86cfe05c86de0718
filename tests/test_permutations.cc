// for_each_multiset_permutation against the reference's search_space.utils.permutations.
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

#include "metis/multiset_permutations.h"

using namespace hetplan;

namespace {

// Every permutation visited, in order, and the returned count.
template <typename T>
void check_permutations(const std::vector<T>& input, const std::vector<std::vector<T>>& expected, long count) {
  std::vector<std::vector<T>> seen;
  const long n = for_each_multiset_permutation(input, [&](const std::vector<T>& p) { seen.push_back(p); });
  CHECK(n == count);
  CHECK(static_cast<long>(seen.size()) == count);
  CHECK(seen == expected);
}

}  // namespace

TEST_CASE("multiset permutations of {1, 2, 2, 3}", "[permutations]") {
  check_permutations<int>({1, 2, 2, 3},
                          {{3, 2, 2, 1},
      {1, 3, 2, 2},
      {3, 1, 2, 2},
      {2, 3, 1, 2},
      {1, 2, 3, 2},
      {2, 1, 3, 2},
      {3, 2, 1, 2},
      {2, 3, 2, 1},
      {2, 2, 3, 1},
      {1, 2, 2, 3},
      {2, 1, 2, 3},
      {2, 2, 1, 3}},
                          12);
}

TEST_CASE("multiset permutations of {1, 1, 2}", "[permutations]") {
  check_permutations<int>({1, 1, 2},
                          {{2, 1, 1},
      {1, 2, 1},
      {1, 1, 2}},
                          3);
}

TEST_CASE("multiset permutations of {3, 1, 2}", "[permutations]") {
  check_permutations<int>({3, 1, 2},
                          {{3, 2, 1},
      {1, 3, 2},
      {3, 1, 2},
      {2, 3, 1},
      {1, 2, 3},
      {2, 1, 3}},
                          6);
}

TEST_CASE("multiset permutations of tuples {{1}, {1}, {2}}", "[permutations]") {
  // Elements are lists (the reference permutes tuples of merged groups).
  check_permutations<std::vector<int>>({{1}, {1}, {2}},
                                       {{{2}, {1}, {1}},
      {{1}, {2}, {1}},
      {{1}, {1}, {2}}},
                                       3);
}

TEST_CASE("multiset permutations of {5}", "[permutations]") {
  check_permutations<int>({5},
                          {{5}},
                          1);
}

TEST_CASE("multiset permutations: the input order does not matter", "[permutations]") {
  std::vector<std::vector<int>> a, b;
  for_each_multiset_permutation(std::vector<int>{1, 2, 2, 3}, [&](const std::vector<int>& p) { a.push_back(p); });
  for_each_multiset_permutation(std::vector<int>{3, 2, 1, 2}, [&](const std::vector<int>& p) { b.push_back(p); });
  CHECK(a == b);
  CHECK(for_each_multiset_permutation(std::vector<int>{}, [](const std::vector<int>&) {}) == 0);
}
