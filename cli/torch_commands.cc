// libhetplan_torch.so: the LibTorch subcommands (profile, replay, gpu-probe), loaded by
// the hetplan binary only when one of them runs. LibTorch's device failures (CUDA, NCCL,
// Gloo: profiler/device_failure.h) are reported as environment errors (exit 5).
#include "cli/app_runner.h"
#include "profiler/device_failure.h"

extern "C" int hetplan_torch_main(int argc, char** argv) {
  CLI::App app{"hetplan: LibTorch subcommands", "hetplan"};
  app.require_subcommand(1);
  app.footer(hetplan::cli::kExitCodesHelp);
  hetplan::cli::AppRunner runner(app);
  runner.recognise_environment_failures(hetplan::device_failure);
  runner.add(hetplan::cli::add_profile_command(app, argc, argv));
  runner.add(hetplan::cli::add_replay_command(app, argc, argv));
  runner.add(hetplan::cli::add_probe_command(app));
  return runner.run(argc, argv);
}
