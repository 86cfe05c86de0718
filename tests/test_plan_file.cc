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

namespace {

std::string hf_config(const std::string& name) { return std::string(HETPLAN_SOURCE_DIR) + "/tests/data/hf/" + name; }

// A one-stage plan of Llama-3.1-8B (32 blocks: 34 Metis layers), with its architecture and setup when `carried`.
ordered_json llama_plan(bool carried) {
  ordered_json j = {{"node_sequence", {"A100"}}, {"device_groups", {8}}, {"strategies", {{8, 1}}}, {"batches", 4},
                    {"layer_partition", {0, 34}}, {"gbs", 32},
                    {"model", {{"num_layers", 34}, {"hidden_size", 4096}, {"sequence_length", 4096},
                               {"vocab_size", 128256}, {"attention_heads", 32}}}};
  if (!carried) return j;
  const ordered_json rope = {{"factor", 8.0}, {"rope_type", "llama3"}};
  j["model"]["architecture"] = shape_to_json(read_hf_config(hf_config("llama-3.1-8b.json")), rope);
  j["precision"] = "bf16";
  j["offload_optimizer"] = true;
  return j;
}

}  // namespace

TEST_CASE("a plan file carries its model's architecture and setup", "[plan_file]") {
  const ModelShape llama = read_hf_config(hf_config("llama-3.1-8b.json"));
  const PlanFile f = plan_file_from_json(llama_plan(true), "plan.json");
  REQUIRE(f.shape.has_value());
  CHECK(f.precision == "bf16");
  CHECK(f.offload_optimizer);
  CHECK(!f.offload_params);
  CHECK(f.rope_scaling == ordered_json{{"factor", 8.0}, {"rope_type", "llama3"}});
  // Every field comes back exactly: the same parameters and FLOPs as the config's shape.
  CHECK(shape_to_json(*f.shape, nullptr) == shape_to_json(llama, nullptr));
  CHECK(f.shape->parameter_count() == llama.parameter_count());
  CHECK(f.shape->mlp == MlpKind::kSwiGlu);
  CHECK(f.shape->norm == NormKind::kRmsNorm);
  CHECK(f.shape->num_kv_heads == 8);
  // Written back, it reads the same.
  CHECK(plan_file_to_json(plan_file_from_json(plan_file_to_json(f), "again")) == plan_file_to_json(f));
  std::string warning = "unchanged";
  CHECK(shape_to_json(plan_shape(f, "", "plan.json", &warning), nullptr) == shape_to_json(llama, nullptr));
  CHECK(warning.empty());
}

TEST_CASE("a --hf-config that contradicts the plan's model names the key and both values", "[plan_file][errors]") {
  const PlanFile f = plan_file_from_json(llama_plan(true), "plan.json");
  const std::string other = hf_config("llama-2-7b.json");  // 32 blocks of 4096, but MHA and ffn 11008
  CHECK_THROWS_WITH(plan_shape(f, other, "plan.json", nullptr),
                    Catch::StartsWith("--hf-config " + other + ": '") && Catch::Contains("but the plan plan.json records") &&
                        Catch::Contains("model.architecture."));
  try {
    plan_shape(f, other, "plan.json", nullptr);
  } catch (const InputError& e) {
    const std::string what = e.what();
    // The first key that differs: llama-2-7b's vocabulary (32000) against the plan's (128256).
    CHECK(what.find("'vocab_size' is 32000, but the plan plan.json records 128256") != std::string::npos);
  }
  // The same config, whose rope_scaling (Llama-3.1's, in full) differs from the plan's shortened one, is refused
  // for the scaling only.
  CHECK_THROWS_WITH(plan_shape(f, hf_config("llama-3.1-8b.json"), "plan.json", nullptr),
                    Catch::Contains("'rope_scaling' is {\"factor\":8.0,\"low_freq_factor\":1.0") &&
                        Catch::Contains("(model.architecture.rope_scaling)"));
  // A config without rope_scaling against a plan that records one.
  ordered_json unscaled = read_json_file(hf_config("llama-3.1-8b.json"));
  unscaled.erase("rope_scaling");
  const std::string unscaled_path = (test::scratch_dir("plan-file-rope") / "llama-3.1-8b-unscaled.json").string();
  write_json_file(unscaled_path, unscaled);
  CHECK_THROWS_WITH(plan_shape(f, unscaled_path, "plan.json", nullptr), Catch::Contains("'rope_scaling' is absent"));
  // An architecture that disagrees with the model keys is refused.
  ordered_json j = llama_plan(true);
  j["model"]["architecture"]["num_blocks"] = 30;
  CHECK_THROWS_WITH(plan_file_from_json(j, "plan.json"), Catch::Contains("key 'model.architecture' has 30 blocks"));
}

TEST_CASE("a plan file without an architecture is a GPT, with one warning line", "[plan_file]") {
  const PlanFile f = plan_file_from_json(llama_plan(false), "old.json");
  CHECK(!f.shape.has_value());
  std::string warning;
  const ModelShape s = plan_shape(f, "", "old.json", &warning);
  CHECK(s.mlp == MlpKind::kGelu);
  CHECK(warning == "old.json records no model architecture (a plan file from before plans carried it): using the GPT "
                   "shape of its 'model' keys; pass --hf-config for another model");
  CHECK(warning.find('\n') == std::string::npos);
  // With --hf-config it is that model, as before, and no warning.
  const ModelShape l = plan_shape(f, hf_config("llama-3.1-8b.json"), "old.json", &warning);
  CHECK(l.mlp == MlpKind::kSwiGlu);
  CHECK(warning.empty());
}
