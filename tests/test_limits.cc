// Limits (base/limits.h) the readers promise (issue 36): a 60,000-entry
// --gpu-spec loads whole, and a plan with more data-parallel replicas than a
// stage may have is refused by its reader. (Its loading time is a benchmark's
// matter: scripts/adversarial.sh times the 60,000-entry case, not a test.)
#include <catch2/catch.hpp>
#include <fstream>

#include "fixtures.h"
#include "sim/gpu_specs.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "base/limits.h"
#include "sim/plan_file.h"

using namespace hetplan;

TEST_CASE("a 60,000-entry GPU catalogue loads whole", "[limits]") {
  const auto dir = test::scratch_dir("gpu-spec-60k");
  {
    std::ofstream f((dir / "gpus.json").string());
    f << "{\"gpus\": [";
    for (int i = 0; i < 60000; ++i)
      f << (i ? "," : "") << "{\"name\": \"G" << i << "\", \"aliases\": [\"g-" << i
        << "\"], \"memory_gb\": 80, \"memory_bw_gbs\": 2000, \"link_gbs\": 300, \"host_link_gbs\": 25, "
           "\"sm_count\": 100, \"peak_tflops\": {\"bf16\": 300}, \"base\": \"A100\", "
           "\"source\": {\"title\": \"t\", \"url\": \"u\"}}";
    f << "]}";
  }
  std::ofstream((dir / "none.json").string()) << "{\"gpus\": []}";
  const std::size_t embedded = check_gpu_spec_file((dir / "none.json").string());
  CHECK(check_gpu_spec_file((dir / "gpus.json").string()) == embedded + 60000);
}

TEST_CASE("a GPU catalogue link beyond the network model's limit is refused at its own key", "[limits]") {
  const auto dir = test::scratch_dir("gpu-spec-link");
  std::ofstream((dir / "gpus.json").string())
      << "{\"name\": \"FAST\", \"memory_gb\": 80, \"memory_bw_gbs\": 2000, \"link_gbs\": 1e6, \"host_link_gbs\": 25, "
         "\"sm_count\": 100, \"peak_tflops\": {\"bf16\": 300}, \"source\": {\"title\": \"t\", \"url\": \"u\"}}";
  CHECK_THROWS_WITH(check_gpu_spec_file((dir / "gpus.json").string()), Catch::Contains("gpus.json: key 'link_gbs'"));
}

TEST_CASE("plan files with more data-parallel replicas than a stage may have are refused", "[limits]") {
  const auto dir = test::scratch_dir("plan-dp-limit");
  const int dp = kMaxReplicas + 1;
  const ordered_json j = {{"node_sequence", {"A100"}}, {"device_groups", {dp}}, {"strategies", {{dp, 1}}},
                          {"batches", 1}, {"layer_partition", {0, 10}}, {"gbs", dp},
                          {"model", {{"num_layers", 10}, {"hidden_size", 1024}, {"sequence_length", 1024},
                                     {"vocab_size", 50257}, {"attention_heads", 16}}}};
  write_json_file((dir / "plan.json").string(), j);
  CHECK_THROWS_WITH(read_plan_file((dir / "plan.json").string()),
                    Catch::EndsWith("key 'strategies[0][0]' = 4097: more data-parallel replicas than the 4096 a stage "
                                    "may have (expected dp <= 4096)"));
}
