// libhetplan_torch.so: the LibTorch subcommands (profile, replay, gpu-probe), loaded by
// the hetplan binary only when one of them runs.
#include "cli/app_runner.h"

extern "C" int hetplan_torch_main(int argc, char** argv) {
  CLI::App app{"hetplan: LibTorch subcommands", "hetplan"};
  app.require_subcommand(1);
  hetplan::cli::AppRunner runner(app);
  runner.add(hetplan::cli::add_profile_command(app, argc, argv));
  runner.add(hetplan::cli::add_replay_command(app, argc, argv));
  runner.add(hetplan::cli::add_probe_command(app));
  return runner.run(argc, argv);
}
