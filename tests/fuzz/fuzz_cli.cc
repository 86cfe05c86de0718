// libFuzzer target: whole CLI commands (search, simulate, whatif, export,
// gen-hostfile, gen-profiles) run in-process on generated argument lists,
// in a scratch folder that holds a hostfile (h), a clusterfile (c.json), the
// H200 profiles (p/) to point at.
// Input, split at NUL bytes: the argument list (words separated by
// whitespace), then up to four files f1..f4 the arguments may name.
// A word holding '/' or starting with ".." is dropped, so that every path
// stays inside the scratch folder. Exit 3 (internal error) aborts: a finding.
// Each run starts from the same folder: what a command wrote is removed, and
// fixtures a command wrote over are written again.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "cli/app_runner.h"
#include "cli/commands.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace hetplan::fuzz;

// (Re)writes the fixtures into `d`.
void write_fixtures(const fs::path& d) {
  const fs::path repo = HETPLAN_SOURCE_DIR;
  std::error_code ec;
  fs::remove_all(d / "p", ec);
  fs::remove_all(d / "h", ec);
  fs::remove_all(d / "c.json", ec);
  fs::create_directories(d / "p");
  fs::copy_file(repo / "hostfiles/h200_8.hostfile", d / "h");
  fs::copy_file(repo / "hostfiles/clusterfile.json", d / "c.json");
  for (const auto& e : fs::directory_iterator(repo / "profiles/H200")) fs::copy_file(e.path(), d / "p" / e.path().filename());
}

// The fixtures' modification times: a command that wrote over one (--json h, gen-profiles --out p) changes them.
std::vector<fs::file_time_type> stamps(const fs::path& d) {
  std::error_code ec;
  return {fs::last_write_time(d / "h", ec), fs::last_write_time(d / "c.json", ec), fs::last_write_time(d / "p", ec)};
}

// The scratch folder with its fixtures, made once; each command runs inside it (libFuzzer's own relative
// paths, its corpus and artifacts, are read and written from the working directory in between).
const fs::path& work() {
  static const fs::path dir = [] {
    const fs::path d = scratch() / "cli";
    fs::create_directories(d);
    write_fixtures(d);
    // The commands' tables are noise here (their one-line errors go to stderr with libFuzzer's own
    // reports: -close_fd_mask=2 hides both).
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    return d;
  }();
  return dir;
}

std::set<std::string> fixtures() {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(work())) names.insert(e.path().filename().string());
  return names;
}

int run_command(std::vector<std::string> words) {
  CLI::App app{"hetplan", "hetplan"};
  app.require_subcommand(1);
  hetplan::cli::AppRunner runner(app);
  runner.add(hetplan::cli::add_search_command(app));
  runner.add(hetplan::cli::add_gen_hostfile_command(app));
  runner.add(hetplan::cli::add_gen_profiles_command(app));
  runner.add(hetplan::cli::add_simulate_command(app));
  runner.add(hetplan::cli::add_whatif_command(app));
  runner.add(hetplan::cli::add_export_command(app));
  words.insert(words.begin(), "hetplan");
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  return runner.run(static_cast<int>(words.size()), argv.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static const std::set<std::string> kept = (work(), fixtures());
  static std::vector<fs::file_time_type> clean = stamps(work());
  const auto parts = split_nul(data, size, 5);
  std::vector<std::string> words;
  std::istringstream in{std::string(parts[0])};
  for (std::string w; in >> w && words.size() < 40;)
    if (w.find('/') == std::string::npos && w.rfind("..", 0) != 0) words.push_back(w);
  for (std::size_t i = 1; i < parts.size(); ++i) write_file(work() / ("f" + std::to_string(i)), parts[i]);
  const fs::path home = fs::current_path();
  fs::current_path(work());
  const int rc = run_command(words);
  fs::current_path(home);
  if (rc == hetplan::cli::kExitInternalError) std::abort();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(work(), ec))
    if (!kept.count(e.path().filename().string())) fs::remove_all(e.path(), ec);
  if (stamps(work()) != clean) {
    write_fixtures(work());
    clean = stamps(work());
  }
  return 0;
}
