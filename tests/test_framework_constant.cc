// The framework constant (CUDA context and library workspaces) that
// `hetplan profile` records in execution_memory.framework_mb reaches the
// simulator's per-rank memory, per device type; without it the constant is
// the documented default (sim/device_memory.h, 767 MiB).
#include <catch2/catch.hpp>
#include <filesystem>

#include "metis/metis_search.h"
#include "base/json_util.h"
#include "sim/device_memory.h"
#include "sim/model_shape.h"
#include "sim/plan_simulator.h"
#include "tests/fixtures.h"

namespace fs = std::filesystem;
using namespace hetplan;

namespace {

PlanSimulation simulate_best(const ProfileSet& profiles, const Cluster& cluster) {
  const SearchOptions o = test::analytic_search_options(10);
  const SearchResult r = MetisSearch(cluster, profiles, o).run();
  REQUIRE(!r.top.empty());
  SimulationOptions so;
  so.setup.framework_bytes = -1;  // from the profiles
  const PlanSimulator sim(cluster, profiles, shape_from_model_config(o.model), o.model.sequence_length, so);
  return sim.simulate(r.top[0], o.gbs);
}

}  // namespace

TEST_CASE("profiles' framework_mb sets each rank's framework memory", "[memory][profiles]") {
  const auto dir = test::scratch_dir("framework") / "p";
  fs::remove_all(dir);
  fs::copy(test::analytic_dir(10), dir, fs::copy_options::recursive);
  for (auto [type, mb] : {std::pair<std::string, double>{"A100", 700.5}, {"V100", 900.0}}) {
    const std::string f = (dir / ("DeviceType." + type + "_tp1_bs1.json")).string();
    ordered_json j = read_json_file(f);
    j["execution_memory"]["framework_mb"] = mb;
    write_json_file(f, j);
  }
  const ProfileSet with = ProfileSet::load(dir.string(), 10);
  CHECK(with.framework_mb(with.type_index("A100")) == 700.5);
  CHECK(with.framework_mb(with.type_index("V100")) == 900.0);
  const ProfileSet& without = test::analytic_profiles(10);
  CHECK(without.framework_mb(0) == -1);

  const Cluster cluster = test::project_cluster(16);
  const PlanSimulation a = simulate_best(with, cluster);
  const PlanSimulation b = simulate_best(without, cluster);
  REQUIRE(a.ranks.size() == 32);
  REQUIRE(b.ranks.size() == 32);
  for (std::size_t i = 0; i < a.ranks.size(); ++i) {
    const double want = (a.ranks[i].device == "A100" ? 700.5 : 900.0) * 1024 * 1024;
    CHECK(a.ranks[i].breakdown.framework == want);
    const double fallback = DeviceMemoryOptions().default_framework_bytes;
    CHECK(b.ranks[i].breakdown.framework == fallback);
    CHECK(a.ranks[i].breakdown.gpu_total() - b.ranks[i].breakdown.gpu_total() ==
          Approx(want - fallback).epsilon(1e-9));
  }
}
