// hetplan: cost simulation and planning of parallel training on
// heterogeneous GPU clusters. One binary, one subcommand per job.
//
// `profile` and `replay` need LibTorch, whose start-up costs about half a
// second; they live in libhetplan_torch.so next to the binary and are loaded
// only when asked for, so the planner and simulator start instantly.
#include <dlfcn.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "cli/app_runner.h"

namespace {

int run_torch_command([[maybe_unused]] int argc, char** argv) {
#if defined(HETPLAN_TORCH_PLUGIN)
  std::string dir = ".";
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    dir = std::string(self).substr(0, std::string(self).rfind('/'));
  }
  void* lib = dlopen((dir + "/" HETPLAN_TORCH_PLUGIN).c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!lib) lib = dlopen(HETPLAN_TORCH_PLUGIN, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    std::cerr << "hetplan: environment error: cannot load " << HETPLAN_TORCH_PLUGIN << " (needed by '" << argv[1]
              << "'): " << dlerror() << "\n";
    return hetplan::cli::kExitEnvironmentError;
  }
  using Main = int (*)(int, char**);
  auto entry = reinterpret_cast<Main>(dlsym(lib, "hetplan_torch_main"));
  if (!entry) {
    std::cerr << "hetplan: environment error: " << HETPLAN_TORCH_PLUGIN << " has no hetplan_torch_main\n";
    return hetplan::cli::kExitEnvironmentError;
  }
  return entry(argc, argv);
#else
  std::cerr << "hetplan: environment error: '" << argv[1] << "' needs LibTorch, and this hetplan was built without "
            << "it (install libtorch-dev and rebuild)\n";
  return hetplan::cli::kExitEnvironmentError;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "profile") == 0 || std::strcmp(argv[1], "replay") == 0 ||
                   std::strcmp(argv[1], "gpu-probe") == 0))
    return run_torch_command(argc, argv);
  CLI::App app{
      "hetplan: plan and simulate parallel training on heterogeneous GPU clusters.\n\n"
      "Typical flow:\n"
      "  hetplan gen-hostfile 16 --out hostfile          # 16 V100 + 16 A100, 4 per node\n"
      "  hetplan gen-profiles 10 128 --samples DIR --out profiles   # Metis synthetic set\n"
      "  hetplan search --hostfile_path hostfile --clusterfile_path hostfiles/clusterfile.json \\\n"
      "                 --profile_data_path profiles --num_layers 10 --gbs 128\n"
      "  hetplan simulate --plan plan.json      hetplan replay --plan plan.json\n",
      "hetplan"};
  app.require_subcommand(1);
  app.footer(hetplan::cli::kExitCodesHelp);
  app.set_version_flag("--version", "hetplan 0.1.0");
  hetplan::cli::AppRunner runner(app);
  // Where argv[1] names a subcommand, only that one is built: all of them, with their dozens of options
  // and help texts, took about a millisecond, a tenth of a small search's wall time. Otherwise (--help,
  // --version, anything else) all are, for the list in the help.
  struct Command {
    const char* name;
    hetplan::cli::Runner (*add)(CLI::App&);
  };
  static constexpr Command kCommands[] = {
      {"search", hetplan::cli::add_search_command},     {"gen-hostfile", hetplan::cli::add_gen_hostfile_command},
      {"gen-profiles", hetplan::cli::add_gen_profiles_command}, {"simulate", hetplan::cli::add_simulate_command},
      {"whatif", hetplan::cli::add_whatif_command},     {"export", hetplan::cli::add_export_command},
      {"report", hetplan::cli::add_report_command},
  };
  const char* chosen = nullptr;
  for (const Command& c : kCommands)
    if (argc > 1 && std::strcmp(argv[1], c.name) == 0) chosen = c.name;
  for (const Command& c : kCommands)
    if (!chosen || c.name == chosen) runner.add(c.add(app));
  if (!chosen) {
    // Listed for --help; run through run_torch_command above.
    app.add_subcommand("profile", "Measure per-layer time and memory with LibTorch (see `hetplan profile --help`)");
    app.add_subcommand("replay", "Run a plan on local GPUs and compare with its prediction (see `hetplan replay --help`)");
    app.add_subcommand("gpu-probe", "GEMM and memory speed of this GPU restricted to N SMs (see `hetplan gpu-probe --help`)");
  }
  return runner.run(argc, argv);
}
