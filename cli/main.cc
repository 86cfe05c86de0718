// hetplan: cost simulation and planning of parallel training on
// heterogeneous GPU clusters. One binary, one subcommand per job.
#include <CLI/CLI.hpp>
#include <iostream>
#include <map>

#include "cli/commands.h"
#include "sim/input_error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "hetplan: plan and simulate parallel training on heterogeneous GPU clusters.\n\n"
      "Typical flow:\n"
      "  hetplan gen-hostfile 16 --out hostfile          # 16 V100 + 16 A100, 4 per node\n"
      "  hetplan gen-profiles 10 128 --samples DIR --out profiles   # Metis synthetic set\n"
      "  hetplan search --hostfile_path hostfile --clusterfile_path hostfiles/clusterfile.json \\\n"
      "                 --profile_data_path profiles --num_layers 10 --gbs 128\n",
      "hetplan"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hetplan 0.1.0");
  std::map<CLI::App*, hetplan::cli::Runner> runners;
  auto reg = [&](hetplan::cli::Runner r) { runners[app.get_subcommands({}).back()] = std::move(r); };
  reg(hetplan::cli::add_search_command(app));
  reg(hetplan::cli::add_gen_hostfile_command(app));
  reg(hetplan::cli::add_gen_profiles_command(app));
  reg(hetplan::cli::add_simulate_command(app));
  reg(hetplan::cli::add_whatif_command(app));
#if defined(HETPLAN_WITH_TORCH)
  reg(hetplan::cli::add_profile_command(app, argc, argv));
  reg(hetplan::cli::add_replay_command(app, argc, argv));
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const hetplan::InputError& e) {
    std::cerr << "hetplan: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "hetplan: internal error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
