// Shared test fixtures, of two kinds:
// - the project's own inputs (project_clusterfile(), analytic_profiles()):
//   hostfiles/clusterfile.json and roofline profiles generated in-process.
//   Every test that needs a cluster and profiles but not Metis's numbers uses
//   these, so it runs in a bare clone;
// - the Table-1 inputs of the Metis reproduction, built from Metis's sample
//   profiles in ../shared/metis-samples (never copied into the project;
//   scripts/fetch_reference_data.sh downloads them). Tests that read them
//   begin with REQUIRE_SHARED_DATA(), tests that read the golden table with
//   REQUIRE_GOLDEN_TABLE(): without the data they print
//   "HETPLAN_SKIP: <reason>" and return, and ctest counts them as skipped
//   (tests/CMakeLists.txt).
// Not thread-safe: the generated sets are cached per process on first use.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>
#include <ostream>
#include <stdexcept>

#include "sim/analytic_profiles.h"
#include "sim/cluster.h"
#include "sim/model_shape.h"
#include "metis/metis_search.h"
#include "sim/plan.h"
#include "sim/profile.h"
#include "sim/synthetic_profiles.h"

namespace hetplan {
// For Catch's failure messages.
inline std::ostream& operator<<(std::ostream& os, const Strategy& s) { return os << '(' << s.dp << ", " << s.tp << ')'; }
}  // namespace hetplan

namespace hetplan::test {

// The real `hetplan` binary, run with `args` (and `env` assignments in front),
// stdout and stderr together.
struct CommandResult {
  int exit_code;
  std::string output;
};

// A shell command line, stdout and stderr together.
inline CommandResult run_shell(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

inline CommandResult run_hetplan(const std::string& args, const std::string& env = "") {
  return run_shell(env + (env.empty() ? "" : " ") + HETPLAN_BINARY + " " + args);
}

inline std::string shared_dir() {
  if (const char* env = std::getenv("HETPLAN_SHARED")) return env;
  return (std::filesystem::path(HETPLAN_SOURCE_DIR) / ".." / "shared").lexically_normal().string();
}

inline std::string samples_dir() { return shared_dir() + "/metis-samples"; }

// The files of Metis's sample set that the fixtures read.
inline const std::vector<std::string>& sample_files() {
  static const std::vector<std::string> files = {
      "clusterfile.json",
      "DeviceType.A100_tp1_bs1.json", "DeviceType.A100_tp1_bs2.json", "DeviceType.A100_tp1_bs4.json",
      "DeviceType.A100_tp2_bs1.json", "DeviceType.A100_tp2_bs2.json", "DeviceType.A100_tp2_bs4.json",
      "DeviceType.A100_tp4_bs1.json", "DeviceType.A100_tp4_bs2.json", "DeviceType.A100_tp4_bs4.json"};
  return files;
}

// Why the sample profiles cannot be used, or "" when they are all there.
inline std::string missing_shared_data() {
  for (const auto& f : sample_files())
    if (!std::filesystem::is_regular_file(samples_dir() + "/" + f))
      return "Metis's sample profiles are not in " + samples_dir() + " (no " + f +
             "); run scripts/fetch_reference_data.sh, or set HETPLAN_SHARED to the folder holding metis-samples/";
  return "";
}

inline std::string golden_table() { return shared_dir() + "/golden/table1.json"; }

// Why the golden Table-1 values cannot be used, or "" when they are there.
inline std::string missing_golden_table() {
  if (std::string why = missing_shared_data(); !why.empty()) return why;
  if (!std::filesystem::is_regular_file(golden_table()))
    return "Metis's golden Table-1 values " + golden_table() +
           " are not public (the project's CI has them); set HETPLAN_SHARED to a folder holding golden/table1.json";
  return "";
}
inline std::string sample_clusterfile() { return samples_dir() + "/clusterfile.json"; }

// A scratch folder unique to this test process.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const auto root = std::filesystem::temp_directory_path() / ("hetplan-test-" + std::to_string(::getpid()));
  // Pids are reused: a folder of this pid left by an earlier test process (with its files: a
  // calibration file where a test expects none) is emptied at this process's first call.
  static const bool emptied = (std::filesystem::remove_all(root), true);
  (void)emptied;
  auto p = root / name;
  std::filesystem::create_directories(p);
  return p;
}

// ---- The project's own inputs (no outside data).

// The project's clusterfile: V100 (32 GB) at 0.0.0.1, P100 at 0.0.0.2, T4 at
// 0.0.0.3, A100 (80 GB) at 0.0.0.4, H100 at 0.0.0.5, H200 at 0.0.0.6.
inline std::string project_clusterfile() { return std::string(HETPLAN_SOURCE_DIR) + "/hostfiles/clusterfile.json"; }

// Largest tp and bs of analytic_profiles().
inline constexpr int kAnalyticMaxTp = 8;
inline constexpr int kAnalyticMaxBs = 128;

// Roofline profiles (sim/analytic_profiles.h, as `gen-profiles --analytic`
// writes them) of the default GPT (hidden 4096, sequence 1024) with `layers`
// layers, for A100 and V100, tp 1-8 and bs 1-128 (powers of two), generated
// once per process.
inline std::string analytic_dir(int layers) {
  static std::map<int, std::string> dirs;
  auto& d = dirs[layers];
  if (d.empty()) {
    const auto dir = scratch_dir("analytic" + std::to_string(layers));
    AnalyticOptions o;
    o.model.num_layers = layers;
    o.max_tp = kAnalyticMaxTp;
    o.max_bs = kAnalyticMaxBs;
    o.extensions = false;  // Metis's keys only: the tests on these price files by the fallback rules
    generate_analytic_profiles(o, dir.string());
    d = dir.string();
  }
  return d;
}

inline const ProfileSet& analytic_profiles(int layers) {
  static std::map<int, std::unique_ptr<ProfileSet>> cache;
  auto& slot = cache[layers];
  if (!slot) slot = std::make_unique<ProfileSet>(ProfileSet::load(analytic_dir(layers), layers));
  return *slot;
}

// The small GPT of the planner's tests: 6 Metis layers (embedding, 4 blocks, head), hidden 2048, sequence
// 1024, vocabulary 32000, 16 heads.
inline ModelConfig six_layer_model() {
  ModelConfig m;
  m.num_layers = 6;
  m.hidden_size = 2048;
  m.sequence_length = 1024;
  m.vocab_size = 32000;
  m.attention_heads = 16;
  return m;
}

// Its exact shape, as the simulator and the search take it.
inline ModelShape six_layer_shape() { return shape_from_model_config(six_layer_model()); }

// Roofline profiles of six_layer_model() for `device_types`, tp 1-4 and micro-batches 1-8, written into the
// scratch folder `folder` (each call writes them again: callers cache). Returns the folder's path.
inline std::string six_layer_profile_dir(const std::vector<std::string>& device_types, const std::string& folder) {
  AnalyticOptions o;
  o.model = six_layer_model();
  o.device_types = device_types;
  o.max_tp = 4;
  o.max_bs = 8;
  const std::string dir = scratch_dir(folder).string();
  generate_analytic_profiles(o, dir);
  return dir;
}

// n/4 V100 nodes (0.0.0.1) then n/4 A100 nodes (0.0.0.4), 4 GPUs each, on the project's clusterfile.
inline Cluster project_cluster(int n) {
  std::vector<std::pair<std::string, int>> hosts;
  for (int i = 0; i < n / 4; ++i) hosts.emplace_back("0.0.0.1", 4);
  for (int i = 0; i < n / 4; ++i) hosts.emplace_back("0.0.0.4", 4);
  return Cluster::from_parts(hosts, parse_clusterfile(project_clusterfile()), "hostfile", project_clusterfile());
}

// ---- Metis's inputs (REQUIRE_SHARED_DATA()).

// The synthetic profile set of gen_synth_data.py LAYERS 128, generated once per process.
inline const ProfileSet& synthetic_profiles(int layers) {
  static std::map<int, std::unique_ptr<ProfileSet>> cache;
  auto& slot = cache[layers];
  if (!slot) {
    const auto dir = scratch_dir("syn" + std::to_string(layers));
    generate_synthetic_profiles(samples_dir(), dir.string(), layers, 128);
    slot = std::make_unique<ProfileSet>(ProfileSet::load(dir.string(), layers));
  }
  return *slot;
}

inline std::string synthetic_dir(int layers) {
  synthetic_profiles(layers);
  return scratch_dir("syn" + std::to_string(layers)).string();
}

// The search settings of every Table-1 row: gbs 128, max tp and bs 128,
// variance 1, permute length 128.
inline SearchOptions table1_search_options(int layers, bool use_strat = false);

// The Table-1 search settings over analytic_profiles(): tp and bs up to what they hold.
inline SearchOptions analytic_search_options(int layers) {
  SearchOptions o = table1_search_options(layers);
  o.max_profiled_tp = kAnalyticMaxTp;
  o.max_profiled_bs = kAnalyticMaxBs;
  return o;
}

inline SearchOptions table1_search_options(int layers, bool use_strat) {
  SearchOptions o;
  o.model.num_layers = layers;
  o.gbs = 128;
  o.max_profiled_tp = 128;
  o.max_profiled_bs = 128;
  o.min_group_scale_variance = 1;
  o.max_permute_len = 128;
  o.use_strat = use_strat;
  return o;
}

// gen_hostfile.py N: N/4 V100 nodes (0.0.0.1) then N/4 A100 nodes (0.0.0.4), 4 GPUs each.
inline Cluster table1_cluster(int n) {
  std::vector<std::pair<std::string, int>> hosts;
  for (int i = 0; i < n / 4; ++i) hosts.emplace_back("0.0.0.1", 4);
  for (int i = 0; i < n / 4; ++i) hosts.emplace_back("0.0.0.4", 4);
  return Cluster::from_parts(hosts, parse_clusterfile(sample_clusterfile()), "hostfile", sample_clusterfile());
}

}  // namespace hetplan::test

// First statement of a test case that reads Metis's sample profiles: without
// them it prints the skip marker (ctest then counts the test as skipped,
// printing the reason) and returns.
#define REQUIRE_SHARED_DATA()                                                      \
  do {                                                                             \
    if (const std::string why_ = ::hetplan::test::missing_shared_data(); !why_.empty()) { \
      std::cout << "HETPLAN_SKIP: " << why_ << std::endl;                          \
      return;                                                                      \
    }                                                                              \
  } while (0)

#if defined(HETPLAN_WITH_TORCH)
// First statement of a test case whose CPU ranks talk to each other (several
// ranks per plan, or tp > 1): skipped where this LibTorch has no Gloo.
// REQUIRES: the test file includes profiler/distributed.h.
#define REQUIRE_CPU_COLLECTIVES()                                                             \
  do {                                                                                      \
    if (!::hetplan::profiler::cpu_collectives_available()) {                                \
      std::cout << "HETPLAN_SKIP: this LibTorch has no Gloo (PyPI's wheels ship none): CPU " \
                   "ranks cannot run collectives" << std::endl;                             \
      return;                                                                               \
    }                                                                                       \
  } while (0)
#endif

// The same for a test case that reads the golden Table-1 values (and the samples).
#define REQUIRE_GOLDEN_TABLE()                                                     \
  do {                                                                             \
    if (const std::string why_ = ::hetplan::test::missing_golden_table(); !why_.empty()) { \
      std::cout << "HETPLAN_SKIP: " << why_ << std::endl;                          \
      return;                                                                      \
    }                                                                              \
  } while (0)
