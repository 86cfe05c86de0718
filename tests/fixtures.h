// Shared test fixtures: the Table-1 inputs, built from Metis's sample
// profiles in ../shared/metis-samples (never copied into the project;
// scripts/fetch_reference_data.sh downloads them). Tests that read them begin
// with REQUIRE_SHARED_DATA(), tests that read the golden table with
// REQUIRE_GOLDEN_TABLE(): without the data they print "HETPLAN_SKIP: <reason>"
// and return, and ctest counts them as skipped (tests/CMakeLists.txt).
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

#include "sim/cluster.h"
#include "planner/search.h"
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
    return "the golden Table-1 values " + golden_table() +
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
inline SearchOptions table1_search_options(int layers, bool use_strat = false) {
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
