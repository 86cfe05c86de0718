// Bad input reaches the user as one clear line on stderr, naming the file,
// the line or key, and what was expected, with a non-zero exit and no crash.
// These tests run the real `hetplan` binary.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cli/app_runner.h"
#include "sim/environment_error.h"
#include "tests/fixtures.h"

#if defined(HETPLAN_WITH_TORCH)
#include <c10/util/Exception.h>

#include "profiler/device_failure.h"
#endif

namespace fs = std::filesystem;
using namespace hetplan;

namespace {

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A search over `hostfile` with the 10-layer profiles in `profiles` on the project's clusterfile.
test::CommandResult search(const fs::path& hostfile, const std::string& profiles, const std::string& extra = "",
                           const std::string& clusterfile = test::project_clusterfile()) {
  return test::run_hetplan("search -q --hostfile_path " + hostfile.string() + " --clusterfile_path " +
                     clusterfile + " --profile_data_path " + profiles + " --num_layers 10 --gbs 128 " +
                     extra);
}

void expect_one_line_error(const test::CommandResult& r, const std::vector<std::string>& parts) {
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(count_lines(r.output) == 1);
  CHECK(r.output.rfind("hetplan: error: ", 0) == 0);
  for (const auto& p : parts) CHECK(r.output.find(p) != std::string::npos);
}

// What AppRunner makes of a subcommand whose run is `body`: its exit code and what it wrote to stderr.
struct Outcome {
  int exit_code;
  std::string err;
};
Outcome run_command(const std::function<int()>& body, const cli::EnvironmentFailure& recognise = {}) {
  CLI::App app{"test", "hetplan"};
  app.require_subcommand(1);
  cli::AppRunner runner(app);
  if (recognise) runner.recognise_environment_failures(recognise);
  app.add_subcommand("run", "runs the body");
  runner.add(body);
  std::ostringstream err;
  struct Redirect {
    std::streambuf* old;
    ~Redirect() { std::cerr.rdbuf(old); }
  } redirect{std::cerr.rdbuf(err.rdbuf())};
  char name[] = "hetplan", sub[] = "run";
  char* argv[] = {name, sub};
  const int code = runner.run(2, argv);
  return {code, err.str()};
}

}  // namespace

TEST_CASE("each error type has its own exit code and one line on stderr", "[errors]") {
  CHECK(run_command([] { return 0; }).exit_code == 0);
  Outcome o = run_command([]() -> int { throw InputError("hostfile:2: expected '<ip> slots=<N>'"); });
  CHECK(o.exit_code == cli::kExitInputError);
  CHECK(o.err == "hetplan: error: hostfile:2: expected '<ip> slots=<N>'\n");
  o = run_command([]() -> int { throw EnvironmentError("--device cuda: no CUDA device is visible"); });
  CHECK(o.exit_code == cli::kExitEnvironmentError);
  CHECK(o.err == "hetplan: environment error: --device cuda: no CUDA device is visible\n");
  o = run_command([]() -> int { throw std::bad_alloc(); });
  CHECK(o.exit_code == cli::kExitOutOfMemory);
  CHECK(o.err.rfind("hetplan: error: out of memory: ", 0) == 0);
  CHECK(count_lines(o.err) == 1);
  // Any other exception is a bug, whatever it says; a bug is never reported as bad input.
  o = run_command([]() -> int { throw std::invalid_argument("GPT: bad layer range"); });
  CHECK(o.exit_code == cli::kExitInternalError);
  CHECK(o.err == "hetplan: internal error: GPT: bad layer range\n");
  // Unless the recogniser (the torch commands': LibTorch's device failures) names it: then the machine's.
  const cli::EnvironmentFailure recognise = [](const std::exception& e) {
    return std::string(e.what()).rfind("CUDA error", 0) == 0 ? "LibTorch: " + std::string(e.what()) : "";
  };
  o = run_command([]() -> int { throw std::runtime_error("CUDA error: no CUDA-capable device is detected\nmore"); },
                  recognise);
  CHECK(o.exit_code == cli::kExitEnvironmentError);
  CHECK(o.err == "hetplan: environment error: LibTorch: CUDA error: no CUDA-capable device is detected\\x0amore\n");
  o = run_command([]() -> int { throw std::runtime_error("shape mismatch"); }, recognise);
  CHECK(o.exit_code == cli::kExitInternalError);
  // The exit codes are listed in --help.
  const test::CommandResult help = test::run_hetplan("--help");
  CHECK(help.output.find(cli::kExitCodesHelp) != std::string::npos);
}

#if defined(HETPLAN_WITH_TORCH)
TEST_CASE("LibTorch's CUDA and NCCL errors are the machine's, not its other errors or out of memory", "[errors]") {
  CHECK(device_failure(c10::Error("CUDA error: no CUDA-capable device is detected\nCUDA kernel errors ...", "")) ==
        "LibTorch: CUDA error: no CUDA-capable device is detected");
  CHECK(device_failure(c10::Error("Found no NVIDIA driver on your system.", "")) ==
        "LibTorch: Found no NVIDIA driver on your system.");
  CHECK(device_failure(c10::Error("NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error", "")) ==
        "LibTorch: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error");
  CHECK(device_failure(c10::Error("The size of tensor a (2) must match the size of tensor b (3)", "")).empty());
  CHECK(device_failure(c10::OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB", "")).empty());
  CHECK(device_failure(std::runtime_error("CUDA error: not from LibTorch")).empty());
}
#endif

TEST_CASE("malformed hostfile", "[errors]") {
  const auto dir = test::scratch_dir("err-hostfile");
  write(dir / "hostfile", "0.0.0.1 slots=4\n0.0.0.4 slot=4\n");
  expect_one_line_error(search(dir / "hostfile", test::analytic_dir(10)),
                        {(dir / "hostfile").string() + ":2:", "expected '<ip> slots=<N>'", "0.0.0.4 slot=4"});
  write(dir / "hostfile2", "0.0.0.1 slots=x4\n");
  expect_one_line_error(search(dir / "hostfile2", test::analytic_dir(10)),
                        {"hostfile2:1:", "expected a positive integer after 'slots='"});
  write(dir / "hostfile3", "0.0.0.9 slots=4\n");
  expect_one_line_error(search(dir / "hostfile3", test::analytic_dir(10)),
                        {"hostfile3:1:", "'0.0.0.9' is not in clusterfile"});
}

TEST_CASE("unknown device type", "[errors]") {
  const auto dir = test::scratch_dir("err-type");
  write(dir / "hostfile", "0.0.0.2 slots=4\n0.0.0.4 slots=4\n");  // 0.0.0.2 is a P100 in the clusterfile
  for (const char* model : {"--cost-model metis", "--cost-model sim"})
    expect_one_line_error(search(dir / "hostfile", test::analytic_dir(10), model),
                          {"clusterfile.json", "key '0.0.0.2.instance_type'", "unknown device type 'P100'",
                           "DeviceType.P100_tp<T>_bs<B>.json", "A100, V100"});
}

TEST_CASE("missing profile that the search needs", "[errors]") {
  const auto dir = test::scratch_dir("err-missing");
  fs::copy(test::analytic_dir(10), dir / "p", fs::copy_options::overwrite_existing | fs::copy_options::recursive);
  fs::remove(dir / "p" / "DeviceType.V100_tp4_bs2.json");
  write(dir / "hostfile", "0.0.0.1 slots=4\n0.0.0.1 slots=4\n0.0.0.1 slots=4\n"
                          "0.0.0.1 slots=4\n0.0.0.4 slots=4\n0.0.0.4 slots=4\n0.0.0.4 slots=4\n0.0.0.4 slots=4\n");
  // Metis stops at the first plan that needs it, as the reference does.
  expect_one_line_error(search(dir / "hostfile", (dir / "p").string(), "--cost-model metis"),
                        {"DeviceType.V100_tp4_bs2.json: missing profile (device V100, tp 4, bs 2)"});
  // The default search leaves out the stages that would need it, and counts them (plain data parallelism:
  // with --zero auto --recompute auto its better plans prune every such stage before it is costed).
  const test::CommandResult d =
      search(dir / "hostfile", (dir / "p").string(), "--zero 0 --recompute none --json " + (dir / "d.json").string());
  INFO(d.output);
  CHECK(d.exit_code == 0);
  CHECK(d.output.find("infeasible: 0,") == std::string::npos);
  // ... and says so, once, naming the file.
  CHECK(count_of(d.output, "hetplan: warning: ") == 1);
  CHECK(d.output.find("hetplan: warning: 1 profile(s) missing between ones present; the search leaves out the plans "
                      "that need them: " + (dir / "p" / "DeviceType.V100_tp4_bs2.json").string() +
                      " (device V100, tp 4, bs 2)\n") != std::string::npos);
  // The model-level file itself.
  fs::remove(dir / "p" / "DeviceType.A100_tp1_bs1.json");
  for (const char* model : {"--cost-model metis", "--cost-model sim"})
    expect_one_line_error(search(dir / "hostfile", (dir / "p").string(), model),
                          {"DeviceType.A100_tp1_bs1.json: missing", "first device type (A100)"});
}

// A hole lies between files of its (type, tp) or of its (type, bs); a file missing past the largest tp and
// bs of the set is no hole (the set just ends there).
TEST_CASE("ProfileSet::holes lists the files missing between ones present", "[errors][profiles]") {
  const auto dir = test::scratch_dir("holes");
  fs::copy(test::analytic_dir(10), dir / "p", fs::copy_options::overwrite_existing | fs::copy_options::recursive);
  CHECK(ProfileSet::load((dir / "p").string(), 10).holes().empty());
  fs::remove(dir / "p" / "DeviceType.V100_tp2_bs8.json");    // between bs 4 and 16, and tp 1 and 4
  fs::remove(dir / "p" / "DeviceType.A100_tp8_bs1.json");    // no smaller bs, no larger tp: no hole
  fs::remove(dir / "p" / "DeviceType.A100_tp8_bs128.json");  // no larger bs, no larger tp: no hole
  const ProfileSet p = ProfileSet::load((dir / "p").string(), 10);
  const int a100 = p.type_index("A100"), v100 = p.type_index("V100");
  const std::vector<ProfileHole> holes = p.holes();
  REQUIRE(holes.size() == 1);
  CHECK(holes[0] == ProfileHole{v100, 2, 8});
  CHECK(p.holes_message(holes) == (dir / "p" / "DeviceType.V100_tp2_bs8.json").string() + " (device V100, tp 2, bs 8)");
  // A100 tp 8 bs 4 lies between bs 2 and 8 of its tp: a hole, listed by type, tp, bs.
  fs::remove(dir / "p" / "DeviceType.A100_tp8_bs4.json");
  const std::vector<ProfileHole> two = ProfileSet::load((dir / "p").string(), 10).holes();
  REQUIRE(a100 < v100);
  REQUIRE(two.size() == 2);
  CHECK(two[0] == ProfileHole{a100, 8, 4});
  CHECK(two[1] == ProfileHole{v100, 2, 8});
}

// The default search ignores the flags of the Metis reproduction, and says which.
TEST_CASE("search --cost-model sim warns of the [metis] flags it ignores", "[errors][search-sim]") {
  const auto dir = test::scratch_dir("err-metis-flags");
  write(dir / "hostfile", "0.0.0.4 slots=4\n");
  const std::string p = test::analytic_dir(10);
  const test::CommandResult plain = search(dir / "hostfile", p, "--top 1");
  INFO(plain.output);
  REQUIRE(plain.exit_code == 0);
  CHECK(plain.output.find("warning") == std::string::npos);
  const test::CommandResult one = search(dir / "hostfile", p, "--top 1 --use_strat");
  INFO(one.output);
  REQUIRE(one.exit_code == 0);
  CHECK(one.output.find("hetplan: warning: --use_strat acts only under --cost-model metis; the default search "
                        "(--cost-model sim) ignores it\n") != std::string::npos);
  const test::CommandResult three =
      search(dir / "hostfile", p, "--top 1 --trials 3 --max_permute_len 4 --min_group_scale_variance 2");
  INFO(three.output);
  REQUIRE(three.exit_code == 0);
  CHECK(count_of(three.output, "hetplan: warning: ") == 1);
  for (const char* flag : {"--trials", "--max_permute_len", "--min_group_scale_variance"})
    CHECK(three.output.find(flag) != std::string::npos);
  CHECK(three.output.find(" act only under --cost-model metis") != std::string::npos);
  // The same plans as without them; under --cost-model metis they act, with no warning.
  CHECK(three.output.substr(three.output.find("rank, iteration_ms")) ==
        plain.output.substr(plain.output.find("rank, iteration_ms")));
  const test::CommandResult metis = search(dir / "hostfile", p, "--top 1 --trials 2 --cost-model metis");
  INFO(metis.output);
  REQUIRE(metis.exit_code == 0);
  CHECK(metis.output.find("warning") == std::string::npos);
  CHECK(test::run_hetplan("search --help").output.find("ignores them with a warning") != std::string::npos);
}

TEST_CASE("non-JSON profile and missing keys", "[errors]") {
  const auto dir = test::scratch_dir("err-json");
  fs::copy(test::analytic_dir(10), dir / "p", fs::copy_options::overwrite_existing | fs::copy_options::recursive);
  write(dir / "p" / "DeviceType.A100_tp2_bs2.json", "{\"model\": [1, 2\n");
  write(dir / "hostfile", "0.0.0.4 slots=4\n");
  expect_one_line_error(search(dir / "hostfile", (dir / "p").string()),
                        {"DeviceType.A100_tp2_bs2.json: not valid JSON at line 2"});
  write(dir / "p" / "DeviceType.A100_tp2_bs2.json", "{\"execution_time\": {\"forward_backward_time_ms\": 1}}");
  expect_one_line_error(search(dir / "hostfile", (dir / "p").string()),
                        {"DeviceType.A100_tp2_bs2.json: missing key 'execution_time.layer_compute_total_ms'"});
}

TEST_CASE("a GPU count for which no plan exists", "[errors]") {
  const auto dir = test::scratch_dir("err-noplan");
  // 15 GPUs and 3 layers: no split into power-of-two groups of at most 3 stages (8 + 4 + 2 + 1 is 4).
  const test::CommandResult gen =
      test::run_hetplan("gen-profiles --analytic 3 4 --types A100,V100 --out " + (dir / "p3").string());
  REQUIRE(gen.exit_code == 0);
  write(dir / "fifteen", "0.0.0.1 slots=15\n");
  expect_one_line_error(test::run_hetplan("search --hostfile_path " + (dir / "fifteen").string() + " --clusterfile_path " +
                                    test::project_clusterfile() + " --profile_data_path " + (dir / "p3").string() +
                                    " --num_layers 3 --gbs 8 --cost-model metis"),
                        {"fifteen: no plan exists for this cluster (15 GPUs)", "power-of-two device groups"});
  // 1 V100 of 16 GB: nothing fits in memory (the 2.0B-parameter model's weights, gradients and Adam states).
  write(dir / "one", "0.0.0.1 slots=1\n");
  write(dir / "v100-16gb.json",
        "{\"0.0.0.1\": {\"instance_type\": \"V100\", \"inter_bandwidth\": 10, \"intra_bandwidth\": 50, \"memory\": 16}}");
  const std::string cf = (dir / "v100-16gb.json").string();
  expect_one_line_error(search(dir / "one", test::analytic_dir(10), "--cost-model metis", cf),
                        {"no plan exists for this cluster (1 GPUs)", "fits in GPU memory"});
  expect_one_line_error(search(dir / "one", test::analytic_dir(10), "", cf),
                        {"no plan exists for this cluster (1 GPUs, gbs 128)", "fits every rank's memory",
                         "runs out of memory"});
}

// The anytime search's proof (issue 33): best, lower bound and gap in the text and the --json; --gap 0
// proves the optimum (the bound meets the best); a bad --gap is one line naming the flag.
TEST_CASE("search prints best, lower bound and gap, in text and --json, and at gap 0 proves the optimum",
          "[errors][search-sim][anytime]") {
  const auto dir = test::scratch_dir("err-gap");
  write(dir / "eight", "0.0.0.1 slots=4\n0.0.0.4 slots=4\n");
  const test::CommandResult exact =
      search(dir / "eight", test::analytic_dir(10), "--gap 0 --json " + (dir / "exact.json").string());
  INFO(exact.output);
  REQUIRE(exact.exit_code == 0);
  CHECK(exact.output.find("gap: 0.00% (proven optimal)") != std::string::npos);
  std::ifstream in(dir / "exact.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  CHECK(j["best_ms"].get<double>() == j["lower_bound_ms"].get<double>());
  CHECK(j["gap"].get<double>() == 0.0);
  CHECK(j["proven"].get<bool>());
  CHECK_FALSE(j["space_empty"].get<bool>());
  CHECK(j["gap_asked"].get<double>() == 0.0);
  const test::CommandResult loose = search(dir / "eight", test::analytic_dir(10), "--json " + (dir / "loose.json").string());
  REQUIRE(loose.exit_code == 0);
  CHECK(loose.output.find("(proven within --gap 0.01)") != std::string::npos);
  std::ifstream in2(dir / "loose.json");
  const nlohmann::json k = nlohmann::json::parse(in2);
  CHECK(k["gap"].get<double>() <= 0.01 + 1e-9);
  CHECK(k["best_ms"].get<double>() <= j["best_ms"].get<double>() * 1.01 * (1 + 1e-12));
  CHECK(k["lower_bound_ms"].get<double>() <= j["best_ms"].get<double>() * (1 + 1e-12));
  expect_one_line_error(search(dir / "eight", test::analytic_dir(10), "--gap -1"), {"--gap", "from 0"});
}

TEST_CASE("help and good runs exit 0", "[errors]") {
  CHECK(test::run_hetplan("--help").exit_code == 0);
  CHECK(test::run_hetplan("search --help").output.find("--use_strat") != std::string::npos);
  CHECK(test::run_hetplan("nonsense").exit_code != 0);
}

// --stage-boundaries: a bad value is one line; `node` on a small cluster says so on the first line and
// gives plans whose stages are whole nodes (the 4-GPU nodes of the 8-GPU hostfile: 4 or 8 GPUs a stage).
TEST_CASE("search --stage-boundaries: a bad value, and stages of whole nodes", "[errors][plan_search]") {
  const auto dir = test::scratch_dir("err-boundaries");
  write(dir / "eight", "0.0.0.1 slots=4\n0.0.0.4 slots=4\n");
  expect_one_line_error(search(dir / "eight", test::analytic_dir(10), "--stage-boundaries nodes"),
                        {"--stage-boundaries: 'nodes': expected auto, node or rank"});
  const test::CommandResult r = search(dir / "eight", test::analytic_dir(10), "--stage-boundaries node --top 5");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("stages of whole nodes") != std::string::npos);
  std::istringstream lines(r.output);
  int plans = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto open = line.find("), [");
    if (line.empty() || !std::isdigit(static_cast<unsigned char>(line[0])) || open == std::string::npos) continue;
    const std::string groups = line.substr(open + 4, line.find(']', open) - open - 4);
    CHECK((groups == "8" || groups == "4, 4"));
    ++plans;
  }
  CHECK(plans >= 1);
  CHECK(search(dir / "eight", test::analytic_dir(10)).output.find("stages of whole nodes") == std::string::npos);
}
