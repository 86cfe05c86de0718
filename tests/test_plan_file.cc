// Plan files: every entry of `search --json` is a plan that simulate and
// replay read back unchanged; inconsistent plans are refused with the key.
#include <catch2/catch.hpp>
#include <fstream>

#include "cli/search_json.h"
#include "metis/metis_search.h"
#include "base/input_error.h"
#include "tests/fixtures.h"

using namespace hetplan;

TEST_CASE("search --json entries round-trip as plan files", "[plan_file]") {
  SearchOptions o = test::analytic_search_options(10);
  o.top_k = 3;
  const SearchResult r = MetisSearch(test::project_cluster(16), test::analytic_profiles(10), o).run();
  PlanFile context;
  context.model = o.model;
  context.gbs = 128;
  context.clusterfile = "c.json";
  const ordered_json j = search_result_to_json(r, 1.0, 1, context);
  REQUIRE(j["top"].size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    const PlanFile f = plan_file_from_json(j["top"][i], "top");
    CHECK(f.plan.cost == r.top[i].cost);
    CHECK(f.plan.device_groups == r.top[i].device_groups);
    CHECK(f.plan.strategies == r.top[i].strategies);
    CHECK(f.plan.layer_partition == r.top[i].layer_partition);
    CHECK(f.plan.node_sequence == r.top[i].node_sequence);
    CHECK(f.gbs == 128);
    CHECK(f.model.num_layers == 10);
    CHECK(f.clusterfile == "c.json");
  }
  // The whole document reads as its best plan.
  CHECK(plan_file_from_json(j, "doc").plan.cost == r.top[0].cost);
  CHECK(plan_file_from_json(j, "doc").zero_stage == -1);  // no setting recorded without one
  // With per-plan settings (search --cost-model sim --zero/--recompute auto) each entry carries its own.
  const ordered_json s = search_result_to_json(r, 1.0, 1, context, {{2, "full"}, {0, "none"}, {1, "selective"}});
  CHECK(plan_file_from_json(s, "doc").zero_stage == 2);
  CHECK(plan_file_from_json(s["top"][2], "top").zero_stage == 1);
  CHECK(plan_file_from_json(s["top"][2], "top").recompute == "selective");
}

TEST_CASE("inconsistent plan files are refused", "[plan_file][errors]") {
  ordered_json p = {{"node_sequence", {"A100"}}, {"device_groups", {4, 4}}, {"strategies", {{2, 2}, {4, 1}}},
                    {"batches", 4}, {"layer_partition", {0, 5, 10}}, {"gbs", 32},
                    {"model", {{"num_layers", 10}, {"hidden_size", 64}, {"sequence_length", 16}, {"vocab_size", 100}}}};
  CHECK_NOTHROW(plan_file_from_json(p, "plan.json"));
  auto bad = [&](ordered_json q, const std::string& what) {
    try {
      plan_file_from_json(q, "plan.json");
      FAIL("accepted: " << q.dump());
    } catch (const InputError& e) {
      CHECK_THAT(e.what(), Catch::Contains("plan.json") && Catch::Contains(what));
    }
  };
  ordered_json q = p;
  q["strategies"][1] = {2, 1};
  bad(q, "dp * tp = group size");
  q = p;
  q["layer_partition"] = {0, 10};
  bad(q, "expected stages + 1");
  q = p;
  q["batches"] = 3;
  bad(q, "'batches' >= 1 dividing 'gbs'");
  q = p;
  q.erase("model");
  bad(q, "missing key 'model'");
  q = p;
  q["zero_stage"] = 4;
  bad(q, "key 'zero_stage': expected 0, 1, 2 or 3");
  q = p;
  q["recompute"] = 1;
  bad(q, "key 'recompute'");
  q["recompute"] = "sometimes";
  bad(q, "key 'recompute': 'sometimes': expected none, selective or full");
}
