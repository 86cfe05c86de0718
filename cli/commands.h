// The subcommands of the `hetplan` binary. Each registers its options on the
// CLI11 app and runs when chosen; all input errors surface as InputError.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace hetplan::cli {

// Registers a subcommand; returns the function that runs it (exit code).
using Runner = std::function<int()>;

Runner add_search_command(CLI::App& app);
Runner add_gen_hostfile_command(CLI::App& app);
Runner add_gen_profiles_command(CLI::App& app);
Runner add_simulate_command(CLI::App& app);
Runner add_report_command(CLI::App& app);
// `simulate --plan PLAN --report OUT` with the plan's own settings, the replay's measurements in the
// report when `replay` is not empty (cli/sim_commands.cc; the work of `hetplan report`).
int run_simulate_with_report(const std::string& plan, const std::string& replay, const std::string& out,
                             const std::string& hf_config = "");
Runner add_whatif_command(CLI::App& app);
Runner add_export_command(CLI::App& app);
// In libhetplan_torch.so (cli/torch_commands.cc).
Runner add_profile_command(CLI::App& app, int argc, char** argv);
Runner add_replay_command(CLI::App& app, int argc, char** argv);
Runner add_probe_command(CLI::App& app);

}  // namespace hetplan::cli
