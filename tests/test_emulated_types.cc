// Emulated device types (issue 14): a clusterfile's "device_types" declares a
// type as a base GPU restricted to N SMs (sim/cluster.h). Parsing and
// declaration here, on the CPU; running inside a green context needs a GPU
// (scripts/gpu_greenctx_check.sh), and a CPU build refuses it with one line.

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/cluster.h"
#include "base/input_error.h"
#include "tests/fixtures.h"

namespace fs = std::filesystem;
using namespace hetplan;
using json = nlohmann::ordered_json;

namespace {

json good_clusterfile() {
  return json::parse(R"({
    "device_types": {"H200-33sm": {"emulate": {"base": "H200", "sms": 33}}},
    "0.0.0.6": {"instance_type": "H200", "inter_bandwidth": 450, "intra_bandwidth": 450, "memory": 141},
    "0.0.0.7": {"instance_type": "H200-33sm", "inter_bandwidth": 450, "intra_bandwidth": 450}})");
}

fs::path write_clusterfile(const std::string& name, const json& j) {
  const fs::path p = test::scratch_dir("emulated") / name;
  std::ofstream(p) << j.dump();
  return p;
}

// The InputError parse_clusterfile throws for `j`, as text ("" if none).
std::string parse_error(const json& j) {
  const fs::path p = write_clusterfile("bad.json", j);
  try {
    parse_clusterfile(p.string());
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void expect_refused(const json& j, const std::vector<std::string>& parts) {
  const std::string what = parse_error(j);
  INFO(what);
  REQUIRE(!what.empty());
  CHECK(what.find('\n') == std::string::npos);
  CHECK(what.rfind(test::scratch_dir("emulated").string() + "/bad.json: ", 0) == 0);
  for (const auto& part : parts) CHECK(what.find(part) != std::string::npos);
}

}  // namespace

TEST_CASE("emulated types: declared once in the clusterfile, with the base GPU's memory", "[emulated]") {
  const fs::path cf = write_clusterfile("good.json", good_clusterfile());
  const auto entries = parse_clusterfile(cf.string());
  REQUIRE(entries.size() == 2);  // "device_types" is no node
  CHECK(entries[0].ip == "0.0.0.6");
  CHECK(!entries[0].emulate);
  CHECK(entries[1].instance_type == "H200-33sm");
  REQUIRE(entries[1].emulate);
  CHECK(*entries[1].emulate == EmulatedDevice{"H200", 33});
  CHECK(entries[1].memory_gb == 141);  // the base's, no "memory" key given

  const auto types = parse_emulated_device_types(cf.string());
  REQUIRE(types.size() == 1);
  CHECK(types[0].first == "H200-33sm");
  CHECK(types[0].second == EmulatedDevice{"H200", 33});

  const Cluster c = Cluster::from_parts({{"0.0.0.6", 1}, {"0.0.0.7", 1}}, entries, "hosts", cf.string());
  CHECK(c.device_types() == std::vector<std::string>{"H200", "H200-33sm"});
  CHECK(c.memory_mb(c.type_index("H200-33sm")) == 141 * 1024);
  REQUIRE(c.emulation("H200-33sm"));
  CHECK(c.emulation("H200-33sm")->sms == 33);
  CHECK(c.emulation("H200") == nullptr);
  CHECK(c.emulation("V100") == nullptr);

  // Memory given equal to the base's is accepted; without a base entry the
  // datasheet's (sim/gpu_specs.h) is the base's memory.
  json j = good_clusterfile();
  j["0.0.0.7"]["memory"] = 141;
  CHECK(parse_error(j).empty());
  j = good_clusterfile();
  j["device_types"]["A100-54sm"] = {{"emulate", {{"base", "A100"}, {"sms", 54}}}};
  j["0.0.0.9"] = {{"instance_type", "A100-54sm"}, {"inter_bandwidth", 25}, {"intra_bandwidth", 300}};
  const auto with_a100 = parse_clusterfile(write_clusterfile("a100.json", j).string());
  REQUIRE(with_a100.size() == 3);
  CHECK(with_a100[2].memory_gb == 80);
  CHECK(*with_a100[2].emulate == EmulatedDevice{"A100", 54});
}

TEST_CASE("emulated types: the shipped hostfiles and clusterfile", "[emulated]") {
  const std::string root = HETPLAN_SOURCE_DIR;
  const Cluster c = Cluster::load(root + "/hostfiles/h200_1_h200-33sm_1.hostfile",
                                  root + "/hostfiles/clusterfile_h200_emulated.json");
  CHECK(c.num_devices() == 2);
  CHECK(c.device_types() == std::vector<std::string>{"H200", "H200-33sm"});
  CHECK(c.num_devices_of(c.type_index("H200")) == 1);
  CHECK(c.num_devices_of(c.type_index("H200-33sm")) == 1);
  CHECK(c.memory_mb(0) == c.memory_mb(1));
  REQUIRE(c.emulation("H200-33sm"));
  CHECK(*c.emulation("H200-33sm") == EmulatedDevice{"H200", 33});
  const Cluster c4 = Cluster::load(root + "/hostfiles/h200_2_h200-33sm_2.hostfile",
                                   root + "/hostfiles/clusterfile_h200_emulated.json");
  CHECK(c4.num_devices_of(c4.type_index("H200-33sm")) == 2);
}

TEST_CASE("emulated types: bad declarations are one line naming file, key and expectation", "[emulated]") {
  auto with = [](const std::function<void(json&)>& edit) {
    json j = good_clusterfile();
    edit(j);
    return j;
  };
  const std::string t = "key 'device_types.H200-33sm";
  expect_refused(with([](json& j) { j["device_types"] = json::array(); }),
                 {"key 'device_types' must be an object mapping device type names to {\"emulate\""});
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"] = 33; }), {t + "' must be an object"});
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"]["emulates"] = 1; }),
                 {t + ".emulates' is not a device type property (expected only 'emulate')"});
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"] = json::object(); }),
                 {"missing key 'device_types.H200-33sm.emulate'"});
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"]["emulate"] = "H200"; }),
                 {t + ".emulate' must be an object {\"base\""});
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"]["emulate"]["cores"] = 4; }),
                 {t + ".emulate.cores' is not an emulation property (expected 'base' and 'sms')"});
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"]["emulate"].erase("base"); }),
                 {"missing key 'device_types.H200-33sm.emulate.base'"});
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"]["emulate"]["base"] = ""; }),
                 {t + ".emulate.base' must name the GPU type emulated (a non-empty string"});
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"]["emulate"]["base"] = 7; }),
                 {t + ".emulate.base' must name the GPU type emulated"});
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"]["emulate"]["base"] = "H200-33sm"; }),
                 {t + ".emulate.base' is 'H200-33sm' itself; expected the real GPU type it restricts"});
  for (const json& sms : {json(0), json(33.5), json(1025), json("33"), json(-1)}) {
    INFO(sms.dump());
    expect_refused(with([&](json& j) { j["device_types"]["H200-33sm"]["emulate"]["sms"] = sms; }),
                   {t + ".emulate.sms'", "expected an integer from 1 to 1024"});
  }
  expect_refused(with([](json& j) { j["device_types"]["H200-33sm"]["emulate"].erase("sms"); }),
                 {"missing key 'device_types.H200-33sm.emulate.sms'"});
  expect_refused(with([](json& j) {
                   j["device_types"]["H200-16sm"] = {{"emulate", {{"base", "H200-33sm"}, {"sms", 16}}}};
                 }),
                 {"key 'device_types.H200-16sm.emulate.base' is 'H200-33sm', which is itself emulated; expected a "
                  "real GPU type"});
  expect_refused(with([](json& j) { j["0.0.0.7"]["memory"] = 80; }),
                 {"key '0.0.0.7.memory' is 80 GB, but 'H200-33sm' emulates 'H200', which has 141 GB (its entry "
                  "'0.0.0.6'); expected that, or no 'memory' key"});
  expect_refused(with([](json& j) {
                   j["device_types"]["H200-33sm"]["emulate"]["base"] = "Z9";
                   j.erase("0.0.0.6");
                 }),
                 {t + ".emulate.base' is 'Z9', which has no node entry in this file and is not a GPU hetplan knows (V100, A100-40GB, A100, H100",
                  "so the memory of 'H200-33sm' is unknown"});
  // A plain type still needs its memory.
  expect_refused(with([](json& j) { j["0.0.0.6"].erase("memory"); }), {"missing key '0.0.0.6.memory'"});
}

TEST_CASE("emulated types: a bad declaration ends the CLI with one line and exit 2", "[emulated]") {
  json j = good_clusterfile();
  j["device_types"]["H200-33sm"]["emulate"]["sms"] = 0;
  const fs::path cf = write_clusterfile("cli.json", j);
  const fs::path hosts = test::scratch_dir("emulated") / "hosts";
  std::ofstream(hosts) << "0.0.0.6 slots=1\n0.0.0.7 slots=1\n";
  const auto r = test::run_hetplan("whatif --hostfile " + hosts.string() + " --clusterfile " + cf.string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  CHECK(r.output.rfind("hetplan: error: " + cf.string() + ": key 'device_types.H200-33sm.emulate.sms': expected an "
                       "integer from 1 to 1024, got 0", 0) == 0);
}

TEST_CASE("emulated types: search plans a cluster of H200 and H200-33sm from their profiles", "[emulated]") {
  // Stand-in profiles: analytic H200 files, and the same files renamed
  // H200-33sm with every time x3 (what the green context measures on a GPU).
  const fs::path dir = test::scratch_dir("emulated") / "search";
  fs::remove_all(dir);
  const auto gen = test::run_hetplan("gen-profiles --analytic 10 8 --types H200 --out " + (dir / "profiles").string());
  REQUIRE(gen.exit_code == 0);
  int copied = 0;
  for (const auto& f : fs::directory_iterator(dir / "profiles")) {
    const std::string name = f.path().filename().string();
    if (name.rfind("DeviceType.H200_", 0) != 0) continue;
    json j = json::parse(std::ifstream(f.path()));
    for (auto& t : j["execution_time"]["layer_compute_total_ms"]) t = t.get<double>() * 3;
    j["execution_time"]["forward_backward_time_ms"] = j["execution_time"]["forward_backward_time_ms"].get<double>() * 3;
    std::ofstream(dir / "profiles" / ("DeviceType.H200-33sm_" + name.substr(16))) << j.dump();
    ++copied;
  }
  REQUIRE(copied > 0);
  const std::string root = HETPLAN_SOURCE_DIR;
  const auto r = test::run_hetplan("search -q --hostfile " + root + "/hostfiles/h200_1_h200-33sm_1.hostfile --clusterfile " +
                                   root + "/hostfiles/clusterfile_h200_emulated.json --profiles " +
                                   (dir / "profiles").string() + " --num_layers 10 --gbs 8 --top 8 --json " +
                                   (dir / "plans.json").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const json plans = json::parse(std::ifstream(dir / "plans.json"));
  REQUIRE(plans["best"].is_object());
  CHECK(plans["best"]["node_sequence"].size() == 2);  // both types, both GPUs
  // The cheapest 2-stage pipeline gives the 3x faster H200 the larger share of the 8 blocks.
  int pipelines = 0;
  for (const json& p : plans["top"]) {
    if (p["device_groups"].size() != 2) continue;
    const auto& lp = p["layer_partition"];
    const int first = lp[1].get<int>() - lp[0].get<int>(), second = lp[2].get<int>() - lp[1].get<int>();
    const bool h200_first = p["node_sequence"][0] == "H200";
    INFO(p.dump());
    CHECK((h200_first ? first : second) > 2 * (h200_first ? second : first));
    ++pipelines;
    break;
  }
  CHECK(pipelines == 1);
}

#if defined(HETPLAN_WITH_TORCH)
TEST_CASE("emulated types: profile refuses without a CUDA GPU, and an undeclared <BASE>-<N>sm name", "[emulated]") {
  const fs::path cf = write_clusterfile("profile.json", good_clusterfile());
  const fs::path out = test::scratch_dir("emulated") / "profiles";
  const std::string common = "profile --device cpu --num-layers 3 --hidden-size 64 --heads 2 --seq-len 16 "
                             "--vocab-size 128 --bs 1 --dtype fp32 --warmup 0 --iters 1 --out " + out.string();
  auto r = test::run_hetplan(common + " --device-type H200-33sm --clusterfile " + cf.string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
#if defined(HETPLAN_TORCH_CUDA)
  CHECK(r.output.find("device type 'H200-33sm' (H200 restricted to 33 SMs) runs on a GPU only") != std::string::npos);
#else
  CHECK(r.output.find("device type 'H200-33sm' is emulated (H200 restricted to 33 SMs): emulated device types need a "
                      "CUDA build") != std::string::npos);
#endif
  r = test::run_hetplan(common + " --device-type H200-40sm --clusterfile " + cf.string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("--device-type 'H200-40sm': named like an emulated type (<BASE>-<N>sm), but --clusterfile " +
                      cf.string() + " does not declare it") != std::string::npos);
  r = test::run_hetplan(common + " --device-type H200-33sm");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("named like an emulated type (<BASE>-<N>sm), but no --clusterfile is given") != std::string::npos);
}

TEST_CASE("emulated types: replay runs the emulated rank in its partition, which a CPU run refuses", "[emulated]") {
  const fs::path dir = test::scratch_dir("emulated") / "replay";
  fs::create_directories(dir);
  const fs::path cf = write_clusterfile("replay.json", good_clusterfile());
  std::ofstream(dir / "hosts") << "0.0.0.6 slots=1\n0.0.0.7 slots=1\n";
  const json plan = {{"node_sequence", {"H200", "H200-33sm"}}, {"device_groups", {1, 1}},
                     {"strategies", {{1, 1}, {1, 1}}},         {"batches", 2},
                     {"layer_partition", {0, 2, 4}},            {"gbs", 4},
                     {"cost", 1.0},
                     {"model", {{"num_layers", 4}, {"hidden_size", 32}, {"sequence_length", 8}, {"vocab_size", 64},
                                {"attention_heads", 4}}},
                     {"hostfile", (dir / "hosts").string()},
                     {"clusterfile", cf.string()}};
  std::ofstream(dir / "plan.json") << plan.dump();
  const auto r = test::run_hetplan("replay --device cpu --dtype fp32 --iters 1 --warmup 0 --timeout-s 5 --plan " +
                                   (dir / "plan.json").string() + " --out " + (dir / "r.json").string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("rank 0: H200 (whole GPU), rank 1: H200-33sm (H200 restricted to 33 SMs)") != std::string::npos);
#if defined(HETPLAN_TORCH_CUDA)
  CHECK(r.output.find("rank 1: device type 'H200-33sm' (H200 restricted to 33 SMs) runs on a GPU only") !=
        std::string::npos);
#else
  CHECK(r.output.find("rank 1: device type 'H200-33sm' is emulated (H200 restricted to 33 SMs): emulated device types "
                      "need a CUDA build") != std::string::npos);
#endif
}
#endif
