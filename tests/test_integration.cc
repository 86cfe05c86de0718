// Whole-search integration tests: Table 1 rows 1-3 in both modes against the
// deterministic reference's results in ../shared/golden/table1.json.
#include <catch2/catch.hpp>
#include <cmath>

#include "metis/metis_search.h"
#include "base/json_util.h"
#include "tests/fixtures.h"

using namespace hetplan;


TEST_CASE("Table 1 rows 1-3 equal the deterministic reference", "[integration]") {
  REQUIRE_GOLDEN_TABLE();
  const ordered_json golden = read_json_file(test::golden_table());
  for (const auto& row : golden["rows"]) {
    const int r = row["row"].get<int>();
    if (r > 3) continue;  // row 4 is in the benchmark script (seconds, not a unit test)
    const int layers = row["num_layers"].get<int>();
    const Cluster cluster = test::table1_cluster(row["gen_hostfile"].get<int>());
    const ProfileSet& profiles = test::synthetic_profiles(layers);
    for (const char* mode : {"metis", "strat"}) {
      DYNAMIC_SECTION("row " << r << " " << mode) {
        const MetisSearch search(cluster, profiles, test::table1_search_options(layers, std::string(mode) == "strat"));
        const SearchResult res = search.run();
        CHECK(res.count == row[mode]["count"].get<long long>());
        REQUIRE(!res.top.empty());
        const double want = row[mode]["best_cost"].get<double>();
        CHECK(std::abs(res.top[0].cost - want) <= 1e-9 * want);
        CHECK(res.top[0].cost == want);  // in fact bit-exact
        const auto& best = golden["best_plans"]["row" + std::to_string(r)];
        CHECK(res.top[0].node_sequence == best["node_sequence"].get<std::vector<std::string>>());
        CHECK(res.top[0].device_groups == best["device_groups"].get<std::vector<int>>());
        CHECK(res.top[0].batches == best["batches"].get<int>());
        CHECK(res.top[0].layer_partition == best["layer_partition"].get<std::vector<int>>());
        REQUIRE(res.top[0].strategies.size() == best["strategies"].size());
        for (std::size_t i = 0; i < res.top[0].strategies.size(); ++i) {
          CHECK(res.top[0].strategies[i].dp == best["strategies"][i][0].get<int>());
          CHECK(res.top[0].strategies[i].tp == best["strategies"][i][1].get<int>());
        }
        CHECK(res.skipped == 0);
      }
    }
  }
}

TEST_CASE("search results do not depend on the thread count", "[integration]") {
  REQUIRE_SHARED_DATA();
  const Cluster cluster = test::table1_cluster(32);
  const ProfileSet& profiles = test::synthetic_profiles(20);
  auto run = [&](int threads) {
    SearchOptions o = test::table1_search_options(20, false);
    o.top_k = 25;
    o.threads = threads;
    return MetisSearch(cluster, profiles, o).run();
  };
  const SearchResult one = run(1), two = run(2), many = run(8);
  REQUIRE(one.top.size() == 25);
  for (const SearchResult* other : {&two, &many}) {
    CHECK(other->count == one.count);
    REQUIRE(other->top.size() == one.top.size());
    for (std::size_t i = 0; i < one.top.size(); ++i) {
      CHECK(other->top[i].cost == one.top[i].cost);
      CHECK(other->top[i].device_groups == one.top[i].device_groups);
      CHECK(other->top[i].layer_partition == one.top[i].layer_partition);
      CHECK(other->top[i].strategies == one.top[i].strategies);
    }
  }
  // The list is sorted by cost, ties in enumeration order.
  for (std::size_t i = 1; i < one.top.size(); ++i) CHECK(one.top[i - 1].cost <= one.top[i].cost);
}
