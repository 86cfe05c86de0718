// Runs a CLI11 app whose subcommands each have a Runner: parses, runs the
// chosen one, and turns errors into one line on stderr and an exit code
// (2 for bad input, 3 for internal errors).
#pragma once

#include <CLI/CLI.hpp>
#include <iostream>
#include <map>

#include "cli/commands.h"
#include "sim/input_error.h"

namespace hetplan::cli {

class AppRunner {
 public:
  explicit AppRunner(CLI::App& app) : app_(app) {}
  // Call right after the add_*_command that created the subcommand.
  void add(Runner r) { runners_[app_.get_subcommands({}).back()] = std::move(r); }

  int run(int argc, char** argv) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app_.exit(e);
    }
    try {
      for (auto& [sub, run] : runners_)
        if (sub->parsed()) return run();
    } catch (const InputError& e) {
      std::cerr << "hetplan: error: " << e.what() << "\n";
      return 2;
    } catch (const std::exception& e) {
      std::cerr << "hetplan: internal error: " << e.what() << "\n";
      return 3;
    }
    return 0;
  }

 private:
  CLI::App& app_;
  std::map<CLI::App*, Runner> runners_;
};

}  // namespace hetplan::cli
