// The HTML report (sim/report.h): one lane per rank in the timeline, one
// memory bar per rank split in five parts against its capacity, user strings
// escaped, predicted against measured from a replay; `hetplan report` and
// `simulate --report` write it.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/model_shape.h"
#include "sim/plan_simulator.h"
#include "sim/report.h"
#include "tests/fixtures.h"

namespace fs = std::filesystem;
using namespace hetplan;

namespace {

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Two V100 nodes then two A100 nodes (16 GPUs); stage 0 = the 8 V100s at (dp 2, tp 4) with layers
// [0, 4), stage 1 = the 8 A100s at (dp 2, tp 4) with [4, 10); 8 micro-batches of a batch of 64.
struct HeterogeneousPlan {
  Cluster cluster = test::project_cluster(8);
  PlanResult plan{{"V100", "A100"}, {8, 8}, {{2, 4}, {2, 4}}, 8, {0, 4, 10}, 0, 0};

  PlanSimulation run() const {
    const SearchOptions o = test::analytic_search_options(10);
    const PlanSimulator sim(cluster, test::analytic_profiles(10), shape_from_model_config(o.model),
                            o.model.sequence_length, SimulationOptions{});
    return sim.simulate(plan, 64);
  }
};

}  // namespace

TEST_CASE("report: one timeline lane and one memory bar per rank, hosts and values", "[report]") {
  const HeterogeneousPlan p;
  const PlanSimulation sim = p.run();
  REQUIRE(sim.ranks.size() == 16);
  const std::vector<std::string> hosts = rank_hosts(p.cluster, p.plan);
  REQUIRE(hosts.size() == 16);
  CHECK(hosts[0] == "0.0.0.1");
  CHECK(hosts[7] == "0.0.0.1");
  CHECK(hosts[8] == "0.0.0.4");
  const ReportInput in{"plan.json", "1f1b", &sim, hosts, nullptr};
  const std::string html = report_html(in);
  CHECK(count_of(html, "<g class=\"lane\"") == 16);
  CHECK(count_of(html, "<g class=\"membar\"") == 16);
  for (int r = 0; r < 16; ++r) {
    CHECK(count_of(html, "<g class=\"lane\" data-rank=\"" + std::to_string(r) + "\"") == 1);
    CHECK(count_of(html, "<g class=\"membar\" data-rank=\"" + std::to_string(r) + "\"") == 1);
  }
  // Every rank's lane shows its stage's 8 forwards and 8 backwards.
  CHECK(count_of(html, "<rect class=\"forward\"") == 16 * 8);
  CHECK(count_of(html, "<rect class=\"backward\"") == 16 * 8);
  // Seven parts a bar (sim/device_memory.h's reserve and NCCL too), a capacity line each.
  for (const char* part : {"weights", "gradients", "optimizer", "activations", "reserve", "framework", "nccl"})
    CHECK(count_of(html, std::string("<rect class=\"mem-") + part + "\"") == 16);
  CHECK(count_of(html, "<line class=\"capacity\"") == 16);
  // Each bar's total against its GPU's capacity (32 GB V100s, 80 GB A100s in the clusterfile).
  const double gib = 1024.0 * 1024 * 1024;
  CHECK(sim.ranks[0].capacity_bytes == 32 * gib);
  CHECK(sim.ranks[15].capacity_bytes == 80 * gib);
  for (const auto& r : {sim.ranks[0], sim.ranks[15]})
    CHECK(html.find(">" + fixed(r.breakdown.gpu_total() / gib, 2) + " / " + fixed(r.capacity_bytes / gib, 1) +
                    " GiB") != std::string::npos);
  // The plan table: one row per stage with its hosts; the summary's iteration time.
  CHECK(html.find("<td>0\u20137</td><td>0.0.0.1</td>") != std::string::npos);
  CHECK(html.find("<td>8\u201315</td><td>0.0.0.4</td>") != std::string::npos);
  CHECK(html.find("iteration <b>" + fixed(sim.timeline.iteration_ms, 3) + " ms</b>") != std::string::npos);
  CHECK(html.find("Predicted against measured") == std::string::npos);
  // Self-contained: nothing loaded from elsewhere.
  CHECK(html.find("src=") == std::string::npos);
  CHECK(html.find("href=") == std::string::npos);
  CHECK(html.find("@import") == std::string::npos);
}

TEST_CASE("report: user strings are escaped", "[report]") {
  const HeterogeneousPlan p;
  const PlanSimulation sim = p.run();
  std::vector<std::string> hosts(16, "a<b>&\"c'");
  const ReportInput in{"<script>alert('x')</script> & \"plan\"", "1f1b", &sim, hosts, nullptr};
  const std::string html = report_html(in);
  CHECK(html.find("<script>alert") == std::string::npos);
  CHECK(html.find("<h1>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;plan&quot;</h1>") !=
        std::string::npos);
  CHECK(count_of(html, "a&lt;b&gt;&amp;&quot;c&#39;") >= 16 * 2);  // each rank's lane and bar label
  CHECK(html.find("a<b>") == std::string::npos);
  CHECK(html_escape("plain 1.0") == "plain 1.0");
  // The page's one script is its own.
  CHECK(count_of(html, "<script>") == 1);
}

TEST_CASE("report: predicted against measured from a replay's JSON", "[report]") {
  const HeterogeneousPlan p;
  const PlanSimulation sim = p.run();
  const auto dir = test::scratch_dir("report-replay");
  const double measured_ms = 2 * sim.timeline.iteration_ms;
  ordered_json replay = {{"iteration_ms", {{"median", measured_ms}, {"min", measured_ms}, {"max", measured_ms}}},
                         {"predicted_ms", 12.5},
                         {"ranks", ordered_json::array()}};
  for (int r = 0; r < 16; r += 5) replay["ranks"].push_back({{"rank", r}, {"peak_memory_mb", 1024.0 * (r + 1)}});
  write_json_file((dir / "replay.json").string(), replay);
  const MeasuredRun m = read_replay_json((dir / "replay.json").string());
  CHECK(m.iteration_ms == measured_ms);
  CHECK(m.predicted_ms == 12.5);
  REQUIRE(m.rank_peak_mb.size() == 16);
  CHECK(m.rank_peak_mb[5] == 6 * 1024.0);
  CHECK(m.rank_peak_mb[1] == -1);
  const ReportInput in{"plan.json", "1f1b", &sim, rank_hosts(p.cluster, p.plan), &m};
  const std::string html = report_html(in);
  // Measured twice the prediction: (measured - predicted) / measured = 50%.
  CHECK(html.find("<td>iteration ms</td><td class=\"n\">" + fixed(sim.timeline.iteration_ms, 3) +
                  "</td><td class=\"n\">" + fixed(measured_ms, 3) + "</td><td class=\"n\">50.0%</td>") !=
        std::string::npos);
  CHECK(count_of(html, "<path class=\"measured\"") == 4);  // ranks 0, 5, 10, 15
  CHECK(html.find("<td>rank 10 peak allocated GiB</td><td class=\"n\">" +
                  fixed(sim.ranks[10].breakdown.allocated_peak() / (1024.0 * 1024 * 1024), 2) +
                  "</td><td class=\"n\">11.00</td>") != std::string::npos);
  // A replay without the median is refused, naming the file and key.
  write_json_file((dir / "bad.json").string(), {{"iteration_ms", {{"min", 1.0}}}});
  try {
    read_replay_json((dir / "bad.json").string());
    FAIL("expected an InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("bad.json: missing key 'iteration_ms.median'") != std::string::npos);
  }
}

TEST_CASE("hetplan report and simulate --report write the page", "[report][cli]") {
  const auto dir = test::scratch_dir("report-cli");
  const std::string search = "search -q --hostfile " + std::string(HETPLAN_SOURCE_DIR) +
                             "/hostfiles/a100_v100_16.hostfile --clusterfile " + test::project_clusterfile() +
                             " --profiles " + test::analytic_dir(10) + " --num_layers 10 --gbs 64 --top 1 --json " +
                             (dir / "plan.json").string();
  REQUIRE(test::run_hetplan(search).exit_code == 0);
  const ordered_json plan = read_json_file((dir / "plan.json").string());
  int ranks = 0;
  for (const auto& g : plan["best"]["device_groups"]) ranks += g.get<int>();
  const test::CommandResult r =
      test::run_hetplan("report --plan " + (dir / "plan.json").string() + " --out " + (dir / "r.html").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("report: " + (dir / "r.html").string()) != std::string::npos);
  const test::CommandResult s = test::run_hetplan("simulate --plan " + (dir / "plan.json").string() + " --report " +
                                                  (dir / "s.html").string());
  REQUIRE(s.exit_code == 0);
  auto read = [](const fs::path& f) {
    std::ostringstream text;
    text << std::ifstream(f).rdbuf();
    return text.str();
  };
  const std::string page = read(dir / "r.html");
  CHECK(count_of(page, "<g class=\"lane\"") == ranks);
  CHECK(page == read(dir / "s.html"));
  // A broken replay: one line, exit 2, nothing simulated.
  std::ofstream(dir / "broken.json") << "{\"ranks\": []}";
  const test::CommandResult b = test::run_hetplan("report --plan " + (dir / "plan.json").string() + " --replay " +
                                                  (dir / "broken.json").string() + " --out " + (dir / "b.html").string());
  CHECK(b.exit_code == 2);
  CHECK(b.output.find("broken.json: missing key 'iteration_ms'") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "b.html"));
}
