// Runs a CLI11 app whose subcommands each have a Runner: parses, runs the
// chosen one, and turns errors into one line on stderr and an exit code
// (kExitCodesHelp, shown in --help):
//   0  success (and --help, --version)
//   2  bad input: an InputError, a flag CLI11 cannot parse, or a filesystem failure ("hetplan: error: ...")
//   3  internal error: any other exception, a bug in hetplan
//   4  out of memory (std::bad_alloc): the inputs ask for more memory than the
//      machine has; the line says what to shrink
//   5  environment: an EnvironmentError, or an exception the recogniser set with
//      recognise_environment_failures() names (no GPU, CUDA, NCCL or Gloo cannot
//      start): "hetplan: environment error: ..."
// Only these two types are bad input or the environment: nothing deeper turns
// other exceptions into them. Thread-safety: one thread; the app outlives it.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <new>
#include <string>

#include "cli/commands.h"
#include "sim/environment_error.h"
#include "base/input_error.h"

namespace hetplan::cli {

inline constexpr int kExitInputError = 2;
inline constexpr int kExitInternalError = 3;
inline constexpr int kExitOutOfMemory = 4;
inline constexpr int kExitEnvironmentError = 5;

inline constexpr const char* kExitCodesHelp =
    "Exit codes: 0 success; 2 bad input (a file, key or flag); 3 internal error (a bug: please report it);\n"
    "4 out of memory; 5 environment (no GPU, or CUDA, NCCL or Gloo cannot start).";

// Where an exception that is not an EnvironmentError is still a failure of the machine (LibTorch's CUDA,
// NCCL or Gloo errors): its one-line reason; "" where it is not.
using EnvironmentFailure = std::function<std::string(const std::exception&)>;

class AppRunner {
 public:
  explicit AppRunner(CLI::App& app) : app_(app) {}
  // Call right after the add_*_command that created the subcommand.
  void add(Runner r) { runners_[app_.get_subcommands({}).back()] = std::move(r); }
  // Exceptions that `recognise` names are reported as environment errors (exit 5).
  void recognise_environment_failures(EnvironmentFailure recognise) { recognise_ = std::move(recognise); }

  int run(int argc, char** argv) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // --help and --version are "errors" with exit code 0: let CLI11 print them.
      if (e.get_exit_code() == 0) return app_.exit(e);
      std::cerr << "hetplan: error: " << excerpt(e.what(), 200) << " (see --help)\n";
      return kExitInputError;
    }
    try {
      for (auto& [sub, run] : runners_)
        if (sub->parsed()) return run();
    } catch (const InputError& e) {
      std::cerr << "hetplan: error: " << e.what() << "\n";
      return kExitInputError;
    } catch (const std::filesystem::filesystem_error& e) {
      // Readers and writers report filesystem failures as InputErrors (base/file_access.h); this is the
      // net under any path they missed: still the user's filesystem, still one line.
      const std::string path = e.path1().empty() ? std::string() : excerpt(e.path1().string(), 200) + ": ";
      std::cerr << "hetplan: error: " << path << excerpt(e.code().message(), 200) << "\n";
      return kExitInputError;
    } catch (const EnvironmentError& e) {
      return environment_error(e.what());
    } catch (const std::bad_alloc&) {
      std::cerr << "hetplan: error: out of memory: the inputs ask for more memory than this machine has; use a "
                   "smaller --gbs, fewer GPUs in the hostfile, fewer layers or profile files, or a smaller --top / "
                   "--max_permute_len\n";
      return kExitOutOfMemory;
    } catch (const std::exception& e) {
      const std::string why = recognise_ ? recognise_(e) : std::string();
      if (!why.empty()) return environment_error(why);
      std::cerr << "hetplan: internal error: " << excerpt(e.what(), 400) << "\n";
      return kExitInternalError;
    }
    return 0;
  }

 private:
  static int environment_error(const std::string& why) {
    std::cerr << "hetplan: environment error: " << excerpt(why, 400) << "\n";
    return kExitEnvironmentError;
  }

  CLI::App& app_;
  std::map<CLI::App*, Runner> runners_;
  EnvironmentFailure recognise_;
};

}  // namespace hetplan::cli
