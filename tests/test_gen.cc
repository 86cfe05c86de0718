// Input generators: gen-hostfile, gen-profiles (synthetic and --analytic),
// the hostfile parser and Python-style float formatting. Synthetic values
// were read from the files the reference's gen_synth_data.py writes
// (livingshade/Metis @ 900445f) for LAYERS = 10 and 40, MAX_BS = 128.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "metis/metis_search.h"
#include "sim/analytic_profiles.h"
#include "sim/gpu_specs.h"
#include "sim/layer_time_model.h"
#include "base/json_util.h"
#include "tests/fixtures.h"

using namespace hetplan;

TEST_CASE("gen-hostfile writes the reference's gen_hostfile.py text", "[gen]") {
  std::string want;
  for (int i = 0; i < 4; ++i) want += "0.0.0.1 slots=4\n";
  for (int i = 0; i < 4; ++i) want += "0.0.0.4 slots=4\n";
  CHECK(make_hostfile(16, {"0.0.0.1", "0.0.0.4"}, 4) == want);
  CHECK(make_hostfile(3, {"0.0.0.1", "0.0.0.4"}, 4).empty());
  CHECK(make_hostfile(32, {"a"}, 16) == "a slots=16\na slots=16\n");
}

TEST_CASE("hostfile parser reads multi-digit slots, comments and blank lines", "[gen][cluster]") {
  const auto path = test::scratch_dir("hosts") / "hostfile";
  std::ofstream(path) << "# two big nodes\n0.0.0.4 slots=16\n\n0.0.0.1   slots=12   # V100 box\n";
  const auto hosts = parse_hostfile(path.string());
  REQUIRE(hosts.size() == 2);
  CHECK(hosts[0] == std::make_pair(std::string("0.0.0.4"), 16));
  CHECK(hosts[1] == std::make_pair(std::string("0.0.0.1"), 12));
  const Cluster c = Cluster::load(path.string(), test::project_clusterfile());
  CHECK(c.num_devices() == 28);
  CHECK(c.num_devices_of(c.type_index("A100")) == 16);
  CHECK(c.memory_mb(c.type_index("A100")) == 80 * 1024);
  CHECK(c.first_intra_bandwidth(c.type_index("A100")) == 300);
}

TEST_CASE("gen-profiles reproduces gen_synth_data.py values", "[gen]") {
  REQUIRE_SHARED_DATA();
  const ProfileSet& p10 = test::synthetic_profiles(10);
  const int A = p10.type_index("A100"), V = p10.type_index("V100");
  REQUIRE(p10.entries().size() == 128);  // 2 types x tp {1..128} x bs {1..128}
  for (int tp = 1; tp <= 128; tp *= 2)
    for (int bs = 1; bs <= 128; bs *= 2) {
      CHECK(p10.find(A, tp, bs) != nullptr);
      CHECK(p10.find(V, tp, bs) != nullptr);
    }
  const std::string dir = test::synthetic_dir(10);
  auto file = [&](const std::string& name) { return read_json_file(dir + "/" + name); };

  const ordered_json a11 = file("DeviceType.A100_tp1_bs1.json");
  CHECK(a11["execution_time"]["between_forward_backward_time_ms"].get<double>() == 56.03322982788086);
  CHECK(a11["model"]["num_MHA_layers"].get<int>() == 8);
  const ordered_json a1128 = file("DeviceType.A100_tp1_bs128.json");
  CHECK(a1128["execution_time"]["layer_compute_total_ms"][1].get<double>() == 3730.1025390625);
  CHECK(a1128["execution_time"]["total_time_ms"].get<double>() == 36647.91805744171);
  const ordered_json v816 = file("DeviceType.V100_tp8_bs16.json");
  CHECK(v816["execution_time"]["total_time_ms"].get<double>() == 2391.290545463562);
  CHECK(v816["execution_time"]["layer_compute_total_ms"][9].get<double>() == 4.75311279296875);
  const ordered_json v128 = file("DeviceType.V100_tp128_bs128.json");
  CHECK(v128["execution_time"]["forward_backward_time_ms"].get<double>() == 1173.5323667526245);
  CHECK(v128["execution_memory"]["total_memory"].get<long long>() == 53120);

  const std::string dir40 = test::synthetic_dir(40);
  const ordered_json a40 = read_json_file(dir40 + "/DeviceType.A100_tp1_bs1.json");
  CHECK(a40["model"]["parameters"]["total_parameters_bytes"].get<long long>() == 8477003776LL);
  CHECK(a40["model"]["parameters"]["total_parameters_bytes"].is_number_integer());
  CHECK(a40["execution_time"]["optimizer_time_ms"].get<double>() == 157.23590850830078);
  CHECK(a40["execution_time"]["layernorm_grads_all_reduce_time_ms"].get<double>() == 0.0812530517578125);
  CHECK(a40["execution_memory"]["total_memory"].get<long long>() == 177500);
  CHECK(a40["execution_memory"]["layer_memory_total_mb"].size() == 40);
}

TEST_CASE("floats are written as Python's repr", "[gen][json]") {
  // Values where the shortest round-trip digits end in a tie that Python
  // resolves to the closer decimal (nlohmann's dump writes ...313).
  CHECK(python_float(10.814285278320312) == "10.814285278320312");
  CHECK(python_float(116.56570434570312) == "116.56570434570312");
  CHECK(python_float(1795.3124791383743) == "1795.3124791383743");
  CHECK(python_float(2.0) == "2.0");
  CHECK(python_float(0.0001) == "0.0001");
  CHECK(python_float(0.00001) == "1e-05");
  CHECK(python_float(1e16) == "1e+16");
  CHECK(python_float(1234567890123456.0) == "1234567890123456.0");
  CHECK(python_float(-3.5) == "-3.5");
  ordered_json j = {{"a", {1, 2.5}}, {"b", ordered_json::object()}, {"c", ordered_json::array()}};
  CHECK(dump_python_style(j) == "{\n  \"a\": [\n    1,\n    2.5\n  ],\n  \"b\": {},\n  \"c\": []\n}");
}

TEST_CASE("analytic profiles: roofline estimates that the planner can search", "[gen][analytic]") {
  AnalyticOptions o;
  o.model.num_layers = 6;
  o.max_tp = 4;
  o.max_bs = 16;
  const auto dir = test::scratch_dir("analytic");
  const auto written = generate_analytic_profiles(o, dir.string());
  CHECK(written.size() == 2 * 3 * 5);
  const ordered_json j = read_json_file((dir / "DeviceType.A100_tp1_bs1.json").string());
  CHECK(j["estimate"]["method"] == "layer time model on datasheet rates (sim/layer_time_model.h)");

  // A transformer block of the Table-1 shape at bs 1, tp 1 on an A100: the layer time model on the
  // catalogue's A100 (sim/layer_time_model.h), GEMMs near the large-GEMM efficiency, so at least the
  // FLOP-bound time 3 x (24 b s h^2 + 4 b s^2 h) / (312 TFLOP/s x 0.72).
  const ModelShape shape = shape_from_model_config(o.model);
  const KernelClassTimes c = analytic_layer_classes(
      shape, 1, 1, 1024, 1, Recompute::kNone, catalogue_rates("A100", ComputePrecision::kBf16, RateDefaults{}, "test"));
  CHECK(j["execution_time"]["layer_compute_total_ms"][1].get<double>() == Approx(c.layer_ms()).epsilon(1e-12));
  const double b = 1, s = 1024, h = 4096;
  CHECK(c.layer_ms() > 3 * (24 * b * s * h * h + 4 * b * s * s * h) / (312e12 * 0.72) * 1e3);
  // The file records the model it was made for.
  CHECK(j["model"]["hidden_size"] == 4096);
  // V100 is slower than A100 for the same layer.
  const ordered_json v = read_json_file((dir / "DeviceType.V100_tp1_bs1.json").string());
  CHECK(v["execution_time"]["layer_compute_total_ms"][1].get<double>() >
        j["execution_time"]["layer_compute_total_ms"][1].get<double>());

  const ProfileSet profiles = ProfileSet::load(dir.string(), 6);
  SearchOptions so;
  so.model.num_layers = 6;
  so.gbs = 16;
  so.max_profiled_tp = 4;
  so.max_profiled_bs = 16;
  so.max_permute_len = 128;
  std::vector<std::pair<std::string, int>> hosts = {{"0.0.0.1", 4}, {"0.0.0.4", 4}};
  const Cluster cluster =
      Cluster::from_parts(hosts, parse_clusterfile(std::string(HETPLAN_SOURCE_DIR) + "/hostfiles/clusterfile.json"));
  const SearchResult r = MetisSearch(cluster, profiles, so).run();
  REQUIRE(!r.top.empty());
  CHECK(r.top[0].cost > 0);
  CHECK(r.count > 0);
}
