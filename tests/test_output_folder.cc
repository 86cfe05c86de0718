// Outputs stay inside the output folder, and filesystem failures are input
// errors (issue 36): base/file_access.h directly, then through the binary
// (export --to torchrun with a host named ../x, export and whatif --export
// into folders holding symlinks that point outside).
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "fixtures.h"
#include "base/file_access.h"
#include "base/input_error.h"
#include "base/json_util.h"

namespace fs = std::filesystem;
using namespace hetplan;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p.string());
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Every path under `dir`, not following symlinks.
std::set<std::string> tree(const fs::path& dir) {
  std::set<std::string> out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it)
    out.insert(it->path().lexically_relative(dir).string());
  return out;
}

const std::string kRepo = HETPLAN_SOURCE_DIR;

}  // namespace

TEST_CASE("file access: names from user text never leave the folder", "[output]") {
  for (const char* text : {"../x", "../../x", "..", ".", "", "a/b", "/etc/passwd", ".hidden", "a\nb", "x y$(z)"}) {
    const std::string n = safe_file_name(text);
    INFO(text << " -> " << n);
    CHECK(!n.empty());
    CHECK(n.find('/') == std::string::npos);
    CHECK(n[0] != '.');
  }
  CHECK(safe_file_name("10.0.0.1") == "10.0.0.1");
  CHECK(safe_file_name("node-a_1") == "node-a_1");
  const auto dir = test::scratch_dir("file-access-names");
  for (const char* bad : {"../x", "..", ".", "", "a/b"})
    CHECK_THROWS_AS(write_file_in(dir.string(), bad, "x"), InputError);
  CHECK_THROWS_AS(make_subfolder(dir.string(), "../up"), InputError);
}

TEST_CASE("file access: a symlink in the folder is replaced, never followed", "[output]") {
  const auto dir = test::scratch_dir("file-access-symlink");
  fs::remove_all(dir / "out");
  fs::create_directories(dir / "out");
  std::ofstream((dir / "victim").string()) << "precious";
  fs::create_symlink(dir / "victim", dir / "out" / "a.json");
  write_file_in((dir / "out").string(), "a.json", "new");
  CHECK(slurp(dir / "victim") == "precious");
  CHECK(!fs::is_symlink(dir / "out" / "a.json"));
  CHECK(slurp(dir / "out" / "a.json") == "new");
  // A sub-folder that is a symlink to elsewhere is refused.
  fs::create_directory_symlink(dir, dir / "out" / "profiles");
  CHECK_THROWS_WITH(make_subfolder((dir / "out").string(), "profiles"),
                    Catch::Contains("is a symlink (expected a directory inside the output folder"));
  // No temporary file is left behind.
  for (const auto& e : fs::directory_iterator(dir / "out"))
    CHECK(e.path().filename().string().rfind(".hetplan-tmp", 0) == std::string::npos);
}

TEST_CASE("file access: directories, FIFOs, loops and missing files are one-line input errors", "[output]") {
  const auto dir = test::scratch_dir("file-access-kinds");
  fs::remove_all(dir / "k");
  fs::create_directories(dir / "k" / "adir");
  REQUIRE(::mkfifo((dir / "k" / "fifo").c_str(), 0600) == 0);
  fs::create_symlink("loop", dir / "k" / "loop");
  std::ofstream((dir / "k" / "file").string()) << "x";
  const std::string k = (dir / "k").string();
  CHECK_THROWS_WITH(read_regular_file(k + "/adir", 100, "hostfile"), Catch::EndsWith("adir: is a directory (expected a hostfile)"));
  CHECK_THROWS_WITH(read_regular_file(k + "/fifo", 100, "hostfile"), Catch::EndsWith("fifo: is a FIFO (expected a hostfile)"));
  CHECK_THROWS_WITH(read_regular_file(k + "/loop", 100, "hostfile"), Catch::EndsWith("loop: is a symlink loop (expected a hostfile)"));
  CHECK_THROWS_WITH(read_regular_file(k + "/none", 100, "hostfile"), Catch::EndsWith("none: cannot open hostfile: no such file"));
  CHECK_THROWS_WITH(read_regular_file(k + "/file", 0, "JSON file"),
                    Catch::EndsWith("file: file is 1 bytes; hetplan reads a JSON file of at most 0 bytes (0 MiB)"));
  CHECK_THROWS_WITH(make_output_folder(k + "/file/sub"), Catch::Contains("is a regular file (expected a directory)"));
  CHECK_THROWS_WITH(require_directory(k + "/loop", "profile folder"), Catch::EndsWith("is a symlink loop (expected a profile folder)"));
}

TEST_CASE("export --to torchrun: a host named ../x or a symlink inside --out writes nothing outside it", "[output][cli]") {
  const auto dir = test::scratch_dir("export-escape");
  fs::remove_all(dir / "w");
  fs::create_directories(dir / "w" / "out" / "sub");
  fs::create_directories(dir / "w" / "x");
  const fs::path w = dir / "w";
  std::ofstream((w / "hostfile").string()) << "../x slots=4\n../../x slots=4\n";
  const ordered_json node = {{"instance_type", "A100"}, {"inter_bandwidth", 25}, {"intra_bandwidth", 300}, {"memory", 80}};
  write_json_file((w / "clusterfile.json").string(), {{"../x", node}, {"../../x", node}});
  const test::CommandResult g =
      test::run_hetplan("gen-profiles --analytic 10 8 --types A100 --max-tp 1 --out " + (w / "prof").string());
  REQUIRE(g.exit_code == 0);
  const ordered_json plan = {{"node_sequence", {"A100"}}, {"device_groups", {8}}, {"strategies", {{8, 1}}},
                             {"batches", 1}, {"layer_partition", {0, 10}}, {"gbs", 8},
                             {"hostfile", (w / "hostfile").string()}, {"clusterfile", (w / "clusterfile.json").string()},
                             {"profile_dir", (w / "prof").string()},
                             {"model", {{"num_layers", 10}, {"hidden_size", 1024}, {"sequence_length", 1024},
                                        {"vocab_size", 50257}, {"attention_heads", 16}}}};
  write_json_file((w / "plan.json").string(), plan);
  std::ofstream((w / "victim").string()) << "precious";
  fs::create_symlink(w / "victim", w / "out" / "sub" / "hostfile");
  fs::create_symlink(w / "victim", w / "out" / "sub" / "plan.json");
  const std::set<std::string> before = tree(w);
  const test::CommandResult r =
      test::run_hetplan("export --plan " + (w / "plan.json").string() + " --to torchrun --out " + (w / "out" / "sub").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(slurp(w / "victim") == "precious");
  // Everything new is inside out/sub, and the two symlinks are now plain files.
  for (const std::string& p : tree(w))
    if (!before.count(p)) CHECK(p.rfind("out/sub/", 0) == 0);
  CHECK(!fs::is_symlink(w / "out" / "sub" / "hostfile"));
  CHECK(fs::exists(w / "out" / "sub" / "launch_0__._x.sh"));
  CHECK(fs::exists(w / "out" / "sub" / "launch_1__._.._x.sh"));

  // Re-exported into itself, and run from another working directory.
  const test::CommandResult again = test::run_hetplan("export --plan " + (w / "out" / "sub" / "plan.json").string() +
                                                      " --to torchrun --out " + (w / "out" / "sub").string());
  INFO(again.output);
  CHECK(again.exit_code == 0);
  const test::CommandResult sim =
      test::run_shell("cd / && " + std::string(HETPLAN_BINARY) + " simulate --plan " + (w / "out" / "sub" / "plan.json").string());
  INFO(sim.output);
  CHECK(sim.exit_code == 0);
}

TEST_CASE("whatif --export: symlinks inside the folder are replaced, never followed", "[output][cli]") {
  const auto dir = test::scratch_dir("whatif-export-escape");
  fs::remove_all(dir / "w");
  fs::create_directories(dir / "w" / "out");
  const fs::path w = dir / "w";
  std::ofstream((w / "victim").string()) << "precious";
  fs::create_symlink(w / "victim", w / "out" / "plan.json");
  fs::create_symlink(w / "victim", w / "out" / "hostfile");
  const test::CommandResult r = test::run_hetplan("whatif --gpu A100 --gpus 8 --rows DDP --export " + (w / "out").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(slurp(w / "victim") == "precious");
  CHECK(!fs::is_symlink(w / "out" / "plan.json"));
  // A profiles sub-folder that is a symlink out of the folder is refused.
  fs::remove_all(w / "out2");
  fs::create_directories(w / "out2");
  fs::create_directory_symlink(w, w / "out2" / "profiles");
  const test::CommandResult s = test::run_hetplan("whatif --gpu A100 --gpus 8 --rows DDP --export " + (w / "out2").string());
  CHECK(s.exit_code == 2);
  CHECK(s.output.find("is a symlink (expected a directory inside the output folder") != std::string::npos);
}
