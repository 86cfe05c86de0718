// `hetplan simulate` and `hetplan whatif` run end to end through the real
// binary: a searched plan simulates, the trace has replay's span names, and
// bad input ends in one line with exit code 2.

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/json_util.h"
#include "tests/fixtures.h"

namespace fs = std::filesystem;
using namespace hetplan;

namespace {

std::string hf(const std::string& name) { return std::string(HETPLAN_SOURCE_DIR) + "/tests/data/hf/" + name; }

// A 16-GPU (8 V100 + 8 A100) search with the 10-layer analytic profiles; returns the plans file.
fs::path searched_plans() {
  const auto dir = test::scratch_dir("sim-cli");
  const fs::path plans = dir / "plans.json";
  if (fs::exists(plans)) return plans;
  std::ofstream(dir / "hostfile") << "0.0.0.1 slots=4\n0.0.0.1 slots=4\n0.0.0.4 slots=4\n0.0.0.4 slots=4\n";
  const test::CommandResult r = test::run_hetplan("search -q --hostfile_path " + (dir / "hostfile").string() + " --clusterfile_path " +
                            test::project_clusterfile() + " --profile_data_path " + test::analytic_dir(10) +
                            " --num_layers 10 --gbs 128 --top 5 --json " + plans.string());
  REQUIRE(r.exit_code == 0);
  return plans;
}

}  // namespace

TEST_CASE("simulate a searched plan: schedules, trace and JSON", "[cli][simulate]") {
  const fs::path plans = searched_plans();
  const auto dir = plans.parent_path();
  const ordered_json all = read_json_file(plans.string());
  // A multi-stage plan if the search kept one, else the best.
  ordered_json plan = all["best"];
  for (const auto& p : all["top"])
    if (p["device_groups"].size() > 1) {
      plan = p;
      break;
    }
  write_json_file((dir / "plan.json").string(), plan);
  const std::string base = "simulate --plan " + (dir / "plan.json").string();
  const test::CommandResult a = test::run_hetplan(base + " --schedule 1f1b --trace " + (dir / "trace.json").string() + " --json " +
                            (dir / "sim.json").string());
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  CHECK(a.output.find("iteration_ms: ") != std::string::npos);
  CHECK(a.output.find("bubble_fraction: ") != std::string::npos);
  const ordered_json sim = read_json_file((dir / "sim.json").string());
  CHECK(sim["iteration_ms"].get<double>() > 0);
  CHECK(sim["stages"].size() == plan["device_groups"].size());
  int ranks = 0;
  for (const auto& g : plan["device_groups"]) ranks += g.get<int>();
  CHECK(sim["ranks"].size() == static_cast<std::size_t>(ranks));
  // The trace carries replay's span names, one forward and one backward per micro-batch and stage.
  const ordered_json trace = read_json_file((dir / "trace.json").string());
  int forward = 0, backward = 0, optimizer = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string n = e["name"];
    CHECK((n == "forward" || n == "backward" || n == "send" || n == "recv" || n == "allreduce" || n == "optimizer"));
    forward += n == "forward";
    backward += n == "backward";
    optimizer += n == "optimizer";
  }
  const int stages = static_cast<int>(plan["device_groups"].size());
  CHECK(forward == stages * plan["batches"].get<int>());
  CHECK(backward == forward);
  CHECK(optimizer == stages);
  // GPipe and 1F1B: same compute, GPipe holds every micro-batch.
  const test::CommandResult g = test::run_hetplan(base + " --schedule gpipe --json " + (dir / "gpipe.json").string());
  REQUIRE(g.exit_code == 0);
  const ordered_json gp = read_json_file((dir / "gpipe.json").string());
  CHECK(gp["stages"][0]["peak_in_flight"] == plan["batches"]);
  CHECK(sim["stages"][0]["peak_in_flight"].get<int>() == std::min(stages, plan["batches"].get<int>()));
  // ZeRO-3 shrinks the weights each rank holds when dp > 1.
  const test::CommandResult z = test::run_hetplan(base + " --zero 3 --json " + (dir / "z3.json").string());
  REQUIRE(z.exit_code == 0);
  const ordered_json z3 = read_json_file((dir / "z3.json").string());
  CHECK(z3["ranks"][0]["weights"].get<double>() <= sim["ranks"][0]["weights"].get<double>());
}

TEST_CASE("simulate errors are one line", "[cli][simulate][errors]") {
  const fs::path plans = searched_plans();
  test::CommandResult r = test::run_hetplan("simulate --plan " + plans.string() + " --recompute most");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("--recompute: 'most': expected none, selective or full") != std::string::npos);
  r = test::run_hetplan("simulate --plan " + plans.string() + " --bandwidth-unit bytes/s");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("intra_bandwidth' = ") != std::string::npos);
  CHECK(r.output.find("expected bytes/s") != std::string::npos);
  r = test::run_hetplan("simulate --plan /nonexistent/plan.json");
  CHECK(r.exit_code == 2);
}

TEST_CASE("whatif table: rows, JSON and memory ordering", "[cli][whatif]") {
  const auto dir = test::scratch_dir("whatif");
  const std::string json = (dir / "w.json").string();
  const test::CommandResult r = test::run_hetplan("whatif --hf-config " + hf("llama-3.1-8b.json") +
                            " --gpu H100 --gpus 8 --seq 2048 --flash-attention --json " + json);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("| strategy | GPUs | memory/GPU GiB |") != std::string::npos);
  const ordered_json w = read_json_file(json);
  CHECK(w["parameters"] == 8'030'261'248LL);
  std::map<std::string, ordered_json> rows;
  for (const auto& row : w["rows"]) rows[row["strategy"]] = row;
  for (const char* name : {"single GPU", "DDP", "ZeRO-1", "ZeRO-1+offload", "ZeRO-2", "ZeRO-2+offload", "ZeRO-3",
                           "ZeRO-3+opt-offload", "ZeRO-3+offload", "FSDP", "FSDP-hybrid", "fp32", "fp16", "bf16",
                           "bf16+ckpt-every-2", "FP8", "FP8+ckpt-every-2", "torch.compile", "LoRA", "LoRA+GC", "QLoRA",
                           "QLoRA+GC", "LoRA+ZeRO-2", "LoRA+ZeRO-3", "QLoRA+ZeRO-2", "QLoRA+ZeRO-3",
                           "8-bit base+8-bit Adam+GC", "4-bit base+8-bit Adam+GC"})
    CHECK(rows.count(name) == 1);
  CHECK(rows.size() == 28);
  auto mem = [&](const char* n) { return rows[n]["memory_per_gpu_bytes"].get<double>(); };
  CHECK(mem("ZeRO-1") < mem("DDP"));
  // DeepSpeed accounting (memory.rst): ZeRO-2 keeps the 16-bit gradients whole as ZeRO-1 does.
  CHECK(mem("ZeRO-2") == mem("ZeRO-1"));
  CHECK(mem("ZeRO-3") < mem("ZeRO-2"));
  CHECK(mem("ZeRO-3+offload") < mem("ZeRO-3"));
  CHECK(mem("QLoRA") < mem("LoRA"));
  CHECK(mem("LoRA+GC") < mem("LoRA"));
  // (Gradients allocated in the backward take the activations' place: for this 8B model at micro-batch 1 its
  // fp32 gradients are the larger, so checkpointing does not lower the peak.)
  CHECK(mem("bf16+ckpt-every-2") <= mem("bf16"));
  CHECK(rows["DDP"]["fits"] == false);  // 16 bytes x 8B parameters > 80 GB
  CHECK(rows["QLoRA+GC"]["fits"] == true);
  CHECK(rows["FP8"]["offered"] == true);  // H100 has fp8
  CHECK(rows["FP8"]["step_ms"].get<double>() < rows["bf16"]["step_ms"].get<double>());
  CHECK(rows["torch.compile"]["step_ms"].get<double>() < rows["bf16"]["step_ms"].get<double>());
  CHECK(rows["ZeRO-2+offload"]["step_ms"].get<double>() > rows["ZeRO-2"]["step_ms"].get<double>());
  CHECK(rows["ZeRO-2+offload"]["assumptions"].dump().find("host:") != std::string::npos);
  // Unknown GPU and a broken config: one line, exit 2.
  test::CommandResult e = test::run_hetplan("whatif --gpu B300");
  CHECK(e.exit_code == 2);
  CHECK(e.output.find("--gpu: 'B300': unknown GPU; known: V100,") != std::string::npos);
  e = test::run_hetplan("whatif --hf-config " + hf("broken-llama.json"));
  CHECK(e.exit_code == 2);
  CHECK(e.output.find("broken-llama.json: missing key") != std::string::npos);
}

namespace {

// A 16-GPU V100+A100 search on the 10-layer analytic profiles, its hostfile in `dir`.
std::string search_16_gpus(const std::filesystem::path& dir) {
  std::ofstream(dir / "hostfile") << "0.0.0.1 slots=4\n0.0.0.1 slots=4\n0.0.0.4 slots=4\n0.0.0.4 slots=4\n";
  return "search -q --hostfile_path " + (dir / "hostfile").string() + " --clusterfile_path " +
         test::project_clusterfile() + " --profile_data_path " + test::analytic_dir(10) +
         " --num_layers 10 --gbs 128 --top 5 ";
}

}  // namespace

TEST_CASE("search --cost-model sim ranks by simulated time and agrees with simulate", "[cli][search-sim]") {
  const auto dir = test::scratch_dir("search-sim");
  const std::string common = search_16_gpus(dir);
  const test::CommandResult r = test::run_hetplan(common + "--cost-model sim --json " + (dir / "sim.json").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const ordered_json plans = read_json_file((dir / "sim.json").string());
  // Cheapest first.
  double prev = 0;
  for (const auto& p : plans["top"]) {
    CHECK(p["cost"].get<double>() >= prev);
    prev = p["cost"].get<double>();
  }
  // The best plan's cost is the iteration time `simulate` reports for it, and it fits.
  write_json_file((dir / "best.json").string(), plans["best"]);
  const test::CommandResult s = test::run_hetplan("simulate --plan " + (dir / "best.json").string() + " --json " + (dir / "b.json").string());
  REQUIRE(s.exit_code == 0);
  const ordered_json b = read_json_file((dir / "b.json").string());
  CHECK(b["iteration_ms"].get<double>() == Approx(plans["best"]["cost"].get<double>()).epsilon(1e-12));
  CHECK(b["fits"] == true);
  CHECK(plans["cost_model"] == "sim");
  CHECK(plans["best"]["schedule"] == "1f1b");
  CHECK(plans["best"]["ranks"].size() == 16);
  // A GPipe search: simulate takes the schedule from the plan file.
  REQUIRE(test::run_hetplan(common + "--schedule gpipe --json " + (dir / "gpipe.json").string()).exit_code == 0);
  const ordered_json g = read_json_file((dir / "gpipe.json").string());
  write_json_file((dir / "gbest.json").string(), g["best"]);
  REQUIRE(test::run_hetplan("simulate --plan " + (dir / "gbest.json").string() + " --json " + (dir / "gs.json").string())
              .exit_code == 0);
  CHECK(read_json_file((dir / "gs.json").string())["iteration_ms"].get<double>() ==
        Approx(g["best"]["cost"].get<double>()).epsilon(1e-12));
  // The simulator is the default; --cost-model metis is the reference's search.
  const test::CommandResult d = test::run_hetplan(common + "--json " + (dir / "default.json").string());
  REQUIRE(d.exit_code == 0);
  CHECK(read_json_file((dir / "default.json").string())["best"] == plans["best"]);
  const test::CommandResult m = test::run_hetplan(common + "--cost-model metis --json " + (dir / "metis.json").string());
  REQUIRE(m.exit_code == 0);
  CHECK(read_json_file((dir / "metis.json").string())["cost_model"] == "metis");
  CHECK(read_json_file((dir / "metis.json").string())["count"].get<long long>() > 0);
  CHECK(test::run_hetplan(common + "--cost-model magic").exit_code == 2);
}

TEST_CASE("search --zero/--recompute auto (the default) searches the settings as dimensions", "[cli][search-sim]") {
  const auto dir = test::scratch_dir("search-sim-auto");
  const std::string common = search_16_gpus(dir) + "--cost-model sim ";
  const test::CommandResult fixed =
      test::run_hetplan(common + "--zero 0 --recompute none --json " + (dir / "fixed.json").string());
  const test::CommandResult any = test::run_hetplan(common + "--zero auto --recompute auto --json " + (dir / "auto.json").string());
  const test::CommandResult dflt = test::run_hetplan(common + "--json " + (dir / "default.json").string());
  INFO(any.output);
  REQUIRE(fixed.exit_code == 0);
  REQUIRE(any.exit_code == 0);
  REQUIRE(dflt.exit_code == 0);
  const ordered_json f = read_json_file((dir / "fixed.json").string());
  const ordered_json a = read_json_file((dir / "auto.json").string());
  // The default is auto: the same best plan and setting.
  const ordered_json d = read_json_file((dir / "default.json").string());
  CHECK(d["best"]["cost"] == a["best"]["cost"]);
  CHECK(d["best"]["zero_stage"] == a["best"]["zero_stage"]);
  CHECK(d["best"]["recompute"] == a["best"]["recompute"]);
  CHECK(a["best"]["zero_stage"] == 1);  // here ZeRO-1 (its optimizer step sharded over dp 8) beats ZeRO-0
  // The settings include ZeRO-0 without recomputation, so the best can only get cheaper.
  CHECK(a["best"]["cost"].get<double>() <= f["best"]["cost"].get<double>());
  CHECK(f["best"]["zero_stage"] == 0);
  CHECK(f["best"]["recompute"] == "none");
  CHECK(any.output.find("setting 1: ZeRO-") != std::string::npos);
  // Each listed plan's cost is what `simulate` reports for it with the setting it records (read from the file).
  for (std::size_t i = 0; i < a["top"].size(); ++i) {
    const auto plan = dir / ("top" + std::to_string(i) + ".json");
    write_json_file(plan.string(), a["top"][i]);
    const test::CommandResult s = test::run_hetplan("simulate --plan " + plan.string() + " --json " + (dir / "s.json").string());
    REQUIRE(s.exit_code == 0);
    const ordered_json sj = read_json_file((dir / "s.json").string());
    CHECK(sj["iteration_ms"].get<double>() == Approx(a["top"][i]["cost"].get<double>()).epsilon(1e-12));
    CHECK(sj["zero_stage"] == a["top"][i]["zero_stage"]);
    CHECK(sj["recompute"] == a["top"][i]["recompute"]);
    CHECK(sj["fits"] == true);
  }
  CHECK(test::run_hetplan(common + "--zero 4").exit_code == 2);
  CHECK(test::run_hetplan(common + "--recompute sometimes").exit_code == 2);
}

TEST_CASE("a plan searched with --hf-config stays that model in simulate and export", "[cli][search-sim][plan_file]") {
  const auto dir = test::scratch_dir("search-llama");
  const std::string common = search_16_gpus(dir);
  // A Llama-3.1-like model of 8 blocks of 4096 (the 10-layer analytic profiles): GQA, SwiGLU, RMSNorm, untied,
  // rope scaling.
  ordered_json cfg = read_json_file(hf("llama-3.1-8b.json"));
  cfg["num_hidden_layers"] = 8;
  cfg["rope_scaling"] = {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}};
  write_json_file((dir / "llama.json").string(), cfg);
  // Profiles of this model (analytic ones record the shape they were made for: the GPT set is refused).
  const test::CommandResult refused = test::run_hetplan(common + "--hf-config " + (dir / "llama.json").string());
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("disagrees with the profiles") != std::string::npos);
  const std::string llama_profiles = (dir / "llama-profiles").string();
  REQUIRE(test::run_hetplan("gen-profiles --analytic --hf-config " + (dir / "llama.json").string() +
                            " --seq-len 1024 --types A100,V100 --max-tp " + std::to_string(test::kAnalyticMaxTp) +
                            " 10 " + std::to_string(test::kAnalyticMaxBs) + " --out " + llama_profiles)
              .exit_code == 0);
  std::string llama_common = common;
  llama_common.replace(llama_common.find(test::analytic_dir(10)), test::analytic_dir(10).size(), llama_profiles);
  const test::CommandResult r = test::run_hetplan(llama_common + "--hf-config " + (dir / "llama.json").string() +
                                                  " --json " + (dir / "p.json").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const ordered_json plans = read_json_file((dir / "p.json").string());
  CHECK(plans["best"]["model"]["architecture"]["activation"] == "swiglu");
  CHECK(plans["best"]["precision"] == "bf16");
  write_json_file((dir / "best.json").string(), plans["best"]);
  const std::string best = (dir / "best.json").string();
  // simulate, with no --hf-config: the search's cost, and no warning.
  const test::CommandResult s = test::run_hetplan("simulate --plan " + best + " --json " + (dir / "s.json").string());
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  CHECK(s.output.find("warning") == std::string::npos);
  CHECK(read_json_file((dir / "s.json").string())["iteration_ms"].get<double>() ==
        Approx(plans["best"]["cost"].get<double>()).epsilon(1e-12));
  // The same config agrees; a contradicting one is an error naming the key and both values.
  CHECK(test::run_hetplan("simulate --plan " + best + " --hf-config " + (dir / "llama.json").string()).exit_code == 0);
  cfg["intermediate_size"] = 11008;
  write_json_file((dir / "other.json").string(), cfg);
  const test::CommandResult c = test::run_hetplan("simulate --plan " + best + " --hf-config " + (dir / "other.json").string());
  CHECK(c.exit_code == 2);
  CHECK(c.output == "hetplan: error: --hf-config " + (dir / "other.json").string() + ": 'ffn_hidden_size' is 11008, but "
                    "the plan " + best + " records 14336 (model.architecture.ffn_hidden_size); leave --hf-config out to "
                    "use the plan's model\n");
  // export --to megatron, with no --hf-config, of the best plan with the same (dp, tp) in every stage (over
  // both GPU types): the Llama's flags, fp16 for the V100s.
  const test::CommandResult u = test::run_hetplan(llama_common + "--uniform --hf-config " + (dir / "llama.json").string() +
                                                  " --json " + (dir / "u.json").string());
  INFO(u.output);
  REQUIRE(u.exit_code == 0);
  std::string uniform;
  const ordered_json uniform_plans = read_json_file((dir / "u.json").string());
  for (const auto& p : uniform_plans["top"]) {
    bool same = p["strategies"].size() > 1;
    for (const auto& st : p["strategies"]) same = same && st == p["strategies"][0];
    if (uniform.empty() && same) {
      uniform = (dir / "uniform.json").string();
      write_json_file(uniform, p);
    }
  }
  REQUIRE(!uniform.empty());
  const test::CommandResult m = test::run_hetplan("export --plan " + uniform + " --to megatron");
  INFO(m.output);
  REQUIRE(m.exit_code == 0);
  for (const char* flag : {"  --swiglu\n", "  --normalization RMSNorm\n", "  --group-query-attention\n",
                           "  --num-query-groups 8\n", "  --ffn-hidden-size 14336\n", "  --use-rope-scaling\n",
                           "  --rope-scaling-factor 8\n", "  --untie-embeddings-and-output-weights\n", "  --fp16\n"})
    CHECK(m.output.find(flag) != std::string::npos);
  const test::CommandResult d = test::run_hetplan("export --plan " + uniform + " --to deepspeed");
  CHECK(d.exit_code == 0);
  CHECK(d.output.find("\"fp16\": {") != std::string::npos);
}

TEST_CASE("search refuses shape flags the profiles disagree with, naming the key", "[cli][search-sim][errors]") {
  const auto dir = test::scratch_dir("search-shape");
  fs::remove_all(dir / "profiles");
  fs::copy(test::analytic_dir(10), dir / "profiles");
  // The model-level file (the first type's tp1_bs1) records the model it was measured for, as `hetplan profile` does.
  std::string first;
  for (const auto& e : fs::directory_iterator(dir / "profiles")) {
    const std::string name = e.path().filename().string();
    if (name.find("_tp1_bs1.json") != std::string::npos && (first.empty() || name < first)) first = name;
  }
  REQUIRE(!first.empty());
  const std::string model_file = (dir / "profiles" / first).string();
  ordered_json j = read_json_file(model_file);
  j["model"]["hidden_size"] = 4096;
  j["model"]["sequence_length"] = 2048;
  write_json_file(model_file, j);
  std::ofstream(dir / "hostfile") << "0.0.0.1 slots=4\n0.0.0.4 slots=4\n";
  const std::string search = "search -q --hostfile " + (dir / "hostfile").string() + " --clusterfile " +
                             test::project_clusterfile() + " --profiles " + (dir / "profiles").string() +
                             " --num_layers 10 --gbs 32 ";
  // --sequence_length left at its default (1024): exit 2, naming the key and both values.
  const test::CommandResult r = test::run_hetplan(search);
  CHECK(r.exit_code == 2);
  CHECK(r.output == "hetplan: error: --sequence_length 1024 disagrees with the profiles: " + model_file +
                        " records model.sequence_length = 2048 (they were measured for another model: give its "
                        "shape, or profile this one)\n");
  const test::CommandResult h = test::run_hetplan(search + "--sequence_length 2048 --hidden_size 2048");
  CHECK(h.exit_code == 2);
  CHECK(h.output.find("--hidden_size 2048 disagrees with the profiles: " + model_file +
                      " records model.hidden_size = 4096") != std::string::npos);
  CHECK(test::run_hetplan(search + "--sequence_length 2048").exit_code == 0);
}

// Issue 34's case for interleaving: a deep pipeline at a small global batch. A 7B-shaped GPT (32 blocks,
// hidden 4096, sequence 2048) on 8 V100s of 32 GB without tp (--max-profiled-tp-degree 1): memory forces a deep
// pipeline (8 stages, or 4 of dp 2), and gbs 8 leaves 8 micro-batches, so plain 1F1B idles (pp - 1) / (m + pp - 1) of the time. With
// --vp auto the search finds an interleaved plan faster than the best plain 1F1B plan (which it also
// searched), simulate gives the same time for it, the same plan under plain 1F1B is slower, and the
// Megatron export carries its virtual pipeline.
// A 32k-token sequence on two single-A100 nodes of 20 GB: without cp no plan fits (ZeRO-0, no recomputation),
// --cp auto finds the cp 2 plan; with every setting it beats the best cp 1 plan (recomputation). --json and
// simulate carry context_parallel, export gives Megatron's --context-parallel-size.
TEST_CASE("search --cp auto finds the cp 2 plan of a 32k-token sequence, and --json, simulate and export carry it",
          "[cli][search-sim][cp]") {
  const auto dir = test::scratch_dir("search-cp");
  std::ofstream(dir / "hostfile") << "10.0.0.1 slots=1\n10.0.0.2 slots=1\n";
  std::ofstream(dir / "clusterfile.json")
      << R"({"10.0.0.1": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 20},
            "10.0.0.2": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 20}})";
  REQUIRE(test::run_hetplan("gen-profiles --analytic 6 4 --types A100 --max-tp 1 --hidden-size 2048 --seq-len 32768 "
                            "--vocab-size 32000 --heads 16 --out " + (dir / "profiles").string())
              .exit_code == 0);
  const std::string common = "search -q --hostfile " + (dir / "hostfile").string() + " --clusterfile " +
                             (dir / "clusterfile.json").string() + " --profiles " + (dir / "profiles").string() +
                             " --num_layers 6 --hidden_size 2048 --sequence_length 32768 --vocab_size 32000 --heads 16 "
                             "--gbs 4 --gap 0 ";
  const test::CommandResult none = test::run_hetplan(common + "--zero 0 --recompute none --cp 1");
  CHECK(none.exit_code == 2);
  CHECK(none.output.find("no plan exists") != std::string::npos);
  const test::CommandResult cp = test::run_hetplan(common + "--zero 0 --recompute none --cp auto --json " +
                                                   (dir / "cp.json").string());
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  const ordered_json b = read_json_file((dir / "cp.json").string())["best"];
  CHECK(b["context_parallel"] == 2);
  CHECK(b["strategies"] == ordered_json::parse("[[2, 1]]"));
  const test::CommandResult one = test::run_hetplan(common + "--cp 1 --json " + (dir / "one.json").string());
  REQUIRE(one.exit_code == 0);
  const test::CommandResult any = test::run_hetplan(common + "--cp auto --json " + (dir / "any.json").string());
  REQUIRE(any.exit_code == 0);
  CHECK(any.output.find("cp 2") != std::string::npos);  // the setting line
  const ordered_json o = read_json_file((dir / "one.json").string())["best"];
  const ordered_json a = read_json_file((dir / "any.json").string())["best"];
  CHECK(o.value("context_parallel", 1) == 1);
  CHECK(o["recompute"] != "none");
  CHECK(a["context_parallel"] == 2);
  CHECK(a["cost"].get<double>() < o["cost"].get<double>());
  write_json_file((dir / "best.json").string(), a);
  const test::CommandResult s =
      test::run_hetplan("simulate --plan " + (dir / "best.json").string() + " --json " + (dir / "s.json").string());
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  CHECK(read_json_file((dir / "s.json").string())["iteration_ms"].get<double>() ==
        Approx(a["cost"].get<double>()).epsilon(1e-12));
  const test::CommandResult e = test::run_hetplan("export --plan " + (dir / "best.json").string() + " --to megatron");
  INFO(e.output);
  REQUIRE(e.exit_code == 0);
  CHECK(e.output.find("--context-parallel-size 2") != std::string::npos);
  // --cp at the edge: one line, exit code 2.
  const test::CommandResult three = test::run_hetplan(common + "--cp 3");
  CHECK(three.exit_code == 2);
  CHECK(three.output.find("2 x cp = 6") != std::string::npos);
  CHECK(test::run_hetplan(common + "--cp two").exit_code == 2);
}

TEST_CASE("search --vp auto finds an interleaved plan that beats plain 1F1B on a deep pipeline at small gbs",
          "[cli][search-sim][interleaved]") {
  const auto dir = test::scratch_dir("search-interleaved");
  std::ofstream(dir / "hostfile") << "0.0.0.1 slots=4\n0.0.0.1 slots=4\n";
  REQUIRE(test::run_hetplan("gen-profiles --analytic 34 16 --types V100 --max-tp 1 --hidden-size 4096 --seq-len 2048 "
                            "--vocab-size 32000 --heads 32 --out " + (dir / "profiles").string())
              .exit_code == 0);
  const std::string common = "search -q --hostfile " + (dir / "hostfile").string() + " --clusterfile " +
                             test::project_clusterfile() + " --profiles " + (dir / "profiles").string() +
                             " --num_layers 34 --hidden_size 4096 --sequence_length 2048 --vocab_size 32000 --heads 32 "
                             "--gbs 8 --top 3 --max-profiled-tp-degree 1 --recompute auto ";
  const test::CommandResult plain = test::run_hetplan(common + "--vp 1 --json " + (dir / "plain.json").string());
  INFO(plain.output);
  REQUIRE(plain.exit_code == 0);
  const test::CommandResult any = test::run_hetplan(common + "--vp auto --json " + (dir / "auto.json").string());
  INFO(any.output);
  REQUIRE(any.exit_code == 0);
  const ordered_json p = read_json_file((dir / "plain.json").string())["best"];
  const ordered_json b = read_json_file((dir / "auto.json").string())["best"];
  CHECK(p["schedule"] == "1f1b");
  // A deep pipeline: 8 stages, or 4 of dp 2, which since the stage-boundary tensors are counted (each
  // live micro-batch's received input, the sends kept) ties the 8-stage plans within 1%.
  CHECK(p["device_groups"].size() >= 4);
  REQUIRE(b["schedule"] == "interleaved");
  CHECK(b["virtual_stages"].get<int>() >= 2);
  CHECK(b["device_groups"].size() == 8);
  CHECK(b["cost"].get<double>() < 0.9 * p["cost"].get<double>());
  write_json_file((dir / "best.json").string(), b);
  const test::CommandResult s =
      test::run_hetplan("simulate --plan " + (dir / "best.json").string() + " --json " + (dir / "s.json").string());
  REQUIRE(s.exit_code == 0);
  const ordered_json sj = read_json_file((dir / "s.json").string());
  CHECK(sj["iteration_ms"].get<double>() == Approx(b["cost"].get<double>()).epsilon(1e-12));
  CHECK(sj["virtual_stages"] == b["virtual_stages"]);
  const test::CommandResult f = test::run_hetplan("simulate --plan " + (dir / "best.json").string() +
                                                  " --schedule 1f1b --json " + (dir / "f.json").string());
  REQUIRE(f.exit_code == 0);
  CHECK(read_json_file((dir / "f.json").string())["iteration_ms"].get<double>() > sj["iteration_ms"].get<double>());
  const test::CommandResult e = test::run_hetplan("export --plan " + (dir / "best.json").string() + " --to megatron");
  INFO(e.output);
  REQUIRE(e.exit_code == 0);
  CHECK((e.output.find("--num-virtual-stages-per-pipeline-rank") != std::string::npos ||
         e.output.find("--pipeline-model-parallel-layout") != std::string::npos));
  CHECK(test::run_hetplan("export --plan " + (dir / "best.json").string() + " --to deepspeed").exit_code == 2);
  // Interleaving's rules at the edge: one line, exit code 2.
  CHECK(test::run_hetplan("simulate --plan " + (dir / "best.json").string() + " --schedule gpipe --vp 2").exit_code == 2);
  CHECK(test::run_hetplan(common + "--vp two").exit_code == 2);
}
