// libFuzzer target: an exported plan folder, as `export --to torchrun` and
// `whatif --export` write it and `simulate --plan DIR/plan.json` reads it:
// plan.json naming its hostfile, clusterfile and profile folder relative to
// the folder, and whatif_calibration.json in the profile folder.
// Input, split at NUL bytes: plan.json, hostfile, clusterfile.json,
// whatif_calibration.json, then pairs of (profile file name, contents).
// The folder is read from another working directory, as a user would.
#include "sim/cluster.h"
#include "sim/plan_file.h"
#include "sim/profile.h"
#include "sim/whatif.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace hetplan::fuzz;
  const auto parts = split_nul(data, size, 4 + 2 * 8);
  const fs::path dir = scratch() / "export";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir / "profiles", ec);
  const char* const fixed[] = {"plan.json", "hostfile", "clusterfile.json", "profiles/whatif_calibration.json"};
  for (std::size_t i = 0; i < parts.size() && i < 4; ++i) write_file(dir / fixed[i], parts[i]);
  for (std::size_t i = 4; i + 1 < parts.size(); i += 2) {
    const std::string name(parts[i]);
    // Names stay inside the folder: one plain component.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) continue;
    write_file(dir / "profiles" / name, parts[i + 1]);
  }
  run_reader([&] {
    const hetplan::PlanFile pf = hetplan::read_plan_file((dir / "plan.json").string());
    if (!pf.hostfile.empty() && !pf.clusterfile.empty()) hetplan::Cluster::load(pf.hostfile, pf.clusterfile);
    if (!pf.profile_dir.empty()) {
      hetplan::read_whatif_calibration(pf.profile_dir);
      hetplan::ProfileSet::load(pf.profile_dir, pf.model.num_layers, 1);
    }
  });
  return 0;
}
