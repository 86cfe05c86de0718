// Every reader refuses bad input with one line naming the file and key, exit
// code 2, and no crash, overflow or runaway memory (issue 15): numbers too
// large for a double, values of the wrong JSON type, counts that overflow,
// absurd values, and long lines. Self-contained: the inputs are written here,
// profiles come from `hetplan gen-profiles --analytic`.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "cli/app_runner.h"
#include "base/checked.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/profile.h"
#include "tests/fixtures.h"

namespace fs = std::filesystem;
using namespace hetplan;
using json = nlohmann::ordered_json;

namespace {

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }
void write_json(const fs::path& p, const json& j) { write(p, j.dump()); }
json read(const fs::path& p) { return json::parse(std::ifstream(p)); }

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// A valid setup: 8 V100 + 8 A100 (4 per node), analytic 10-layer profiles, and
// a one-stage plan over the 16 GPUs.
struct Setup {
  fs::path dir, hostfile, clusterfile, profiles, plan, llama;
};

json clusterfile_json() {
  return json::parse(R"({"0.0.0.1": {"instance_type": "V100", "inter_bandwidth": 10, "intra_bandwidth": 50, "memory": 32},
                        "0.0.0.4": {"instance_type": "A100", "inter_bandwidth": 10, "intra_bandwidth": 46, "memory": 80}})");
}

json plan_json(const Setup& s) {
  return {{"cost", 1.0},
          {"node_sequence", {"A100", "V100"}},
          {"device_groups", {16}},
          {"strategies", {{4, 4}}},
          {"batches", 2},
          {"layer_partition", {0, 10}},
          {"num_repartition", 1},
          {"model",
           {{"num_layers", 10}, {"hidden_size", 4096}, {"sequence_length", 1024}, {"vocab_size", 51200},
            {"attention_heads", 32}}},
          {"gbs", 32},
          {"hostfile", s.hostfile.string()},
          {"clusterfile", s.clusterfile.string()},
          {"profile_dir", s.profiles.string()}};
}

const Setup& setup() {
  static const Setup s = [] {
    Setup s;
    s.dir = test::scratch_dir("validation");
    s.hostfile = s.dir / "hostfile";
    s.clusterfile = s.dir / "cluster.json";
    s.profiles = s.dir / "profiles";
    s.plan = s.dir / "plan.json";
    s.llama = s.dir / "llama.json";
    write(s.hostfile, "0.0.0.1 slots=4\n0.0.0.1 slots=4\n0.0.0.4 slots=4\n0.0.0.4 slots=4\n");
    write_json(s.clusterfile, clusterfile_json());
    const auto gen = test::run_hetplan("gen-profiles --analytic 10 8 --out " + s.profiles.string());
    if (gen.exit_code != 0) throw std::runtime_error("gen-profiles failed: " + gen.output);
    write_json(s.plan, plan_json(s));
    write_json(s.llama, json::parse(R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
      "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 11008,
      "max_position_embeddings": 4096})"));
    return s;
  }();
  return s;
}

test::CommandResult search(const fs::path& hostfile, const fs::path& clusterfile, const fs::path& profiles,
                           const std::string& extra = "") {
  return test::run_hetplan("search -q --hostfile " + hostfile.string() + " --clusterfile " + clusterfile.string() +
                           " --profiles " + profiles.string() + " --num_layers 10 --gbs 32 " + extra);
}
test::CommandResult simulate(const fs::path& plan, const std::string& extra = "") {
  return test::run_hetplan("simulate --plan " + plan.string() + " " + extra);
}

void expect_error(const test::CommandResult& r, const std::vector<std::string>& parts) {
  INFO(r.output.substr(0, 2000));
  CHECK(r.exit_code == 2);
  CHECK(count_lines(r.output) == 1);
  CHECK(r.output.rfind("hetplan: error: ", 0) == 0);
  CHECK(r.output.size() < 600);
  for (const auto& p : parts) CHECK(r.output.find(p) != std::string::npos);
}

// A copy of the valid profiles with one file edited.
fs::path profiles_with(const std::string& name, const std::function<void(json&)>& edit,
                       const std::string& file = "DeviceType.A100_tp1_bs1.json") {
  const fs::path d = setup().dir / name;
  fs::remove_all(d);
  fs::copy(setup().profiles, d, fs::copy_options::recursive);
  json j = read(d / file);
  edit(j);
  write_json(d / file, j);
  return d;
}

fs::path plan_with(const std::string& name, const std::function<void(json&)>& edit) {
  json j = plan_json(setup());
  edit(j);
  write_json(setup().dir / name, j);
  return setup().dir / name;
}

}  // namespace

TEST_CASE("the valid setup runs", "[validation]") {
  const auto& s = setup();
  const auto r = search(s.hostfile, s.clusterfile, s.profiles);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  const auto sim = simulate(s.plan);
  INFO(sim.output);
  CHECK(sim.exit_code == 0);
  CHECK(test::run_hetplan("whatif --hf-config " + s.llama.string()).exit_code == 0);
}

TEST_CASE("a number too large for a double names the file, position and key", "[validation]") {
  const auto& s = setup();
  // Clusterfile.
  std::string text = clusterfile_json().dump();
  text.replace(text.find("\"memory\":32"), 11, "\"memory\":1e400");
  write(s.dir / "c400.json", text);
  expect_error(search(s.hostfile, s.dir / "c400.json", s.profiles),
               {"c400.json: number '1e400' at line 1", "key '0.0.0.1.memory'", "too large for a double"});
  // Profile.
  const fs::path p = profiles_with("p400", [](json&) {});
  text = read(p / "DeviceType.A100_tp1_bs1.json").dump();
  const auto at = text.find("\"forward_backward_time_ms\":") + 27;
  text.replace(at, text.find(',', at) - at, "1e400");
  write(p / "DeviceType.A100_tp1_bs1.json", text);
  expect_error(search(s.hostfile, s.clusterfile, p),
               {"DeviceType.A100_tp1_bs1.json: number '1e400'", "key 'execution_time.forward_backward_time_ms'"});
  // Plan.
  text = plan_json(s).dump();
  text.replace(text.find("\"gbs\":32"), 8, "\"gbs\":1e400");
  write(s.dir / "plan400.json", text);
  expect_error(simulate(s.dir / "plan400.json"), {"plan400.json: number '1e400'", "key 'gbs'"});
  // HF config, through whatif and simulate.
  text = read(s.llama).dump();
  text.replace(text.find("\"vocab_size\":32000"), 18, "\"vocab_size\":1e400");
  write(s.dir / "hf400.json", text);
  expect_error(test::run_hetplan("whatif --hf-config " + (s.dir / "hf400.json").string()),
               {"hf400.json: number '1e400'", "key 'vocab_size'"});
  expect_error(simulate(s.plan, "--hf-config " + (s.dir / "hf400.json").string()), {"hf400.json", "key 'vocab_size'"});
}

TEST_CASE("deep nesting and oversized JSON files are refused before they cost memory", "[validation]") {
  const auto& s = setup();
  write(s.dir / "deep.json", std::string(1000000, '['));
  expect_error(simulate(s.dir / "deep.json"), {"deep.json: JSON nested deeper than 256 levels at key '[0][0]", "..."});
  write(s.dir / "big.json", "[" + std::string(17 << 20, ' ') + "]");
  expect_error(simulate(s.dir / "big.json"), {"big.json: file is 17825794 bytes; hetplan reads a JSON file of at most 16777216 bytes (16 MiB)"});
  write(s.dir / "syntax.json", "{\"gbs\": 32,\n \"model\": [1, }");
  expect_error(simulate(s.dir / "syntax.json"), {"syntax.json: not valid JSON at line 2, column", "key 'model[1]'"});
}

TEST_CASE("plan values of the wrong type or range", "[validation]") {
  expect_error(simulate(plan_with("st-num.json", [](json& j) { j["strategies"] = 5; })),
               {"st-num.json: key 'strategies' must be a list, got a number"});
  expect_error(simulate(plan_with("st-obj.json", [](json& j) { j["strategies"] = {{"a", 1}}; })),
               {"st-obj.json: key 'strategies' must be a list, got an object"});
  expect_error(simulate(plan_with("st-str.json", [](json& j) { j["strategies"] = {{4, "4"}}; })),
               {"key 'strategies[0][1]' must be a number"});
  // dp * tp overflows int: refused, not wrapped around.
  expect_error(simulate(plan_with("dptp.json", [](json& j) { j["strategies"] = {{65536, 65536}}; })),
               {"dptp.json: 'strategies[0]' = [65536, 65536]", "expected dp * tp = group size"});
  expect_error(simulate(plan_with("neg-lp.json", [](json& j) { j["layer_partition"] = {-5, 10}; })),
               {"key 'layer_partition[0]': expected an integer from 0 to 4096, got -5"});
  expect_error(simulate(plan_with("gbs.json", [](json& j) { j["gbs"] = 128.9; })),
               {"gbs.json: key 'gbs': expected an integer from 1 to 16777216, got 128.9"});
  expect_error(simulate(plan_with("hidden.json", [](json& j) { j["model"]["hidden_size"] = -4096; })),
               {"key 'model.hidden_size': expected an integer", "got -4096"});
  expect_error(simulate(plan_with("heads.json", [](json& j) { j["model"]["attention_heads"] = 0; })),
               {"key 'model.attention_heads': expected an integer from 1 to 65536, got 0"});
  // A double-to-int cast of 1e12 used to give negative tokens/s.
  expect_error(simulate(plan_with("seq.json", [](json& j) { j["model"]["sequence_length"] = 1e12; })),
               {"key 'model.sequence_length'", "got 1000000000000"});
  expect_error(simulate(plan_with("best.json", [](json& j) { j = {{"best", 7}}; })), {"key 'best' must be an object"});
  expect_error(simulate(plan_with("heads-hidden.json", [](json& j) { j["model"]["attention_heads"] = 8192; })),
               {"key 'model.attention_heads' = 8192: expected at most model.hidden_size (4096)"});
  // 32 micro-batches of gbs 32: one sequence for the 4 replicas of a dp-4 stage.
  expect_error(simulate(plan_with("bs0.json", [](json& j) { j["batches"] = 32; })),
               {"key 'batches' = 32", "cannot feed the 4 data-parallel replicas of stage 0"});
}

TEST_CASE("a plan whose layer partition drops layers or has an empty stage is refused", "[validation]") {
  expect_error(simulate(plan_with("drop.json", [](json& j) { j["layer_partition"] = {0, 7}; })),
               {"drop.json: key 'layer_partition' = [0, 7]", "model.num_layers (10) last", "--reject-dropped-layers"});
  expect_error(simulate(plan_with("empty.json",
                                  [](json& j) {
                                    j["device_groups"] = {8, 8};
                                    j["strategies"] = {{2, 4}, {2, 4}};
                                    j["layer_partition"] = {0, 0, 10};
                                  })),
               {"key 'layer_partition' = [0, 0, 10]", "every stage at least one layer"});
}

TEST_CASE("HF config counts are range-checked before any arithmetic", "[validation]") {
  const auto& s = setup();
  json j = read(s.llama);
  j["num_attention_heads"] = 4294967296LL;  // cast to int gave 0, then a division by zero (SIGFPE)
  write_json(s.dir / "heads.json", j);
  expect_error(test::run_hetplan("whatif --hf-config " + (s.dir / "heads.json").string()),
               {"heads.json: key 'num_attention_heads': expected an integer from 1 to 65536, got 4294967296"});
  expect_error(simulate(s.plan, "--hf-config " + (s.dir / "heads.json").string()), {"key 'num_attention_heads'"});
  json g = json::parse(R"({"model_type": "gpt2", "vocab_size": 50257, "n_layer": 48, "n_head": 25, "n_positions": 1024})");
  g["n_embd"] = 4611686018427387904LL;  // 4 * n_embd overflowed
  write_json(s.dir / "gpt2.json", g);
  expect_error(test::run_hetplan("whatif --hf-config " + (s.dir / "gpt2.json").string()),
               {"gpt2.json: key 'n_embd': expected an integer from 1 to 1048576"});
  j = read(s.llama);
  j["hidden_size"] = -4096;
  write_json(s.dir / "neg.json", j);
  expect_error(test::run_hetplan("whatif --hf-config " + (s.dir / "neg.json").string()), {"key 'hidden_size'"});
}

TEST_CASE("hostfile limits: GPUs per node, GPUs in all, line length", "[validation]") {
  const auto& s = setup();
  std::string many;
  for (int i = 0; i < 3000; ++i) many += "0.0.0.1 slots=999999\n";  // grew to 24 GB before
  write(s.dir / "slots", many);
  expect_error(search(s.dir / "slots", s.clusterfile, s.profiles),
               {"slots:1: slots=999999 is more than 1024 GPUs per node"});
  many.clear();
  for (int i = 0; i < 1001; ++i) many += "0.0.0.1 slots=1000\n";
  write(s.dir / "total", many);
  expect_error(search(s.dir / "total", s.clusterfile, s.profiles),
               {"total:1001: the hostfile lists more than 1000000 GPUs"});
  expect_error(simulate(s.plan, "--hostfile " + (s.dir / "total").string()), {"total:1001:"});
  // A 10 MB line: refused after 1024 characters, quoted in at most about 80.
  write(s.dir / "long", "0.0.0.1 slots=4 " + std::string(10 << 20, 'x') + "\n");
  const auto r = search(s.dir / "long", s.clusterfile, s.profiles);
  expect_error(r, {"long:1: line is longer than 1024 characters", "xxx..."});
  CHECK(r.output.size() < 250);
  // A bad line is quoted through the same excerpt.
  write(s.dir / "bad", "0.0.0.1 slots=4 " + std::string(5000 / 5, 'y') + "\n");
  expect_error(search(s.dir / "bad", s.clusterfile, s.profiles), {"bad:1: expected '<ip> slots=<N>'", "yyy..."});
}

TEST_CASE("clusterfile: one bandwidth rule for search and simulate, memory positive", "[validation]") {
  const auto& s = setup();
  for (const auto& [key, value] : std::vector<std::pair<std::string, double>>{{"inter_bandwidth", 1e-300},
                                                                              {"intra_bandwidth", 1e308}}) {
    json c = clusterfile_json();
    c["0.0.0.1"][key] = value;
    write_json(s.dir / "bw.json", c);
    const std::string named = "bw.json: key '0.0.0.1." + key + "'";
    expect_error(search(s.hostfile, s.dir / "bw.json", s.profiles), {named, "expected GB/s between 0.01 and 10000"});
    expect_error(simulate(s.plan, "--clusterfile " + (s.dir / "bw.json").string()), {named, "expected GB/s"});
    expect_error(test::run_hetplan("whatif --hostfile " + s.hostfile.string() + " --clusterfile " +
                                   (s.dir / "bw.json").string()),
                 {named});
  }
  json c = clusterfile_json();
  c["0.0.0.4"]["memory"] = -80;
  write_json(s.dir / "mem.json", c);
  expect_error(search(s.hostfile, s.dir / "mem.json", s.profiles),
               {"mem.json: key '0.0.0.4.memory': expected a number > 0"});
  c = clusterfile_json();
  c[std::string(100000, 'k')] = c["0.0.0.1"];
  c[std::string(100000, 'k')].erase("memory");
  write_json(s.dir / "key.json", c);
  const auto r = search(s.hostfile, s.dir / "key.json", s.profiles);
  expect_error(r, {"key.json: missing key 'kkk", "...'"});
}

TEST_CASE("profiles: times positive, memory non-negative, lists consistent, limits named", "[validation]") {
  const auto& s = setup();
  auto bad = [&](const std::string& name, const std::function<void(json&)>& edit, const std::vector<std::string>& parts) {
    const fs::path p = profiles_with(name, edit);
    expect_error(search(s.hostfile, s.clusterfile, p), parts);
    expect_error(simulate(s.plan, "--profiles " + p.string()), parts);
  };
  bad("neg-time", [](json& j) { j["execution_time"]["layer_compute_total_ms"][3] = -1.0; },
      {"key 'execution_time.layer_compute_total_ms[3]': expected a number > 0", "got -1"});
  bad("zero-fb", [](json& j) { j["execution_time"]["forward_backward_time_ms"] = 0; },
      {"key 'execution_time.forward_backward_time_ms': expected a number > 0", "got 0"});
  bad("neg-mem", [](json& j) { j["execution_memory"]["layer_memory_total_mb"][2] = -100; },
      {"key 'execution_memory.layer_memory_total_mb[2]': expected a number >= 0"});
  bad("short-mem",
      [](json& j) {
        auto& m = j["execution_memory"]["layer_memory_total_mb"];
        m.erase(m.begin() + 7, m.end());
      },
      {"'execution_memory.layer_memory_total_mb' has 7 entries, expected one per layer (10", "or one fewer"});
  bad("long-mem", [](json& j) { j["execution_memory"]["layer_memory_total_mb"].push_back(1); },
      {"has 11 entries, expected one per layer"});
  bad("mem-type", [](json& j) { j["execution_memory"]["layer_memory_total_mb"] = "lots"; },
      {"key 'execution_memory.layer_memory_total_mb' must be a list of numbers", "got a string"});
  bad("busbw", [](json& j) { j["communication"] = {{"allreduce_busbw_gbs", 1e308}}; },
      {"key 'communication.allreduce_busbw_gbs': expected a number > 0 and <= 10000, got 1e+308"});
  // 30,000 layers (a 181 KB file asked for 7 GB of slice sums): refused by name.
  bad("many-layers",
      [](json& j) {
        j["execution_time"]["layer_compute_total_ms"] = std::vector<double>(30000, 1.0);
        j["execution_memory"]["layer_memory_total_mb"] = std::vector<double>(30000, 1.0);
      },
      {"key 'execution_time.layer_compute_total_ms' has 30000 entries; expected at most 4096"});
}

TEST_CASE("profile file names: tp and bs limits, no giant index", "[validation]") {
  const auto& s = setup();
  const fs::path a = setup().dir / "bigtp";
  fs::remove_all(a);
  fs::copy(s.profiles, a, fs::copy_options::recursive);
  fs::copy(a / "DeviceType.A100_tp1_bs1.json", a / "DeviceType.A100_tp99999999999_bs1.json");
  expect_error(search(s.hostfile, s.clusterfile, a),
               {"DeviceType.A100_tp99999999999_bs1.json: tp 99999999999 in the file name is more than 1024"});
  fs::remove(a / "DeviceType.A100_tp99999999999_bs1.json");
  fs::copy(a / "DeviceType.A100_tp1_bs1.json", a / "DeviceType.A100_tp1_bs100000.json");
  expect_error(simulate(s.plan, "--profiles " + a.string()), {"bs 100000 in the file name is more than 65536"});
  fs::remove(a / "DeviceType.A100_tp1_bs100000.json");
  fs::copy(a / "DeviceType.A100_tp1_bs1.json", a / "DeviceType.A100_tp01_bs1.json");
  expect_error(search(s.hostfile, s.clusterfile, a), {"DeviceType.A100_tp1_bs1.json: the same device, tp and bs as"});
  fs::remove(a / "DeviceType.A100_tp01_bs1.json");
  // The largest tp and bs allowed load at once: the index grows with the files, not with tp x bs.
  fs::copy(a / "DeviceType.A100_tp1_bs1.json", a / "DeviceType.A100_tp1024_bs65536.json");
  const ProfileSet set = ProfileSet::load(a.string(), 10);
  const LayerProfile* far = set.find(set.type_index("A100"), 1024, 65536);
  REQUIRE(far != nullptr);
  CHECK(far->path == (a / "DeviceType.A100_tp1024_bs65536.json").string());
  CHECK(set.find(set.type_index("A100"), 1024, 65535) == nullptr);
  CHECK(set.find(set.type_index("A100"), 1, 1)->tp == 1);
  // Only DeviceType.<TYPE>_tp<T>_bs<B>.json is a profile (TYPE: a letter or digit, then letters, digits and
  // hyphens); the rest of the folder is left alone, however close the name.
  for (const char* other : {"DeviceType.A100_tp1_bs1.json.bak", "DeviceType.A100_tp1_bs1.jsonx",
                            "DeviceType.-A100_tp3_bs1.json", "DeviceType._tp3_bs1.json", "DeviceType.A100_tp_bs1.json",
                            "DeviceType.A100_tp3_bs.json", "DeviceType.A1 00_tp3_bs1.json", "DeviceType.A100_tp3_bs1",
                            "xDeviceType.A100_tp3_bs1.json", "DeviceType.A100_tp3x_bs1.json", "devicetype.A100_tp3_bs1.json"})
    fs::copy(a / "DeviceType.A100_tp1_bs1.json", a / other);
  fs::copy(a / "DeviceType.A100_tp1_bs1.json", a / "DeviceType.H200-33sm_tp2_bs4.json");
  const ProfileSet named = ProfileSet::load(a.string(), 10);
  CHECK(named.device_types() == std::vector<std::string>{"A100", "H200-33sm", "V100"});
  CHECK(named.find(named.type_index("A100"), 3, 1) == nullptr);
  REQUIRE(named.find(named.type_index("H200-33sm"), 2, 4) != nullptr);
  CHECK(named.find(named.type_index("H200-33sm"), 2, 4)->path == (a / "DeviceType.H200-33sm_tp2_bs4.json").string());
}

TEST_CASE("profiles read on several threads: the same set, and the first file's error in name order", "[validation]") {
  const auto& s = setup();
  const ProfileSet one = ProfileSet::load(s.profiles.string(), 10, 1);
  for (int threads : {0, 2, 3, 16}) {
    const ProfileSet many = ProfileSet::load(s.profiles.string(), 10, threads);
    REQUIRE(many.entries().size() == one.entries().size());
    for (std::size_t i = 0; i < one.entries().size(); ++i) {
      CHECK(many.entries()[i].path == one.entries()[i].path);
      CHECK(many.entries()[i].layer_ms == one.entries()[i].layer_ms);
      CHECK(many.entries()[i].memory_mb == one.entries()[i].memory_mb);
    }
    CHECK(many.model().parameters_per_layer_bytes == one.model().parameters_per_layer_bytes);
    CHECK(many.model().norm_layer_duration == one.model().norm_layer_duration);
  }
  // Three faults: a bad number in the A100 tp1 bs2 file, a repeated (device, tp, bs) further on in name
  // order, and a bad number in a V100 file after that. The first in name order is reported, whatever the threads.
  const fs::path d = profiles_with("three-faults", [](json& j) { j["execution_time"]["layer_compute_total_ms"][1] = 0; },
                                   "DeviceType.A100_tp1_bs2.json");
  fs::copy(d / "DeviceType.A100_tp1_bs1.json", d / "DeviceType.A100_tp01_bs4.json");
  json v = read(d / "DeviceType.V100_tp1_bs1.json");
  v["execution_memory"]["layer_memory_total_mb"][0] = -1;
  write_json(d / "DeviceType.V100_tp1_bs1.json", v);
  for (int threads : {1, 2, 5}) {
    INFO("threads " << threads);
    CHECK_THROWS_WITH(ProfileSet::load(d.string(), 10, threads),
                      Catch::Contains("DeviceType.A100_tp1_bs2.json: key 'execution_time.layer_compute_total_ms[1]'"));
  }
  fs::remove(d / "DeviceType.A100_tp1_bs2.json");
  for (int threads : {1, 2, 5}) {
    INFO("threads " << threads);
    CHECK_THROWS_WITH(ProfileSet::load(d.string(), 10, threads),
                      Catch::Contains("DeviceType.A100_tp1_bs4.json: the same device, tp and bs as"));
  }
  fs::remove(d / "DeviceType.A100_tp01_bs4.json");
  for (int threads : {1, 2, 5})
    CHECK_THROWS_WITH(ProfileSet::load(d.string(), 10, threads),
                      Catch::Contains("DeviceType.V100_tp1_bs1.json: key 'execution_memory.layer_memory_total_mb[0]'"));
}

TEST_CASE("a memory list one short of the layers is Metis's: the last layer counts 0 MB", "[validation]") {
  const fs::path p = profiles_with("nine", [](json& j) { j["execution_memory"]["layer_memory_total_mb"].erase(9); });
  const ProfileSet set = ProfileSet::load(p.string(), 10);
  const LayerProfile* e = set.find(set.type_index("A100"), 1, 1);
  REQUIRE(e != nullptr);
  REQUIRE(e->memory_mb.size() == 9);
  // Python's sum(memory[8:10]) of a 9-entry list is memory[8]; sum(memory[9:10]) is 0.
  CHECK(e->memory(8, 10) == e->memory_mb[8]);
  CHECK(e->memory(9, 10) == 0.0);
  const auto r = search(setup().hostfile, setup().clusterfile, p);
  INFO(r.output);
  CHECK(r.exit_code == 0);
}

TEST_CASE("slice sums above the table bound are the same left-to-right doubles", "[validation]") {
  for (const int n : {SliceSums::kTabulatedLayers, SliceSums::kTabulatedLayers + 1, 3000}) {
    std::vector<double> v(n);
    for (int i = 0; i < n; ++i) v[i] = 0.1 * (i % 7) + 1.0 / (i + 3);
    const SliceSums sums(v);
    for (const auto& [s, e] : std::vector<std::pair<int, int>>{{0, n}, {1, n - 1}, {n / 3, n / 2}, {5, 6}, {n - 1, n + 4}}) {
      double acc = 0.0;
      for (int i = s; i < std::min(e, n); ++i) acc += v[i];
      CHECK(sums(s, e) == acc);  // exact: the same additions in the same order
    }
    CHECK(sums(n, n + 1) == 0.0);
  }
}

TEST_CASE("CLI flags: one line, exit 2", "[validation]") {
  const auto& s = setup();
  const std::string base = "search -q --hostfile " + s.hostfile.string() + " --clusterfile " + s.clusterfile.string() +
                           " --profiles " + s.profiles.string() + " --num_layers 10 ";
  expect_error(test::run_hetplan(base + "--gbs 128.9"), {"--gbs", "128.9"});
  expect_error(test::run_hetplan(base + "--gbs 32 --hidden_size -4096"),
               {"--hidden_size: expected an integer from 1 to 1048576, got -4096"});
  expect_error(test::run_hetplan(base + "--gbs 32 --attention_head_size 0"), {"--attention_head_size", "got 0"});
  expect_error(test::run_hetplan(base + "--gbs 0"), {"--gbs: expected an integer from 1"});
  expect_error(test::run_hetplan("whatif --heads 0"), {"--heads: expected an integer from 1 to 65536, got 0"});
  expect_error(test::run_hetplan("whatif --micro-batch 1000000 --gpus 4096"),
               {"--micro-batch x GPUs: 1000000 x 4096", "more than 16777216"});
  expect_error(test::run_hetplan("whatif --hidden-size 9000000000000000000"), {"--hidden-size"});
  expect_error(test::run_hetplan("whatif --seq 1e12"), {"--seq"});
  expect_error(test::run_hetplan("whatif --inter-gbs 1e-300"), {"--inter-gbs = 1e-300: expected GB/s"});
  expect_error(test::run_hetplan("whatif --family " + std::string(500, 'z')), {"--family: 'zzz", "...'"});
}

TEST_CASE("helpers: excerpt, checked arithmetic, number rules", "[validation]") {
  CHECK(excerpt("abc") == "abc");
  CHECK(excerpt(std::string(100, 'a')) == std::string(80, 'a') + "...");
  CHECK(excerpt("a\nb\x01") == "a\\x0ab\\x01");
  CHECK(checked_add(2147483647, 1) == std::nullopt);
  CHECK(checked_mul(65536, 65536) == std::nullopt);
  CHECK(checked_mul(4, 8) == std::optional<int>(32));
  CHECK(exact_integer<int>(4294967296.0) == std::nullopt);
  CHECK(exact_integer<int>(2147483647.0) == std::optional<int>(2147483647));
  CHECK(exact_integer<int>(1.5) == std::nullopt);
  CHECK(exact_integer<long long>(9223372036854775808.0) == std::nullopt);
  CHECK(describe(rules::int_in(1, 1024)) == "an integer from 1 to 1024");
  CHECK(describe(rules::kPositive) == "a number > 0");
  CHECK(describe(rules::non_negative_up_to(5)) == "a number >= 0 and <= 5");
  CHECK_THROWS_AS(check_number(std::nan(""), rules::kAny, "x"), InputError);
  CHECK(check_integer(7, rules::int_in(1, 8), "x") == 7);
}

TEST_CASE("the runner's exit codes: 2 bad input, 4 out of memory, 3 internal error", "[validation]") {
  auto run_with = [](const std::function<int()>& body, std::vector<std::string> args = {"hetplan", "go"}) {
    CLI::App app{"test"};
    app.add_subcommand("go", "runs the body");
    cli::AppRunner runner(app);
    runner.add(body);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return runner.run(static_cast<int>(argv.size()), argv.data());
  };
  CHECK(run_with([] { return 0; }) == 0);
  CHECK(run_with([]() -> int { throw InputError("x.json: key 'a': expected 1"); }) == cli::kExitInputError);
  CHECK(run_with([]() -> int { throw std::bad_alloc(); }) == cli::kExitOutOfMemory);
  CHECK(run_with([]() -> int { throw std::logic_error("bug"); }) == cli::kExitInternalError);
  CHECK(run_with([] { return 0; }, {"hetplan", "go", "--no-such-flag"}) == cli::kExitInputError);
  CHECK(cli::kExitInputError == 2);
  CHECK(cli::kExitInternalError == 3);
  CHECK(cli::kExitOutOfMemory == 4);
}
