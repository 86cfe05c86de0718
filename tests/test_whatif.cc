// The GPU catalogue, the one cost model behind `whatif` (it agrees with
// `simulate` exactly), DeepSpeed's buffers and offload rules, inference's
// roofline, and the seed setups of issue 10 expressed exactly.

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "sim/gpu_specs.h"
#include "sim/inference.h"
#include "sim/layer_time_model.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/offload.h"
#include "sim/roofline.h"
#include "sim/whatif.h"
#include "tests/fixtures.h"

namespace fs = std::filesystem;
using namespace hetplan;

namespace {

std::string hf(const std::string& name) { return std::string(HETPLAN_SOURCE_DIR) + "/tests/data/hf/" + name; }

std::map<std::string, ordered_json> rows_by_name(const ordered_json& w) {
  std::map<std::string, ordered_json> rows;
  for (const auto& row : w["rows"]) rows[row["strategy"].get<std::string>()] = row;
  return rows;
}

// The largest rank's memory as whatif accounts it: the allocated peak and the framework constant (simulate's
// total also holds NCCL's buffers and the allocator's reserve, sim/device_memory.h, which whatif leaves out).
double max_rank_total(const ordered_json& sim) {
  double peak = 0;
  for (const auto& r : sim["ranks"])
    peak = std::max(peak, r["allocated_peak"].get<double>() + r["framework"].get<double>());
  return peak;
}

}  // namespace

TEST_CASE("GPU catalogue: every entry, names, precisions", "[whatif][catalogue]") {
  for (const char* name : {"V100", "A100-40GB", "A100", "H100", "H100-PCIe", "H200", "B200", "L40S", "RTX4090",
                           "RTX5090", "MI210", "MI250X", "MI300X"}) {
    const GpuSpec* g = find_gpu_spec(name);
    REQUIRE(g != nullptr);
    CHECK(g->name == name);
    CHECK(g->source_url.rfind("https://", 0) == 0);
    CHECK(!g->source_title.empty());
    CHECK(g->memory_gb > 0);
    CHECK(g->memory_bw_gbs > 0);
    CHECK(g->nvlink_gbs > 0);
    CHECK(g->sm_count > 0);
    CHECK(g->supports(ComputePrecision::kFp32));
    CHECK(g->supports(ComputePrecision::kFp16));
  }
  // Spelling: case, spaces and dashes do not matter; aliases and device descriptions resolve.
  CHECK(find_gpu_spec("rtx 5090") == find_gpu_spec("RTX5090"));
  CHECK(find_gpu_spec("A100-80GB") == find_gpu_spec("A100"));
  CHECK(find_gpu_spec("B300") == nullptr);
  CHECK(match_device_description("NVIDIA H100 80GB HBM3")->name == "H100");
  CHECK(match_device_description("NVIDIA H100 PCIe")->name == "H100-PCIe");
  CHECK(match_device_description("NVIDIA A100-SXM4-40GB")->name == "A100-40GB");
  CHECK(match_device_description("AMD Instinct MI210")->name == "MI210");
  CHECK(match_device_description("Intel Arc") == nullptr);
  // Datasheet values the rest of hetplan relies on (the old table's, kept).
  CHECK(find_gpu_spec("A100")->peak_tflops == 312.0);
  CHECK(find_gpu_spec("V100")->peak_tflops == 125.0);  // fp16: V100 has no bf16
  CHECK(find_gpu_spec("H200")->memory_bw_gbs == 4800.0);
  CHECK(find_gpu_spec("H100")->peak_of(ComputePrecision::kFp8) == 1979.0);
  // A precision the chip lacks: an InputError naming the GPU and what it supports.
  const GpuSpec& v100 = *find_gpu_spec("V100");
  CHECK_FALSE(v100.supports(ComputePrecision::kBf16));
  CHECK_FALSE(v100.supports(ComputePrecision::kFp8));
  CHECK(v100.supported() == "fp32, fp16");
  try {
    require_peak(v100, ComputePrecision::kFp8, "--precision fp8");
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("--precision fp8: V100 has no fp8 (it supports fp32, fp16;") == 0);
  }
  CHECK_FALSE(find_gpu_spec("MI210")->supports(ComputePrecision::kFp8));
  CHECK(find_gpu_spec("MI300X")->supports(ComputePrecision::kFp8));
}

TEST_CASE("GPU catalogue: --gpu-spec adds an entry, bad files are refused by key", "[whatif][catalogue]") {
  const auto dir = test::scratch_dir("gpu-spec");
  const fs::path f = dir / "mygpu.json";
  std::ofstream(f) << R"({"name": "TESTGPU-42", "memory_gb": 24, "memory_bw_gbs": 1000, "link_gbs": 32,
    "host_link_gbs": 32, "sm_count": 42, "base": "H100", "peak_tflops": {"fp32": 20, "bf16": 300},
    "source": {"title": "a test", "url": "https://example.com"}})";
  load_gpu_spec_file(f.string());
  const GpuSpec* g = find_gpu_spec("testgpu42");
  REQUIRE(g != nullptr);
  CHECK(g->peak_tflops == 300);
  CHECK(g->sm_count == 42);
  CHECK(g->base == "H100");
  CHECK(gpu_names().find("TESTGPU-42") != std::string::npos);
  // Through the binary: the spec file's GPU is usable; a broken one names the key.
  test::CommandResult r = test::run_hetplan("whatif --gpu-spec " + f.string() +
                                            " --gpu TESTGPU-42 --gpus 1 --layers 2 --hidden-size 256 --heads 4 "
                                            "--vocab-size 1000 --ffn-size 512 --seq 128 --rows bf16,FP8");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("| FP8 | 1 | - | - | - | - | - | not offered: TESTGPU-42 has no fp8 (it supports fp32, bf16)") !=
        std::string::npos);
  std::ofstream(dir / "bad.json") << R"({"gpus": [{"name": "X", "memory_gb": -1}]})";
  r = test::run_hetplan("whatif --gpu-spec " + (dir / "bad.json").string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("bad.json: key 'gpus[0].memory_gb'") != std::string::npos);
}

TEST_CASE("whatif: V100 fp8 is one line, MI210 and RTX 5090 run", "[whatif][cli]") {
  test::CommandResult r = test::run_hetplan("whatif --precision fp8 --gpu V100");
  CHECK(r.exit_code == 2);
  CHECK(r.output.rfind("hetplan: error: --precision fp8: V100 has no fp8 (it supports fp32, fp16; https://", 0) == 0);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  r = test::run_hetplan("whatif --precision bf16 --gpu V100");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("V100 has no bf16") != std::string::npos);
  for (const char* gpu : {"MI210", "RTX5090"}) {
    r = test::run_hetplan(std::string("whatif --gpu ") + gpu + " --gpus 1 --hf-config " + hf("llama-3.2-3b.json") +
                          " --seq 512 --micro-batch 4 --rows LoRA");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("| LoRA | 1 |") != std::string::npos);
  }
  // V100 rows: bf16 and FP8 are not offered, fp16 is (the default precision there).
  const auto dir = test::scratch_dir("whatif-v100");
  r = test::run_hetplan("whatif --gpu V100 --hf-config " + hf("llama-2-7b.json") + " --seq 350 --json " +
                        (dir / "w.json").string());
  REQUIRE(r.exit_code == 0);
  auto rows = rows_by_name(read_json_file((dir / "w.json").string()));
  CHECK(rows["bf16"]["offered"] == false);
  CHECK(rows["FP8"]["offered"] == false);
  CHECK(rows["FP8+ckpt-every-2"]["offered"] == false);
  CHECK(rows["fp16"]["offered"] == true);
  CHECK(rows["DDP"]["precision"] == "fp16");
}

// The issue's first must-show: whatif and simulate give the same time and memory for the same setup, over
// every ZeRO stage and recomputation setting (and the offload rows). whatif exports the row's simulator
// inputs; simulate reads them back from files, with the setup given by its own flags.
TEST_CASE("whatif and simulate agree: every ZeRO stage x recomputation, offload", "[whatif][cli][simulate]") {
  const auto dir = test::scratch_dir("whatif-vs-simulate");
  struct Row {
    const char* name;
    const char* simulate_flags;
  };
  // (The plan carries the accounting, DDP's buckets and the gradients-in-backward rule: whatif --export.)
  const Row rows[] = {{"DDP", "--zero 0 --accounting megatron"},
                      {"ZeRO-1", "--zero 1 --accounting deepspeed --deepspeed-buffers"},
                      {"ZeRO-2", "--zero 2 --accounting deepspeed --deepspeed-buffers"},
                      {"ZeRO-3", "--zero 3 --accounting deepspeed --deepspeed-buffers"},
                      {"ZeRO-1+offload", "--zero 1 --accounting deepspeed --deepspeed-buffers --offload optimizer"},
                      {"ZeRO-2+offload", "--zero 2 --accounting deepspeed --deepspeed-buffers --offload optimizer"},
                      {"ZeRO-3+offload", "--zero 3 --accounting deepspeed --deepspeed-buffers --offload all"},
                      {"FSDP", "--zero 3 --accounting fsdp2"}};
  int compared = 0;
  for (const Row& row : rows) {
    for (const char* recompute : {"none", "selective", "full"}) {
      const fs::path out = dir / (std::string(row.name) + "-" + recompute);
      const std::string common = std::string(" --hf-config ") + hf("llama-3.2-3b.json") + " --recompute " + recompute;
      test::CommandResult w = test::run_hetplan("whatif --gpu A100 --gpus 4 --gpus-per-node 4 --seq 1024 "
                                                "--micro-batch 2 --gbs 16 --rows " + std::string(row.name) +
                                                common + " --export " + out.string() + " --json " +
                                                (out / "whatif.json").string());
      INFO(row.name << " " << recompute << "\n" << w.output);
      REQUIRE(w.exit_code == 0);
      test::CommandResult s = test::run_hetplan("simulate --plan " + (out / "plan.json").string() + common + " " +
                                                row.simulate_flags + " --precision bf16 --framework-mb 1024 --json " +
                                                (out / "simulate.json").string());
      INFO(s.output);
      REQUIRE(s.exit_code == 0);
      const ordered_json wj = read_json_file((out / "whatif.json").string())["rows"][0];
      const ordered_json sj = read_json_file((out / "simulate.json").string());
      // The GPU's step is the simulator's (the eager host's time is whatif's alone: simulate costs the GPUs).
      CHECK(wj["gpu_ms"].get<double>() == sj["iteration_ms"].get<double>());
      CHECK(wj["step_ms"].get<double>() >= wj["gpu_ms"].get<double>());
      CHECK(wj["memory_per_gpu_bytes"].get<double>() == max_rank_total(sj));
      CHECK(wj["step_ms"].get<double>() > 0);
      ++compared;
    }
  }
  CHECK(compared == 24);
}

TEST_CASE("DeepSpeed buffers and offload time follow the stated rules", "[whatif][offload]") {
  TrainingSetup s;
  s.deepspeed.model = true;
  s.zero_stage = 2;
  // ZeRO-2, overlap_comm off by default: one ipg bucket of 5e8 16-bit elements.
  CHECK(deepspeed_buffer_bytes(s, 1e8) == 5e8 * 2);
  s.offload_optimizer = true;  // + temp_grad_buffer_for_gpu_offload (largest parameter)
  CHECK(deepspeed_buffer_bytes(s, 1e8) == 5e8 * 2 + 1e8 * 2);
  s.deepspeed.overlap_comm = 1;  // double buffering
  CHECK(deepspeed_buffer_bytes(s, 1e8) == 2 * 5e8 * 2 + 1e8 * 2);
  s = TrainingSetup();
  s.deepspeed.model = true;
  s.zero_stage = 3;
  // ZeRO-3: one bucket and the prefetch bucket, within max_live_parameters.
  CHECK(deepspeed_buffer_bytes(s, 1e8) == 5e8 * 2 + 5e7 * 2);
  s.deepspeed.max_live_parameters = 1.2e8;
  CHECK(deepspeed_buffer_bytes(s, 1e8) == 5e8 * 2 + 2e7 * 2);
  s.deepspeed.model = false;
  CHECK(deepspeed_buffer_bytes(s, 1e8) == 0);

  HostSpec h;
  h.h2d_bytes_per_s = 10e9;
  h.d2h_bytes_per_s = 20e9;
  h.cpu_adam_params_per_s = 4e9;
  h.cpu_cast_params_per_s = 8e9;
  s = TrainingSetup();
  s.zero_stage = 2;
  s.offload_optimizer = true;
  // 8e9 trainable over dp 4: 2e9 per rank. d2h of fp32 gradients (DeepSpeed's fp32 host buffer):
  // 2e9 x 4 B / 20 GB/s = 400 ms; CPU Adam 2e9 / (4e9 / 4 ranks) = 2 s;
  // the fp32 -> bf16 cast on the host 2e9 / (8e9 / 4) = 1 s; the updated partition back: 2e9 x 2 B / 10 GB/s = 400 ms.
  // ZeRO-2 without overlap_comm (its default): the copies are on the compute stream, all 400 ms exposed
  // whatever the backward's length.
  OffloadTime t = offload_time(s, h, 8e9, 16e9, 4, 4, 100, 300);
  CHECK(t.backward_exposed_ms == Approx(400).epsilon(1e-12));
  CHECK(t.forward_exposed_ms == 0);
  CHECK(t.step_ms == Approx(2000 + 1000 + 400).epsilon(1e-12));
  t = offload_time(s, h, 8e9, 16e9, 4, 4, 100, 450);
  CHECK(t.backward_exposed_ms == Approx(400).epsilon(1e-12));
  // overlap_comm on: the reduction stream copies during the backward, 100 ms beyond a 300 ms backward ...
  s.deepspeed.overlap_comm = 1;
  t = offload_time(s, h, 8e9, 16e9, 4, 4, 100, 300);
  CHECK(t.backward_exposed_ms == Approx(100).epsilon(1e-12));
  t = offload_time(s, h, 8e9, 16e9, 4, 4, 100, 450);  // ... and hidden by a longer backward
  CHECK(t.backward_exposed_ms == 0);
  s.deepspeed.overlap_comm = -1;
  s.precision = Precision::kFp32;  // fp32 weights: no cast; the copy back moves 4 B per element
  t = offload_time(s, h, 8e9, 16e9, 4, 4, 100, 450);
  CHECK(t.step_ms == Approx(2000 + 800).epsilon(1e-12));
  s.precision = TrainingSetup().precision;
  s.zero_stage = 3;
  s.offload_params = true;  // weights stay on the host: cast there, no copy back; each pass fetches 16e9 / 4 B at 10 GB/s
  t = offload_time(s, h, 8e9, 16e9, 4, 4, 100, 300);
  CHECK(t.step_ms == Approx(2000 + 1000).epsilon(1e-12));
  CHECK(t.forward_exposed_ms == Approx(400 - 100).epsilon(1e-12));
  // The gradients' 400 ms device-to-host and the weights' 400 ms host-to-device run at once (opposite
  // directions): the backward hides 300 ms of the longer, once (issue 32: it was subtracted from each).
  CHECK(t.backward_exposed_ms == Approx(400 - 300).epsilon(1e-12));
  // Unmeasured cast: the default is 6 bytes per parameter over the default host memory bandwidth.
  CHECK(default_host_spec(32).cpu_cast_params_per_s == Approx(kDefaultHostMemoryGBps * 1e9 / 6).epsilon(1e-12));
}

TEST_CASE("inference decode mechanisms: kernel floor, materialised GQA repeat, static cache, int4 per-row cost",
          "[whatif][inference]") {
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  const GpuSpec& g = *find_gpu_spec("H200");
  // The roofline alone: a graph-captured decoder with no per-kernel floor (the runtime's floors are
  // the [runtime] tests').
  auto no_floor = [](InferenceSetup& x) {
    x.launch.runtime = LaunchRuntime::kGraphs;
    x.launch.graph_kernel_us = 0;
  };
  InferenceSetup s;
  no_floor(s);
  s.batch = 8;
  s.prompt = 512;
  s.output = 128;
  const InferenceResult base = cost_inference(m, g, s);
  const double bw = 4800e9 * kDefaultDecodeHbmEfficiency;
  const double L = m.num_layers;
  const double kv_token = 2.0 * L * m.num_kv_heads * m.head_dim * 2;
  // Kernel floor: every one of the 30 x 28 kernels x 2.5 us, the 7 x 28 GEMVs and the head among them (a
  // streamed kernel pays the floor beside its bytes).
  s.launch.graph_kernel_us = 2.5;
  s.kernels_per_layer = 30;
  CHECK(cost_inference(m, g, s).decode_ms_per_token ==
        Approx(base.decode_ms_per_token + 30 * L * 2.5e-3).epsilon(1e-12));
  // An older calibration's GEMV efficiency holds the GEMVs' floor: they are not charged it again.
  s.launch.graph_kernel_us = 2.5;
  s.streamed_kernels_pay_floor = false;
  CHECK(cost_inference(m, g, s).decode_ms_per_token ==
        Approx(base.decode_ms_per_token + (30 * L - (7 * L + 1)) * 2.5e-3).epsilon(1e-12));
  s.streamed_kernels_pay_floor = true;
  s.launch.graph_kernel_us = 0;
  // Static cache: the whole allocation (640 tokens) instead of the mean context (576).
  s.static_kv_cache = true;
  CHECK(cost_inference(m, g, s).decode_ms_per_token ==
        Approx(base.decode_ms_per_token + kv_token * 8 * (640 - 576) / bw * 1e3).epsilon(1e-12));
  // Materialised repeat (24 heads over 8 KV heads): the expanded copy written and read, 2 x 3 more KV bytes.
  s.kv_repeat_materialised = true;
  CHECK(cost_inference(m, g, s).decode_ms_per_token ==
        Approx(base.decode_ms_per_token + kv_token * 8 * (640 * 7 - 576) / bw * 1e3).epsilon(1e-12));
  // Memory is unchanged by these mechanisms.
  CHECK(cost_inference(m, g, s).total_bytes() == base.total_bytes());
  // The attention's own efficiency (0.25 instead of 0.75): the KV bytes take three times as long.
  const double kv_ms = kv_token * 8 * 640 * 7 / bw * 1e3;
  const double with_kv = cost_inference(m, g, s).decode_ms_per_token;
  s.attention_hbm_efficiency = 0.25;
  CHECK(cost_inference(m, g, s).decode_ms_per_token == Approx(with_kv + 2 * kv_ms).epsilon(1e-12));
  s = InferenceSetup();
  no_floor(s);
  s.batch = 8;
  s.weights = WeightFormat::kInt4Awq;
  const InferenceResult awq = cost_inference(m, g, s);
  s.int4_row_params_per_s = 1e13;
  double lin = 0;
  for (const auto& l : m.block_linears()) lin += static_cast<double>(l.in) * l.out;
  CHECK(cost_inference(m, g, s).decode_ms_per_token ==
        Approx(awq.decode_ms_per_token + 8 * lin * L / 1e13 * 1e3).epsilon(1e-12));
  s.weights = WeightFormat::kBf16;  // the per-row cost is the int4 kernels'
  s.int4_row_params_per_s = 1e13;
  CHECK(cost_inference(m, g, s).decode_ms_per_token == base.decode_ms_per_token);
}

TEST_CASE("inference roofline: memory exact, decode bandwidth-bound at batch 1", "[whatif][inference]") {
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  const GpuSpec& g = *find_gpu_spec("H200");
  InferenceSetup s;
  s.launch.runtime = LaunchRuntime::kGraphs;  // the roofline alone: no per-kernel floor
  s.launch.graph_kernel_us = 0;
  s.batch = 1;
  s.prompt = 512;
  s.output = 128;
  const InferenceResult bf16 = cost_inference(m, g, s);
  CHECK(bf16.weights_bytes == static_cast<double>(m.parameter_count()) * 2);
  const double kv_token = 2.0 * m.num_layers * m.num_kv_heads * m.head_dim * 2;
  CHECK(bf16.kv_cache_bytes == kv_token * (512 + 128));
  // Batch 1 decode is bandwidth-bound: weights + mean KV over HBM x 0.75.
  const double bytes = bf16.weights_bytes + kv_token * (512 + 64);
  CHECK(bf16.decode_ms_per_token == Approx(bytes / (4800e9 * 0.75) * 1e3).epsilon(1e-12));
  CHECK(bf16.tokens_per_s == Approx(1e3 / bf16.decode_ms_per_token).epsilon(1e-12));
  s.weights = WeightFormat::kInt4Nf4;
  const InferenceResult nf4 = cost_inference(m, g, s);
  double lin = 0;
  for (const auto& l : m.block_linears()) lin += static_cast<double>(l.in) * l.out;
  lin *= m.num_layers;
  CHECK(nf4.weights_bytes == Approx(lin * 4.126953125 / 8 + (m.parameter_count() - lin) * 2).epsilon(1e-12));
  CHECK(nf4.decode_ms_per_token < bf16.decode_ms_per_token / 2);
  // V100: bf16 is not offered, fp16 is.
  s.weights = WeightFormat::kBf16;
  CHECK_FALSE(cost_inference(m, *find_gpu_spec("V100"), s).offered);
  s.weights = WeightFormat::kFp16;
  CHECK(cost_inference(m, *find_gpu_spec("V100"), s).offered);
}

// The seed setups of issue 10, each expressed exactly, each printing time per step and peak memory per GPU.
TEST_CASE("seed setups: Llama-2-7B on 8 x V100 and 2/3 x MI210 with DeepSpeed", "[whatif][seeds]") {
  const auto dir = test::scratch_dir("seeds-7b");
  const std::string rows = "\"ZeRO-2+offload,ZeRO-3,ZeRO-3+offload,8-bit base+8-bit Adam+GC\"";
  for (const char* gpus : {"V100 --gpus 8", "MI210 --gpus 2", "MI210 --gpus 3"}) {
    const std::string json = (dir / "w.json").string();
    test::CommandResult r = test::run_hetplan("whatif --hf-config " + hf("llama-2-7b.json") + " --gpu " + gpus +
                                              " --seq 350 --micro-batch 1 --rows " + rows + " --json " + json);
    INFO(gpus << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    auto w = rows_by_name(read_json_file(json));
    REQUIRE(w.size() == 4);
    for (auto& [name, row] : w) {
      CHECK(row["offered"] == true);
      CHECK(row["step_ms"].get<double>() > 0);
      CHECK(row["memory_per_gpu_bytes"].get<double>() > 0);
    }
    CHECK(w["ZeRO-2+offload"]["offload_optimizer"] == true);
    CHECK(w["ZeRO-3+offload"]["offload_params"] == true);
    CHECK(w["8-bit base+8-bit Adam+GC"]["recompute"] == "full");
    // Offloading trades memory for time; the offloaded ZeRO-3 keeps no weights on the GPU.
    CHECK(w["ZeRO-3+offload"]["memory_per_gpu_bytes"].get<double>() < w["ZeRO-3"]["memory_per_gpu_bytes"].get<double>());
    CHECK(w["ZeRO-3+offload"]["step_ms"].get<double>() > w["ZeRO-3"]["step_ms"].get<double>());
    CHECK(w["ZeRO-3+offload"]["weights_bytes"].get<double>() == 0);
    // ZeRO-2 keeps the whole 16-bit model on each GPU: 2 bytes x 6.74e9 parameters.
    CHECK(w["ZeRO-2+offload"]["weights_bytes"].get<double>() == 6738415616.0 * 2);
  }
}

TEST_CASE("seed setups: Llama-3.2-3B LoRA/QLoRA on one RTX 5090, and its inference", "[whatif][seeds]") {
  const auto dir = test::scratch_dir("seeds-3b");
  const std::string json = (dir / "w.json").string();
  test::CommandResult r = test::run_hetplan(
      "whatif --hf-config " + hf("llama-3.2-3b.json") +
      " --gpu RTX5090 --gpus 1 --micro-batch 4 --seq 512 --lora-rank 8 --lora-targets qkvo "
      "--rows LoRA,LoRA+GC,QLoRA,QLoRA+GC,LoRA+ZeRO-2,LoRA+ZeRO-3,QLoRA+ZeRO-2,QLoRA+ZeRO-3 --json " + json);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto w = rows_by_name(read_json_file(json));
  REQUIRE(w.size() == 8);
  auto mem = [&](const char* n) { return w[n]["memory_per_gpu_bytes"].get<double>(); };
  auto ms = [&](const char* n) { return w[n]["step_ms"].get<double>(); };
  CHECK(mem("QLoRA") < mem("LoRA"));
  CHECK(mem("LoRA+GC") < mem("LoRA"));
  CHECK(mem("QLoRA+GC") < mem("QLoRA"));
  // QLoRA pays for dequantisation: slower than LoRA, checkpointing slower again.
  CHECK(ms("QLoRA") > ms("LoRA"));
  CHECK(ms("LoRA+GC") > ms("LoRA"));
  CHECK(ms("QLoRA+GC") > ms("QLoRA"));
  // LoRA r=8 on q, k, v, o of 28 blocks (hidden 3072, kv 1024): r x (in + out) per adapter, fp32 with Adam.
  CHECK(w["LoRA"]["gbs"] == 4);
  for (const char* name : {"LoRA", "LoRA+GC", "QLoRA", "QLoRA+GC"}) CHECK(w[name]["fits"] == true);
  // ZeRO partitions over data-parallel ranks: on one GPU those rows are not offered (issue 32).
  for (const char* name : {"LoRA+ZeRO-2", "LoRA+ZeRO-3", "QLoRA+ZeRO-2", "QLoRA+ZeRO-3"}) CHECK(w[name]["offered"] == false);

  // Inference at batch 1, fp16 against INT4, graph-captured (eager, both wait on the host alike).
  r = test::run_hetplan("whatif --inference --runtime graphs --hf-config " + hf("llama-3.2-3b.json") +
                        " --gpu RTX5090 --micro-batch 1 --weights fp16,nf4 --json " + json);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const ordered_json inf = read_json_file(json);
  REQUIRE(inf["rows"].size() == 2);
  const ordered_json& fp16 = inf["rows"][0];
  const ordered_json& nf4 = inf["rows"][1];
  CHECK(fp16["weights"] == "fp16");
  CHECK(nf4["decode_ms_per_token"].get<double>() < fp16["decode_ms_per_token"].get<double>());
  CHECK(nf4["weights_bytes"].get<double>() < fp16["weights_bytes"].get<double>() / 2);
  CHECK(fp16["assumptions"].size() >= 2);
}

TEST_CASE("seed setups: GPT-2 1.5B and Llama-3.1-70B on 8 x H200", "[whatif][seeds]") {
  const auto dir = test::scratch_dir("seeds-h200");
  const std::string json = (dir / "w.json").string();
  for (const char* model : {"gpt2-xl.json", "llama-3.1-70b.json"}) {
    std::map<std::string, double> step;
    for (const char* precision : {"bf16", "fp8"}) {
      for (const char* ckpt : {"", " --recompute full --recompute-every 2"}) {
        test::CommandResult r = test::run_hetplan(std::string("whatif --hf-config ") + hf(model) +
                                                  " --gpu H200 --gpus 8 --seq 2048 --flash-attention --precision " +
                                                  precision + ckpt + " --rows \"single GPU,DDP,FSDP\" --json " + json);
        INFO(model << " " << precision << ckpt << "\n" << r.output);
        REQUIRE(r.exit_code == 0);
        auto w = rows_by_name(read_json_file(json));
        REQUIRE(w.size() == 3);
        CHECK(w["single GPU"]["gpus"] == 1);
        CHECK(w["FSDP"]["zero_stage"] == 3);
        CHECK(w["DDP"]["precision"] == precision);
        CHECK(w["DDP"]["recompute_every"] == (std::string(ckpt).empty() ? 1 : 2));
        step[std::string(precision) + ckpt] = w["FSDP"]["gpu_ms"].get<double>();  // (the GPU's: the host's is alike)
        // FSDP on 8 GPUs holds less than DDP.
        CHECK(w["FSDP"]["memory_per_gpu_bytes"].get<double>() < w["DDP"]["memory_per_gpu_bytes"].get<double>());
      }
    }
    CHECK(step["fp8"] < step["bf16"]);  // the fp8 GEMM peak is twice bf16's on H200
  }
}

TEST_CASE("whatif_calibration.json: measured host, GEMM and decode efficiencies replace the defaults",
          "[whatif][calibration]") {
  const auto dir = test::scratch_dir("whatif-calibration");
  CHECK(read_whatif_calibration(dir.string()).path.empty());  // no file: the stated defaults
  std::ofstream(dir / "whatif_calibration.json")
      << R"({"host": {"h2d_gbs": 20, "d2h_gbs": 22, "cpu_adam_params_per_s": 2e9},
            "training": {"gemm_efficiency": 0.7, "qlora_dequant_factor_emulated": 3.0},
            "inference": {"decode_hbm_efficiency": {"bf16": 0.8, "int4": 0.5}}})";
  const WhatifCalibration c = read_whatif_calibration(dir.string());
  CHECK(c.host.h2d_bytes_per_s == 20e9);
  CHECK(c.host.d2h_bytes_per_s == 22e9);
  CHECK(c.host.cpu_adam_params_per_s == 2e9);
  CHECK(c.gemm_efficiency == 0.7);
  CHECK(c.qlora_dequant_factor == 0);  // the emulated factor is informational only
  CHECK(c.decode_hbm_efficiency_bf16 == 0.8);
  CHECK(c.decode_hbm_efficiency_int4 == 0.5);
  // Through the binary: the measured host makes offload slower than the defaults on this V100 setup.
  const std::string base = "whatif --hf-config " + hf("llama-2-7b.json") + " --gpu V100 --seq 350 --rows ZeRO-2+offload";
  test::CommandResult d = test::run_hetplan(base + " --json " + (dir / "d.json").string());
  test::CommandResult m = test::run_hetplan(base + " --profiles " + dir.string() + " --json " + (dir / "m.json").string());
  REQUIRE(d.exit_code == 0);
  REQUIRE(m.exit_code == 0);
  CHECK(m.output.find("calibration: " + (dir / "whatif_calibration.json").string()) != std::string::npos);
  CHECK(m.output.find("measured (") != std::string::npos);
  const double slow = read_json_file((dir / "m.json").string())["rows"][0]["step_ms"].get<double>();
  const double fast = read_json_file((dir / "d.json").string())["rows"][0]["step_ms"].get<double>();
  CHECK(slow > fast);  // 2e9 params/s of CPU Adam against the default 3.3e9
  std::ofstream(dir / "whatif_calibration.json") << R"({"host": {"h2d_gbs": -1}})";
  CHECK_THROWS_AS(read_whatif_calibration(dir.string()), InputError);
  std::ofstream(dir / "whatif_calibration.json") << R"({"inference": {"static_kv_cache": 1}})";
  CHECK_THROWS_AS(read_whatif_calibration(dir.string()), InputError);
}

TEST_CASE("whatif_calibration.json: decode mechanism constants reach --inference", "[whatif][calibration]") {
  const auto dir = test::scratch_dir("whatif-calibration-mech");
  std::ofstream(dir / "whatif_calibration.json")
      << R"({"host": {"cpu_cast_params_per_s": 5e9},
            "inference": {"decode_hbm_efficiency": {"bf16": 0.8, "int4": 0.6}, "kernel_floor_us": 2.5,
                          "decode_kernels_per_layer": 30, "int4_row_params_per_s": 1e13,
                          "kv_repeat_materialised": true, "static_kv_cache": true,
                          "attention_hbm_efficiency": 0.4}})";
  const WhatifCalibration c = read_whatif_calibration(dir.string());
  CHECK(c.host.cpu_cast_params_per_s == 5e9);
  CHECK(c.kernel_floor_us == 2.5);
  CHECK(c.decode_kernels_per_layer == 30);
  CHECK(c.int4_row_params_per_s == 1e13);
  CHECK(c.kv_repeat_materialised);
  CHECK(c.static_kv_cache);
  CHECK(c.attention_hbm_efficiency == 0.4);
  const std::string cmd = "whatif --inference --hf-config " + hf("llama-3.2-3b.json") +
                          " --gpu H200 --micro-batch 8 --prompt 512 --output 128 --weights bf16,awq --profiles " +
                          dir.string() + " --json " + (dir / "p.json").string();
  test::CommandResult r = test::run_hetplan(cmd);
  REQUIRE(r.exit_code == 0);
  const auto rows = read_json_file((dir / "p.json").string())["rows"];
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  const GpuSpec& g = *find_gpu_spec("H200");
  for (int i = 0; i < 2; ++i) {
    InferenceSetup s;
    s.weights = i == 0 ? WeightFormat::kBf16 : WeightFormat::kInt4Awq;
    s.batch = 8;
    s.hbm_efficiency = i == 0 ? 0.8 : 0.6;
    s.launch.graph_kernel_us = 2.5;  // measured; the runtime stays eager (whatif's default)
    s.kernels_per_layer = 30;
    s.int4_row_params_per_s = i == 0 ? 0 : 1e13;
    s.kv_repeat_materialised = s.static_kv_cache = true;
    s.attention_hbm_efficiency = 0.4;
    CHECK(rows[i]["decode_ms_per_token"].get<double>() ==
          Approx(cost_inference(m, g, s).decode_ms_per_token).epsilon(1e-9));
  }
  CHECK(r.output.find("30.0 kernels per layer (measured); runtime: eager (host model: H200 host probe") != std::string::npos);
}

TEST_CASE("whatif_calibration.json: a GEMV efficiency measured net of the floor charges the GEMVs the floor",
          "[whatif][calibration][inference]") {
  const auto dir = test::scratch_dir("whatif-calibration-net-floor");
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  auto decode_ms = [&](const std::string& net_key) {
    std::ofstream(dir / "whatif_calibration.json")
        << R"({"inference": {"decode_hbm_efficiency": {"bf16": 0.7}, "kernel_floor_us": 2.5)" + net_key + "}}";
    test::CommandResult r = test::run_hetplan("whatif --inference --hf-config " + hf("llama-3.2-3b.json") +
                                              " --gpu H200 --runtime graphs --weights bf16 --profiles " + dir.string() +
                                              " --json " + (dir / "p.json").string());
    REQUIRE(r.exit_code == 0);
    return read_json_file((dir / "p.json").string())["rows"][0]["decode_ms_per_token"].get<double>();
  };
  const double gross = decode_ms("");  // an older file: the efficiency holds the GEMVs' floor
  const double net = decode_ms(R"(, "decode_hbm_efficiency_net_of_floor": true)");
  // The 7 x 28 GEMVs and the LM head: 197 kernels x 2.5 us more when the efficiency is net of their floor.
  CHECK(net - gross == Approx((7.0 * m.num_layers + 1) * 2.5e-3).epsilon(1e-9));
}

TEST_CASE("whatif_calibration.json: measured attention, elementwise and optimizer efficiencies", "[whatif][calibration]") {
  const auto dir = test::scratch_dir("whatif-calibration-train");
  const std::string base = "whatif --family llama --hidden-size 2048 --layers 20 --heads 16 --kv-heads 16 --ffn-size 5632"
                           " --vocab-size 512 --seq 1024 --micro-batch 4 --gpus 1 --gpu H200 --flash-attention"
                           " --rows \"single GPU\" --profiles " + dir.string() + " --json " + (dir / "p.json").string();
  auto step = [&](const std::string& training) {
    std::ofstream(dir / "whatif_calibration.json") << "{\"training\": {" + training + "}}";
    test::CommandResult r = test::run_hetplan(base);
    REQUIRE(r.exit_code == 0);
    return read_json_file((dir / "p.json").string())["rows"][0]["step_ms"].get<double>();
  };
  const double plain = step("\"gemm_efficiency\": 0.7");
  // Measured values equal to the ones they replace (attention at the GEMM efficiency, elementwise and optimizer
  // at the default 0.75 of HBM) change nothing.
  CHECK(step("\"gemm_efficiency\": 0.7, \"attention_efficiency\": 0.7, \"elementwise_efficiency\": 0.75, "
             "\"optimizer_hbm_efficiency\": 0.75") == Approx(plain).epsilon(1e-12));
  // The optimizer at a third of the bandwidth: 1.03e9 parameters x 30 B at 4.8 TB/s x 0.25 instead of x 0.75.
  const double params = 1029783552;  // the replayed shape's parameters (scripts/gpu_whatif_calibrate.py reports it)
  const double opt = step("\"gemm_efficiency\": 0.7, \"optimizer_hbm_efficiency\": 0.25");
  // (Within 1e-5: the simulator scales the step by the stage's share of the profile's per-layer bytes and of the
  // trainable parameters, each a ratio of sums that need not round to exactly 1.)
  CHECK(opt - plain == Approx(params * 30 / 4800e9 * (1 / 0.25 - 1 / 0.75) * 1e3).epsilon(1e-5));
  CHECK(step("\"gemm_efficiency\": 0.7, \"attention_efficiency\": 0.35") > plain);
  CHECK(step("\"gemm_efficiency\": 0.7, \"elementwise_efficiency\": 0.3") > plain);
}

TEST_CASE("one roofline: the slower of compute and memory, at achieved rates", "[whatif][roofline]") {
  const Roofline r = make_roofline(100, 0.5, 1000, 0.8);  // 50 TFLOP/s, 800 GB/s achieved
  CHECK(r.flops_per_s == 100 * 1e12 * 0.5);
  CHECK(r.bytes_per_s == 1000 * 1e9 * 0.8);
  CHECK(r.compute_s(50e12) == 1.0);
  CHECK(r.memory_s(800e9) == 1.0);
  CHECK(r.seconds(100e12, 800e9) == 2.0);  // compute-bound
  CHECK(r.seconds(50e12, 1600e9) == 2.0);  // memory-bound
}

TEST_CASE("whatif --print-constants: the model's and the roofline's constants as JSON", "[whatif][cli]") {
  const auto dir = test::scratch_dir("whatif-constants");
  const std::string out = (dir / "c.json").string();
  test::CommandResult r = test::run_hetplan("whatif --print-constants --gpu H100 --hf-config " +
                                            hf("llama-3.2-3b.json") + " --seq 1024 --json " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const ordered_json j = read_json_file(out);
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  CHECK(j["model"]["linear_forward_flops_per_token"].get<double>() == m.linear_forward_flops_per_token());
  CHECK(j["model"]["attention_forward_flops_per_token"].get<double>() == m.attention_forward_flops_per_token(1024));
  CHECK(j["model"]["kv_cache_bytes_per_token"].get<double>() == kv_cache_bytes_per_token(m));
  CHECK(j["model"]["blocks"] == 28);
  CHECK(j["model"]["metis_layers"] == 30);
  CHECK(j["flops"]["training_flops_per_forward_flop"].get<double>() == 3.0);
  CHECK(j["whatif"]["elementwise_bytes_per_token_hidden"].get<double>() == kElementwiseBytesPerTokenHidden);
  CHECK(j["whatif"]["optimizer_bytes_per_param"].get<double>() == kCpuAdamBytesPerParam);
  CHECK(j["roofline"]["whatif_gemm_efficiency"].get<double>() == 0.6);
  CHECK(j["roofline"]["analytic_compute_efficiency"].get<double>() == RateDefaults{}.gemm_efficiency);
  CHECK(j["gpu"]["name"] == "H100");
  CHECK(j["gpu"]["memory_bw_gbs"].get<double>() == find_gpu_spec("H100")->memory_bw_gbs);
  CHECK(ordered_json::parse(r.output) == j);  // stdout holds the same JSON
}

// ------------------------------------------------------------------ runtime overheads (issue 32, item 4)

TEST_CASE("runtime: kernel counts itemised from the code", "[whatif][runtime]") {
  CHECK(parse_launch_runtime("graphs", "--runtime") == LaunchRuntime::kGraphs);
  CHECK_THROWS_AS(parse_launch_runtime("compiled", "--runtime"), InputError);
  // Kernel counts, itemised: a GPT-2 block under autocast (fused c_attn): 2 LayerNorms, 4 GEMMs each with its
  // weight and bias casts, SDPA and its output copy, GELU, 2 residual adds = 2 + 12 + 2 + 1 + 2.
  const ModelShape gpt = read_hf_config(hf("gpt2-xl.json"));
  CHECK(eager_block_forward_kernels(gpt, true, true) == 19);
  CHECK(eager_block_forward_kernels(gpt, false, true) == 11);
  // A Llama decoder layer of HF's eager generate: 16 (RMSNorms) + 3 + 10 (rotary) + 2 (cache) + 2 (repeat_kv)
  // + 3 (SDPA, mask) + 2 + 5 (SwiGLU) + 2.
  const ModelShape llama = read_hf_config(hf("llama-3.2-3b.json"));
  CHECK(hf_decode_kernels_per_layer(llama) == 45);
}

// The validation's GPT (scripts/validation/whatif/gpt-1.3b.json: GPT-2 blocks, hidden 2048, 24 blocks).
ModelShape validation_gpt() {
  return read_hf_config(std::string(HETPLAN_SOURCE_DIR) + "/scripts/validation/whatif/gpt-1.3b.json");
}

// The validation's 2-GPU step of that GPT (sequence 2048, one node of two `gpu`) at `micro_batch` samples.
WhatifInput validation_gpt_pair(const char* gpu, int micro_batch) {
  WhatifInput in;
  in.shape = validation_gpt();
  in.seq = 2048;
  in.gpu = find_gpu_spec(gpu);
  in.gpus = 2;
  in.gpus_per_node = 2;
  in.micro_batch = micro_batch;
  return in;
}

TEST_CASE("host model: op counts itemised from the code match the profiler's on the validation GPT",
          "[whatif][runtime][host]") {
  // logs/validate/host-probe-h200/host_probe_micro.json, tiny_gpt_step (the validation model's code at width 64) under
  // torch.profiler: per block (24 blocks minus 12, over 12) 17 top-level forward ops, 36 backward kernels,
  // 51 autograd nodes; the ends (24 blocks' totals 417, 881, 1242 minus 24 blocks) 9, 17 and 18.
  const ModelShape m = validation_gpt();
  const EagerOps block = eager_block_ops(m, true), ends = eager_ends_ops(m, true);
  CHECK(block.forward_ops == 17);
  CHECK(block.backward_kernels == 36);
  CHECK(block.backward_nodes == 51);
  CHECK(ends.forward_ops == 9);
  CHECK(ends.backward_kernels == 17);
  CHECK(ends.backward_nodes == 18);
  CHECK(parameter_tensors(m) == 292);  // the probe's "parameters"
  // Without autocast (FSDP2's mixed precision casts the parameters instead) no cast nodes: 4 linears x 2-3 fewer.
  CHECK(eager_block_ops(m, false).backward_kernels == 36 - 10 - 2);
  // HF's eager Llama decoder layer: its 45 kernels and 16 views (the probe's tiny loop: 60 per layer).
  CHECK(hf_decode_ops_per_layer(read_hf_config(hf("llama-3.2-3b.json"))) == 61);
}

TEST_CASE("host model: the defaults are the H200 probe's figures", "[whatif][runtime][host]") {
  const HostCosts d = default_host_costs();
  const HostCosts p = read_host_probe(std::string(HETPLAN_SOURCE_DIR) + "/logs/validate/host-probe-h200/host_probe_micro.json");
  CHECK(p.forward_op_us == Approx(d.forward_op_us).epsilon(1e-12));
  CHECK(p.backward_kernel_us == Approx(d.backward_kernel_us).epsilon(1e-12));
  CHECK(p.checkpoint_forward_us == Approx(d.checkpoint_forward_us).epsilon(1e-12));
  CHECK(p.checkpoint_backward_us == Approx(d.checkpoint_backward_us).epsilon(1e-12));
  CHECK(p.ddp_param_us == Approx(d.ddp_param_us).epsilon(1e-12));
  CHECK(p.fsdp2_module_us == Approx(d.fsdp2_module_us).epsilon(1e-12));
  CHECK(p.fsdp2_param_us == Approx(d.fsdp2_param_us).epsilon(1e-12));
  CHECK(p.adam_step_us == Approx(d.adam_step_us).epsilon(1e-12));
  CHECK(p.adam_tensor_us == Approx(d.adam_tensor_us).epsilon(1e-12));
  CHECK(p.zero_grad_tensor_us == Approx(d.zero_grad_tensor_us).epsilon(1e-12));
  CHECK(p.nograd_op_us == Approx(d.nograd_op_us).epsilon(1e-12));
  CHECK(p.fsdp2_forward_share == Approx(d.fsdp2_forward_share).epsilon(1e-12));
  CHECK(p.fsdp2_optimizer_share == Approx(d.fsdp2_optimizer_share).epsilon(1e-12));
  // FSDP2's phases in the H200 dist probe's tiny GPT against none: forward 52.14 - 8.72, backward 75.63 - 21.94,
  // optimizer 7.83 - 1.72 ms.
  CHECK(d.fsdp2_forward_share == Approx(43.42 / 103.22).epsilon(1e-3));
  CHECK(d.fsdp2_optimizer_share == Approx(6.115 / 103.22).epsilon(1e-3));
  // The forward's per-op cost is the tiny GPT's forward host time over its 417 ops.
  CHECK(d.forward_op_us == Approx(12.349 / 417 * 1e3).epsilon(1e-3));
  // A probe without a figure is refused, naming the file and the key.
  const auto dir = test::scratch_dir("host-probe-bad");
  const std::string bad = (dir / "host_probe_micro.json").string();
  { std::ofstream(bad) << R"({"tiny_gpt_step": {}})"; }
  try {
    read_host_probe(bad);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("host_probe_micro.json") != std::string::npos);
    CHECK(std::string(e.what()).find("blocks24_ckpt0") != std::string::npos);
  }
}

TEST_CASE("host model: a re-probed host's speed scales every host cost, and so the host's step", "[whatif][runtime][host]") {
  const HostCosts d = default_host_costs();
  const HostCosts s = scaled_host_costs(d, 1.25);
  CHECK(s.forward_op_us == Approx(1.25 * d.forward_op_us).epsilon(1e-12));
  CHECK(s.backward_kernel_us == Approx(1.25 * d.backward_kernel_us).epsilon(1e-12));
  CHECK(s.checkpoint_forward_us == Approx(1.25 * d.checkpoint_forward_us).epsilon(1e-12));
  CHECK(s.checkpoint_backward_us == Approx(1.25 * d.checkpoint_backward_us).epsilon(1e-12));
  CHECK(s.ddp_param_us == Approx(1.25 * d.ddp_param_us).epsilon(1e-12));
  CHECK(s.fsdp2_module_us == Approx(1.25 * d.fsdp2_module_us).epsilon(1e-12));
  CHECK(s.fsdp2_param_us == Approx(1.25 * d.fsdp2_param_us).epsilon(1e-12));
  CHECK(s.adam_step_us == Approx(1.25 * d.adam_step_us).epsilon(1e-12));
  CHECK(s.adam_tensor_us == Approx(1.25 * d.adam_tensor_us).epsilon(1e-12));
  CHECK(s.zero_grad_tensor_us == Approx(1.25 * d.zero_grad_tensor_us).epsilon(1e-12));
  CHECK(s.nograd_op_us == Approx(1.25 * d.nograd_op_us).epsilon(1e-12));
  // whatif --host-speed: the host's time to issue the step is linear in the costs, so it doubles.
  const auto dir = test::scratch_dir("whatif-host-speed");
  auto host_ms = [&](const std::string& extra) {
    const std::string json = (dir / "w.json").string();
    const test::CommandResult r = test::run_hetplan("whatif --hf-config " + hf("llama-3.2-3b.json") +
                                                    " --gpu H100 --gpus 1 --seq 1024 --rows \"single GPU\" --json " +
                                                    json + extra);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return rows_by_name(read_json_file(json))["single GPU"]["host_ms"].get<double>();
  };
  CHECK(host_ms(" --host-speed 2") == Approx(2 * host_ms("")).epsilon(1e-9));
  CHECK(test::run_hetplan("whatif --hf-config " + hf("llama-3.2-3b.json") + " --gpu H100 --host-speed 0").exit_code == 2);
}

TEST_CASE("host model: the host runs ahead of the GPU until the step's end", "[whatif][runtime][host]") {
  // GPU-bound: forward host 10 (GPU 4): the GPU waits until 10; backward GPU 20 -> 30; optimizer 3 -> 33.
  const double h1[] = {10, 5, 1}, g1[] = {4, 20, 3};
  CHECK(host_ahead_step_ms(h1, g1, 3) == 33);
  // Host-bound backward: the host issues until 40; the GPU's optimizer ends 3 ms after the backward's 40.
  const double h2[] = {10, 30, 1}, g2[] = {4, 20, 3};
  CHECK(host_ahead_step_ms(h2, g2, 3) == 43);
  // One phase: max(G, H).
  const double h3[] = {7}, g3[] = {5};
  CHECK(host_ahead_step_ms(h3, g3, 1) == 7);
  CHECK(host_ahead_step_ms(g3, h3, 1) == 7);
}

TEST_CASE("host model: checkpointing adds recomputed forwards, DDP per parameter, FSDP2 per module",
          "[whatif][runtime][host]") {
  const ModelShape m = validation_gpt();
  const HostCosts c = default_host_costs();
  TrainingHostSetup s;
  const HostStep plain = eager_training_host(m, s, c);
  CHECK(plain.forward_ms == Approx((24 * 17 + 9) * c.forward_op_us * 1e-3).epsilon(1e-12));
  CHECK(plain.backward_ms == Approx((24 * 36 + 17) * c.backward_kernel_us * 1e-3).epsilon(1e-12));
  // AdamW(fused) and then zero_grad(set_to_none=True), each over the 292 parameter tensors; the probe's zero_grad
  // phase took 0.382 ms over them (logs/validate/host-probe-h200).
  CHECK(plain.optimizer_ms ==
        Approx((c.adam_step_us + 292 * (c.adam_tensor_us + c.zero_grad_tensor_us)) * 1e-3).epsilon(1e-12));
  CHECK(292 * c.zero_grad_tensor_us * 1e-3 == Approx(0.382).epsilon(1e-3));
  s.checkpoint_every = 1;
  const HostStep ckpt = eager_training_host(m, s, c);
  CHECK(ckpt.recompute_ms == Approx(24 * (17 * c.forward_op_us + c.checkpoint_backward_us) * 1e-3).epsilon(1e-12));
  CHECK(ckpt.backward_ms - plain.backward_ms == Approx(ckpt.recompute_ms).epsilon(1e-12));
  CHECK(ckpt.forward_ms - plain.forward_ms == Approx(24 * c.checkpoint_forward_us * 1e-3).epsilon(1e-12));
  s.checkpoint_every = 2;  // every 2nd block: 12 regions
  CHECK(eager_training_host(m, s, c).recompute_ms == Approx(ckpt.recompute_ms / 2).epsilon(1e-12));
  s.checkpoint_every = 0;
  s.wrapper = DataParallelWrapper::kDdp;
  // DDP's Reducer from its mechanism: per parameter tensor its two copies (into the bucket, back into .grad), each
  // a kernel at the backward's per-kernel cost; per bucket one all-reduce issued, an op at forward_op_us. The
  // validation GPT's fp32 gradients (1 315 819 520 parameters, the embedding's 107 216 896 in a bucket of their
  // own): 1 MiB, then ceil((4 834 410 496 - 1 MiB) / 25 MiB) = 185 of 25 MiB, then the embedding's: 187.
  DdpBuckets buckets;
  const double fp32 = 4;
  CHECK(m.parameter_count() == 1315819520LL);
  CHECK(m.embedding_params() == 107216896LL);
  s.ddp_buckets = ddp_bucket_count(buckets, m.parameter_count() * fp32, m.embedding_params() * fp32);
  CHECK(s.ddp_buckets == 187);
  const HostStep ddp = eager_training_host(m, s, c);
  CHECK(ddp.wrapper_ms ==
        Approx((292 * 2 * c.backward_kernel_us + 187 * c.forward_op_us) * 1e-3).epsilon(1e-12));
  CHECK(ddp.backward_ms - plain.backward_ms == Approx(ddp.wrapper_ms).epsilon(1e-12));
  // Not the tiny probe's DDP-minus-plain step (ddp_param_us: 9 to 168 us per tensor on one machine kind).
  HostCosts noisy = c;
  noisy.ddp_param_us *= 10;
  CHECK(eager_training_host(m, s, noisy).wrapper_ms == Approx(ddp.wrapper_ms).epsilon(1e-12));
  s.ddp_buckets = 0;
  s.wrapper = DataParallelWrapper::kFsdp2;
  const HostStep fsdp = eager_training_host(m, s, c);
  CHECK(fsdp.wrapper_ms == Approx((25 * c.fsdp2_module_us + 292 * c.fsdp2_param_us) * 1e-3).epsilon(1e-12));
  // Split as the probe's phases: the forward's share, the optimizer's (once per step), the rest in the backward.
  CHECK(fsdp.forward_ms - plain.forward_ms == Approx(fsdp.wrapper_ms * c.fsdp2_forward_share).epsilon(1e-12));
  CHECK(fsdp.optimizer_ms - plain.optimizer_ms == Approx(fsdp.wrapper_ms * c.fsdp2_optimizer_share).epsilon(1e-12));
  CHECK(fsdp.backward_ms - plain.backward_ms ==
        Approx(fsdp.wrapper_ms * (1 - c.fsdp2_forward_share - c.fsdp2_optimizer_share)).epsilon(1e-12));
}

TEST_CASE("DDP's all-reduces stretch the backward they overlap by the measured reduce factor", "[whatif][runtime]") {
  // whatif's DDP row: the bucket chain (187 all-reduces of the validation GPT's fp32 gradients) beside the backward
  // slows its compute by (f - 1) x min(backward, chain) (sim/dp_overlap.h). A comm_overlap.json's reduce factor
  // (WhatifInput::overlap, whatif --profiles) or --comm-slowdown (the row's setup) sets f; one GPU has no chain.
  WhatifInput in = validation_gpt_pair("H100", 4);
  in.launch.runtime = LaunchRuntime::kGraphs;  // the GPU's step alone
  TrainingSetup base;
  WhatifRow ddp_row, single_row;
  for (const auto& r : standard_whatif_rows(base, 16, kTargetQ | kTargetV, 2)) {
    if (r.name == "DDP") ddp_row = r;
    if (r.name == "single GPU") single_row = r;
  }
  REQUIRE(ddp_row.setup.ddp.model);
  REQUIRE(single_row.name == "single GPU");
  const WhatifResult deflt = cost_whatif_row(in, ddp_row);  // kCommComputeSlowdown
  const double single = cost_whatif_row(in, single_row).gpu_ms;
  in.overlap.reduce = kCommComputeSlowdown + 0.5;
  in.overlap_measured = true;
  const WhatifResult measured = cost_whatif_row(in, ddp_row);
  const double stretch = measured.gpu_ms - deflt.gpu_ms;
  // The chain alone: 0.5 ms of stretch per ms of it, so it is 2 x stretch, under the backward (hidden), and the
  // same chain at any f: 1.5 more gives 3 x stretch.
  CHECK(stretch > 1);
  in.overlap.reduce = kCommComputeSlowdown + 2;
  CHECK(cost_whatif_row(in, ddp_row).gpu_ms - deflt.gpu_ms == Approx(4 * stretch).epsilon(1e-9));
  CHECK(cost_whatif_row(in, single_row).gpu_ms == Approx(single).epsilon(1e-12));
  // --comm-slowdown (the row's setup) over the measured file.
  ddp_row.setup.overlap.compute_slowdown = kCommComputeSlowdown + 0.5;
  const WhatifResult flag = cost_whatif_row(in, ddp_row);
  CHECK(flag.gpu_ms == Approx(measured.gpu_ms).epsilon(1e-12));
  bool named = false;
  for (const auto& a : flag.assumptions) named |= a.find("stretched x1.535 (--comm-slowdown)") != std::string::npos;
  CHECK(named);
}

TEST_CASE("host model: FSDP2's optimizer share is charged once per step, its hooks once per micro-batch",
          "[whatif][runtime][host]") {
  // Gradient accumulation repeats the forward's and backward's host work (FSDP2 all-gathers and reduce-scatters
  // every micro-batch) but not the optimizer step over the DTensors.
  WhatifInput in = validation_gpt_pair("H100", 1);
  TrainingSetup base;
  WhatifRow fsdp_row;
  for (const auto& r : standard_whatif_rows(base, 16, kTargetQ | kTargetV, 2))
    if (r.name == "FSDP") fsdp_row = r;
  REQUIRE(fsdp_row.name == "FSDP");
  TrainingHostSetup h;
  h.autocast = fsdp_row.autocast;
  const HostStep plain = eager_training_host(in.shape, h, in.launch.host);  // the same model without FSDP2
  h.wrapper = DataParallelWrapper::kFsdp2;
  const HostStep step = eager_training_host(in.shape, h, in.launch.host);
  const double per_step = step.wrapper_ms * in.launch.host.fsdp2_optimizer_share;
  const double per_micro_batch = step.wrapper_ms - per_step;
  CHECK(per_step > 1);
  in.gbs = 2;
  const WhatifResult one = cost_whatif_row(in, fsdp_row);
  in.gbs = 8;  // four micro-batches per rank
  const WhatifResult four = cost_whatif_row(in, fsdp_row);
  REQUIRE(four.accumulation == 4);
  CHECK(one.host_ms == Approx(plain.forward_ms + plain.backward_ms + plain.optimizer_ms + step.wrapper_ms).epsilon(1e-12));
  // Three more micro-batches: three more forwards and backwards with FSDP2's per-micro-batch hooks, and no more
  // of its optimizer share.
  CHECK(four.host_ms - one.host_ms ==
        Approx(3 * (plain.forward_ms + plain.backward_ms + per_micro_batch)).epsilon(1e-12));
}

TEST_CASE("host model: the probe's offload figures set the ZeRO-Offload row's CPU AdamW, cast and copies",
          "[whatif][runtime][host][offload]") {
  // host_probe_offload.json beside the micro probe: the row's CPU Adam time is the partition over its rate.
  const auto dir = test::scratch_dir("host-probe-offload");
  std::filesystem::copy_file(std::string(HETPLAN_SOURCE_DIR) + "/logs/validate/host-probe-h200/host_probe_micro.json",
                             dir / "host_probe_micro.json", std::filesystem::copy_options::overwrite_existing);
  const std::string micro = (dir / "host_probe_micro.json").string();
  auto step_ms = [&](double adam, std::string* assumptions) {
    { std::ofstream(dir / "host_probe_offload.json")
          << R"({"cpu_threads": 32, "cpu_adamw_fused": {"params_per_s": )" << adam
          << R"(}, "cpu_cast_fp32_bf16": {"params_per_s": 2e10},)"
          << R"( "pinned_copy": {"h2d_bytes_per_s": 4e10, "d2h_bytes_per_s": 3e10}})"; }
    const std::string json = (dir / "w.json").string();
    const test::CommandResult r = test::run_hetplan(
        "whatif --hf-config " + std::string(HETPLAN_SOURCE_DIR) + "/scripts/validation/whatif/gpt-1.3b.json" +
        " --gpu H100 --seq 2048 --gpus 1 --micro-batch 4 --rows ZeRO-2+offload --deepspeed-config " +
        std::string(HETPLAN_SOURCE_DIR) + "/scripts/validation/whatif/ds_offload_1gpu.json --host-probe " + micro +
        " --json " + json);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const ordered_json row = rows_by_name(read_json_file(json))["ZeRO-2+offload"];
    if (assumptions) *assumptions = row["assumptions"].dump();
    return row["step_ms"].get<double>();
  };
  std::string said;
  const double t1 = step_ms(1e9, &said), t2 = step_ms(2e9, nullptr), t4 = step_ms(4e9, nullptr);
  CHECK(said.find("CPU Adam 1.00e9 params/s per host (probe ") != std::string::npos);
  CHECK(said.find("40.0 GB/s pinned") != std::string::npos);
  // Linear in 1 / rate: the step's CPU Adam is N / rate.
  CHECK(t1 - t2 > 100);
  CHECK(t1 - t2 == Approx(2 * (t2 - t4)).epsilon(1e-9));
  // A figure missing: refused, naming the file and the key.
  { std::ofstream(dir / "host_probe_offload.json") << R"({"cpu_adamw_fused": {}})"; }
  HostSpec h;
  try {
    read_host_probe_offload(micro, h);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("host_probe_offload.json") != std::string::npos);
    CHECK(std::string(e.what()).find("params_per_s") != std::string::npos);
  }
  std::filesystem::remove(dir / "host_probe_offload.json");
  CHECK_FALSE(read_host_probe_offload(micro, h));
}

TEST_CASE("whatif: a batch-1 step of the validation GPT is host-bound with checkpointing, not with graphs",
          "[whatif][runtime][host]") {
  WhatifInput in = validation_gpt_pair("H200", 1);
  TrainingSetup base;
  base.recompute = Recompute::kFull;
  const std::vector<WhatifRow> rows = standard_whatif_rows(base, 16, kTargetQ | kTargetV, 2);
  auto row = [&](const std::string& name) {
    for (const auto& r : rows)
      if (r.name == name) return r;
    FAIL("no row " << name);
    return rows[0];
  };
  auto has = [](const WhatifResult& w, const std::string& a) {
    for (const auto& x : w.assumptions)
      if (x.find(a) != std::string::npos) return true;
    return false;
  };
  for (const char* name : {"single GPU", "FSDP"}) {
    INFO(name);
    in.launch.runtime = LaunchRuntime::kEager;
    const WhatifResult eager = cost_whatif_row(in, row(name));
    CHECK(eager.step_ms > eager.gpu_ms);
    CHECK(eager.step_ms >= eager.host_ms);
    CHECK(has(eager, "host-bound"));
    // The host's per-op costs made it so: without them the step is the GPU's.
    in.launch.host = HostCosts();
    CHECK(cost_whatif_row(in, row(name)).step_ms == Approx(eager.gpu_ms).epsilon(1e-12));
    in.launch.host = default_host_costs();
    in.launch.runtime = LaunchRuntime::kGraphs;
    const WhatifResult graphs = cost_whatif_row(in, row(name));
    CHECK(graphs.host_ms == 0);
    CHECK(graphs.step_ms == graphs.gpu_ms);
    CHECK(has(graphs, "runtime: CUDA graphs (2.16 us/kernel floor)"));
  }
}

TEST_CASE("inference: HF generate eager is host-bound, a graph-captured decoder is not", "[whatif][runtime][inference]") {
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  const GpuSpec& g = *find_gpu_spec("H100");
  InferenceSetup s;
  s.launch.runtime = LaunchRuntime::kGraphs;
  const InferenceResult graphs = cost_inference(m, g, s);
  s.launch.runtime = LaunchRuntime::kEager;
  const InferenceResult eager = cost_inference(m, g, s);
  // The host issues 61 ops per layer and 31 per step (the kernels and their views) at the probe's per-op cost.
  const double ops = hf_decode_ops_per_layer(m) * m.num_layers + hf_decode_ops_per_step(m);
  CHECK(ops == 61 * 28 + 31);
  CHECK(eager.decode_ms_per_token == Approx(ops * default_host_costs().nograd_op_us * 1e-3).epsilon(1e-12));
  // Graphs: the roofline step plus every kernel's GPU floor (the 7 x 28 GEMVs and the head too).
  const double kernels = hf_decode_kernels_per_layer(m) * m.num_layers + hf_decode_kernels_per_step(m);
  s.launch.graph_kernel_us = 0;
  s.launch.runtime = LaunchRuntime::kGraphs;
  const double roofline_ms = cost_inference(m, g, s).decode_ms_per_token;
  CHECK(graphs.decode_ms_per_token ==
        Approx(roofline_ms + kernels * kDefaultGraphKernelUs * 1e-3).epsilon(1e-12));
  CHECK(eager.decode_ms_per_token > 1.5 * graphs.decode_ms_per_token);
}

TEST_CASE("DDP buckets: a second copy of the gradients, all-reduces overlapped with the backward", "[whatif][runtime]") {
  // Memory: the buckets hold every gradient again (fp32 under Megatron's accounting), unless they are views;
  // and at the run's peak the old buckets, held across the rebuild at the second step, once more.
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  const double fp32_gradients = static_cast<double>(m.parameter_count()) * 4;
  TrainingSetup s;
  s.accounting = ZeroAccounting::kMegatron;
  RankShard r;
  r.first_layer = 0;
  r.end_layer = m.metis_num_layers();
  r.dp = 2;
  const MemoryBreakdown plain = rank_memory(m, s, r);
  s.ddp.model = true;
  s.ddp.old_buckets_held_at_rebuild = false;  // a steady-state step: one copy
  CHECK(rank_memory(m, s, r).states.gradients - plain.states.gradients == fp32_gradients);
  s.ddp.old_buckets_held_at_rebuild = true;  // the default: the run's peak, at the second step
  CHECK(rank_memory(m, s, r).states.gradients - plain.states.gradients == 2 * fp32_gradients);
  s.ddp.gradient_as_bucket_view = true;  // the gradients are the new buckets; the old ones are held all the same
  CHECK(rank_memory(m, s, r).states.gradients - plain.states.gradients == fp32_gradients);
  s.ddp.old_buckets_held_at_rebuild = false;
  CHECK(rank_memory(m, s, r).states.gradients == plain.states.gradients);
  // Time: 100 MiB of gradients over a 10 ms backward, 1 ms per MiB all-reduced, 20 MiB of them the embedding's
  // (ready at the end). Buckets: 1 MiB, then 25, 25, 25, 4 (80 MiB produced uniformly), then the 20 MiB one.
  DdpBuckets d;
  d.model = true;
  const double MiB = 1024.0 * 1024;
  auto ar = [&](double bytes) { return bytes / MiB; };
  auto copy = [&](double bytes) { return bytes / MiB * 0.01; };
  const DdpSyncTime t = ddp_sync(d, 100 * MiB, 20 * MiB, 10, 1.0, ar, copy);
  CHECK(t.buckets == 6);
  // The comm stream: 1 MiB ready at 0.1 ms (done 1.1), 25 MiB ready at 2.6 ms (done 27.6), then back to back:
  // 52.6, 77.6, 81.6, and the embedding's 20 MiB at 101.6 ms, 91.6 ms after the backward; then the copy back.
  CHECK(t.exposed_ms == Approx(101.6 - 10 + 1).epsilon(1e-12));
  CHECK(t.backward_added_ms == Approx(1).epsilon(1e-12));
  // A fast link: only the last bucket (the embedding's) shows.
  auto fast = [&](double bytes) { return bytes / MiB * 0.01; };
  CHECK(ddp_sync(d, 100 * MiB, 20 * MiB, 10, 1.0, fast, copy).exposed_ms == Approx(0.2 + 1).epsilon(1e-9));
  // The backward's compute beside the chain (NCCL's SMs and HBM traffic), at a measured factor 1.3 (sim/dp_overlap.h):
  // (1.3 - 1) x min(backward, chain alone). The slow link's chain (100 ms alone) outlasts the 10 ms backward: 3 ms;
  // the fast link's (1 ms) lies inside it: 0.3 ms. Both add to what the step pays: copy in, stretch, tail, copy back.
  CHECK(t.chain_ms == Approx(100).epsilon(1e-12));
  CHECK(t.stretch_ms == 0.0);
  const DdpSyncTime slow = ddp_sync(d, 100 * MiB, 20 * MiB, 10, 1.3, ar, copy);
  CHECK(slow.stretch_ms == Approx(3).epsilon(1e-12));
  CHECK(slow.step_added_ms() == Approx(1 + 3 + (101.6 - 10 + 1)).epsilon(1e-12));
  CHECK(ddp_sync(d, 100 * MiB, 20 * MiB, 10, 1.3, fast, copy).stretch_ms == Approx(0.3).epsilon(1e-9));
}

TEST_CASE("DDP's old buckets: held from the rebuild until the watchdog's poll, counted at the peaks they reach",
          "[whatif][runtime]") {
  // When: the watchdog polls every 100 ms at any phase of the step, and releases the old buckets at its first
  // poll after their last all-reduce completed. Completed 15 ms before the rebuild: alive 20 ms after it in
  // 1 - 35/100 of runs, 40 ms after it in 45%, 90 ms after it in none.
  DdpBuckets d;
  d.model = true;
  CHECK(old_buckets_alive_share(d, 15, 20) == Approx(0.65).epsilon(1e-12));
  CHECK(old_buckets_alive_share(d, 15, 40) == Approx(0.45).epsilon(1e-12));
  CHECK(old_buckets_alive_share(d, 15, 90) == 0.0);
  old_buckets_phases(d, 15, 20, 90);  // the median run: alive at the activations' peak, not the gradients'
  CHECK(d.old_at_activation_peak);
  CHECK(!d.old_at_gradient_peak);
  old_buckets_phases(d, 15, 40, 90);  // a longer forward on the host: released before its end in most runs
  CHECK(!d.old_at_activation_peak);
  CHECK(old_buckets_phases_name(d) == "none");
  parse_old_buckets_phases("gradients", "--ddp-old-buckets", d);  // plan files and simulate name them
  CHECK((!d.old_at_activation_peak && d.old_at_gradient_peak && old_buckets_phases_name(d) == "gradients"));
  CHECK_THROWS_AS(parse_old_buckets_phases("forward", "--ddp-old-buckets", d), InputError);
  d.watchdog_period_ms = 1000;  // a slow watchdog: alive through the whole step
  old_buckets_phases(d, 15, 40, 90);
  CHECK(d.old_at_activation_peak);
  CHECK(d.old_at_gradient_peak);

  // Where: the PyTorch rows' two peaks, the backward's start (A: activations and autocast's 16-bit weight copies)
  // and its end (G: the fp32 gradients, allocated in the backward); the old copy (P, the gradients' bytes again)
  // adds to the peaks it is alive at, and the rank's peak is the larger: max(A + P [at A], G + P [at G]).
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  const double P = static_cast<double>(m.parameter_count()) * 4;
  TrainingSetup s;
  s.accounting = ZeroAccounting::kMegatron;
  s.grads_in_backward = true;
  s.flash_attention = true;
  s.ddp.model = true;
  RankShard r;
  r.first_layer = 0;
  r.end_layer = m.metis_num_layers();
  r.dp = 2;
  r.seq = 1024;
  auto peak = [&](bool at_a, bool at_g) {
    TrainingSetup t = s;
    t.ddp.old_at_activation_peak = at_a;
    t.ddp.old_at_gradient_peak = at_g;
    return rank_memory(m, t, r).allocated_peak();
  };
  for (long long mb : {1LL, 8LL}) {
    r.micro_batch = mb;
    TrainingSetup steady_setup = s;
    steady_setup.ddp.old_buckets_held_at_rebuild = false;
    const MemoryBreakdown steady = rank_memory(m, steady_setup, r);
    const double A = steady.activations + steady.recompute_workspace + steady.states.weights;
    const double G = P;  // fp32 gradients, the same bytes as the old buckets
    INFO("micro-batch " << mb << ": A " << A / 1e9 << " GB, G " << G / 1e9 << " GB");
    if (mb == 1) REQUIRE(A < G);      // the gradients' peak is the steady step's
    if (mb == 8) REQUIRE(A > G + P);  // the activations' peak is, even with the copy at the gradients'
    const double base = steady.allocated_peak();
    CHECK(peak(false, false) == Approx(base).epsilon(1e-12));
    CHECK(peak(true, false) - base == Approx(std::max(A + P, G) - std::max(A, G)).epsilon(1e-9));
    CHECK(peak(false, true) - base == Approx(std::max(A, G + P) - std::max(A, G)).epsilon(1e-9));
    CHECK(peak(true, true) - base == Approx(P).epsilon(1e-9));
    if (mb == 1) {
      // Alive at the backward's start only: it binds there, but only by what that peak lacks of the other.
      CHECK(peak(true, false) - base == Approx(A + P - G).epsilon(1e-9));
      CHECK(peak(true, false) - base < 0.99 * P);
      CHECK(peak(false, true) - base == Approx(P).epsilon(1e-9));
    } else {
      CHECK(peak(true, false) - base == Approx(P).epsilon(1e-9));  // binds in full
      CHECK(peak(false, true) == Approx(base).epsilon(1e-12));     // alive only at a peak that is not the step's
    }
  }
}

TEST_CASE("whatif DDP row: its buckets cost memory and time that the single GPU row does not have",
          "[whatif][runtime]") {
  const auto dir = test::scratch_dir("whatif-ddp");
  const std::string json = (dir / "w.json").string();
  test::CommandResult r = test::run_hetplan("whatif --hf-config " + hf("llama-3.2-3b.json") +
                                            " --gpu H100 --gpus 2 --gpus-per-node 2 --seq 1024 --rows \"single GPU,DDP\""
                                            " --json " + json);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto rows = rows_by_name(read_json_file(json));
  const double params = static_cast<double>(read_hf_config(hf("llama-3.2-3b.json")).parameter_count());
  // Megatron's accounting for torch.autocast (fp32 gradients) and the buckets' copy of them; the old buckets,
  // held across the rebuild, not in the median run here: the optimizer of 3.2B parameters and a 45 ms forward
  // on the host leave the watchdog's 100 ms period mostly spent before the activations' peak.
  CHECK(rows["DDP"]["gradients_bytes"].get<double>() - rows["single GPU"]["gradients_bytes"].get<double>() ==
        Approx(params * 4).epsilon(1e-9));
  CHECK(r.output.find("the median run's counted: at neither") != std::string::npos);
  CHECK(rows["DDP"]["step_ms"].get<double>() > rows["single GPU"]["step_ms"].get<double>());
  CHECK(r.output.find("DDP: bucket_cap_mb 25, gradient_as_bucket_view False") != std::string::npos);
  CHECK(r.output.find("torch.autocast: fp32 parameters and gradients") != std::string::npos);
}

TEST_CASE("ZeRO-3 gathers: module by module, prefetched within the bucket, latency-bound when small",
          "[whatif][runtime][deepspeed]") {
  DeepSpeedBuffers d;
  d.prefetch_bucket_size = 0;  // nothing fetched ahead: every gather is on demand, in series with the compute
  const std::vector<double> modules{10, 10, 10, 10};
  auto gather = [](double elements) { return 1 + elements / 10; };  // 1 ms latency + 1 ms per 10 elements
  CHECK(zero3_pass_ms(d, modules, false, 8, gather) == Approx(4 * 2 + 8).epsilon(1e-12));
  // A bucket of 10 elements: one module ahead. Gather 0 (2 ms) on demand, then gather i+1 overlaps compute i
  // (2 ms each, compute 2 ms each): 2 + 4 x 2 = 10 ms.
  d.prefetch_bucket_size = 10;
  CHECK(zero3_pass_ms(d, modules, false, 8, gather) == Approx(10).epsilon(1e-12));
  // The live-parameter cap stops the prefetch as the bucket does.
  d.prefetch_bucket_size = 1e9;
  d.max_live_parameters = 10;
  CHECK(zero3_pass_ms(d, modules, false, 8, gather) == Approx(16).epsilon(1e-12));
  // Modules of a transformer: GPT-2's c_attn is one module; norms and biases under the threshold persist.
  const ModelShape gpt = read_hf_config(hf("gpt2-xl.json"));
  const std::vector<double> g = zero3_gathered_modules(gpt, 0, gpt.metis_num_layers(), 1, 1e5);
  CHECK(g.size() == 2 + 4 * 48 + 1);  // wte, wpe; c_attn, c_proj, c_fc, mlp c_proj per block; the head
  const ModelShape llama = read_hf_config(hf("llama-2-7b.json"));
  CHECK(zero3_gathered_modules(llama, 0, llama.metis_num_layers(), 1, 1e5).size() == 1 + 7 * 32 + 1);
}

TEST_CASE("whatif deepspeed-config: ZeRO-3 at 1e8 buckets and an offload config change the rows as DeepSpeed does",
          "[whatif][deepspeed]") {
  const auto dir = test::scratch_dir("whatif-dsconfig");
  std::ofstream(dir / "z3.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "reduce_bucket_size": 1e8,
    "stage3_prefetch_bucket_size": 1e8, "stage3_max_live_parameters": 1e9, "overlap_comm": true}})";
  std::ofstream(dir / "z3off.json") << R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true}}})";
  const DeepSpeedRunConfig c = read_deepspeed_config((dir / "z3.json").string());
  CHECK(c.stage == 3);
  CHECK(c.buffers.reduce_bucket_size == 1e8);
  CHECK(c.buffers.prefetch_bucket_size == 1e8);
  CHECK(c.micro_batch == 2);
  CHECK(c.accumulation == 4);
  CHECK(c.precision == "bf16");
  const DeepSpeedRunConfig o = read_deepspeed_config((dir / "z3off.json").string());
  CHECK(o.offload_optimizer);
  CHECK(o.offload_params);
  CHECK(o.buffers.pin_memory);
  const std::string base = "whatif --hf-config " + hf("llama-2-7b.json") + " --gpu V100 --gpus 8 --seq 350";
  auto run = [&](const std::string& extra, const std::string& json) {
    const std::string out = (dir / ("out-" + json)).string();  // (never over a config file)
    test::CommandResult r = test::run_hetplan(base + extra + " --json " + out);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return rows_by_name(read_json_file(out));
  };
  auto d = run(" --rows ZeRO-3,ZeRO-2+offload", "default.json");
  auto z = run(" --deepspeed-config " + (dir / "z3.json").string() + " --rows ds_config,ZeRO-3", "z3.json");
  // The config's row is ZeRO-3 in bf16... on a V100 (no bf16): not offered, naming why.
  CHECK(z["ds_config"]["offered"] == false);
  auto z16 = run(" --precision fp16 --deepspeed-config " + (dir / "z3.json").string() + " --rows ds_config",
                 "z3fp16.json");
  // reduce_bucket_size 1e8 instead of 5e8: the ipg bucket holds 4e8 fewer 16-bit elements; the prefetch
  // bucket 1e8 instead of 5e7 holds 5e7 more.
  CHECK(z16["ds_config"]["transient_bytes"].get<double>() - d["ZeRO-3"]["transient_bytes"].get<double>() ==
        Approx((-4e8 + 5e7) * 2).epsilon(1e-9));
  // The micro-batch and the accumulation come from the config: 2 x 8 GPUs x 4.
  CHECK(z16["ds_config"]["gbs"] == 64);
  CHECK(z16["ds_config"]["accumulation"] == 4);
  // ZeRO-3 gathers module by module, prefetching within stage3_prefetch_bucket_size: with no prefetch
  // (a 1-element bucket) every gather waits in series with the compute.
  std::ofstream(dir / "z3nopf.json") << R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1}})";
  auto nopf = run(" --precision fp16 --deepspeed-config " + (dir / "z3nopf.json").string() + " --rows ds_config,ZeRO-3",
                  "z3nopf.json");
  CHECK(nopf["ds_config"]["step_ms"].get<double>() > d["ZeRO-3"]["step_ms"].get<double>());
  // The config's sizes apply to every DeepSpeed row: its ZeRO-3 row is the ds_config row.
  CHECK(nopf["ZeRO-3"]["step_ms"].get<double>() == nopf["ds_config"]["step_ms"].get<double>());
  // Parameter offload: each module's partition crosses PCIe before its gather, in the forward and again in
  // the backward: slower than the same ZeRO-3 with the optimizer alone offloaded (whose 16-bit weights stay
  // on the GPU and cross once, after the step).
  auto off = run(" --precision fp16 --deepspeed-config " + (dir / "z3off.json").string() +
                     " --rows ds_config,ZeRO-3+opt-offload",
                 "z3off.json");
  CHECK(off["ds_config"]["offload_params"] == true);
  CHECK(off["ds_config"]["step_ms"].get<double>() > off["ZeRO-3+opt-offload"]["step_ms"].get<double>());
  // Pageable copies (pin_memory false, DeepSpeed's default) are slower than pinned ones.
  std::ofstream(dir / "z3page.json") << R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})";
  auto page = run(" --precision fp16 --micro-batch 2 --deepspeed-config " + (dir / "z3page.json").string() +
                  " --rows ds_config", "z3page.json");
  CHECK(page["ds_config"]["step_ms"].get<double>() > off["ds_config"]["step_ms"].get<double>());
}

TEST_CASE("whatif deepspeed-config: errors name the file and the key", "[whatif][deepspeed]") {
  const auto dir = test::scratch_dir("whatif-dsconfig-errors");
  auto error = [&](const std::string& text) {
    std::ofstream(dir / "c.json") << text;
    try {
      read_deepspeed_config((dir / "c.json").string());
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error(R"({"zero_optimization": {"stage": 4}})").find("key 'zero_optimization.stage'") != std::string::npos);
  CHECK(error(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": "big"}})")
            .find("key 'zero_optimization.reduce_bucket_size': expected a number or \"auto\"") != std::string::npos);
  CHECK(error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})")
            .find("key 'zero_optimization.offload_param.device'") != std::string::npos);
  CHECK(error(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})")
            .find("parameter offload needs stage 3") != std::string::npos);
  CHECK(error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})").find("both true") != std::string::npos);
  CHECK(error(R"({"train_micro_batch_size_per_gpu": 0})").find("key 'train_micro_batch_size_per_gpu'") !=
        std::string::npos);
  // "auto" sizes: the Hugging Face Trainer's rules.
  std::ofstream(dir / "a.json") << R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})";
  DeepSpeedRunConfig c = read_deepspeed_config((dir / "a.json").string());
  resolve_deepspeed_auto(c, 4096);
  CHECK(c.buffers.reduce_bucket_size == 4096.0 * 4096);
  CHECK(c.buffers.prefetch_bucket_size == 0.9 * 4096 * 4096);
  CHECK(c.buffers.param_persistence_threshold == 40960);
}

// ------------------------------------------------------------------ the five whatif defects (issue 32, item 5)

TEST_CASE("whatif defects: --offload stays out of rows without ZeRO", "[whatif][defects]") {
  TrainingSetup base;
  base.offload_optimizer = true;
  const std::vector<WhatifRow> rows = standard_whatif_rows(base, 16, kTargetQ | kTargetV, 8);
  for (const WhatifRow& r : rows) {
    INFO(r.name);
    if (r.setup.zero_stage == 0) CHECK_FALSE(r.setup.offload_optimizer);
  }
  // ... and the ZeRO rows that take it do.
  auto fsdp = std::find_if(rows.begin(), rows.end(), [](const WhatifRow& r) { return r.name == "FSDP"; });
  CHECK(fsdp->setup.offload_optimizer);
  // The model refuses it too: no offload time without a ZeRO stage.
  TrainingSetup s;
  s.offload_optimizer = true;
  HostSpec h = default_host_spec(32);
  const OffloadTime t = offload_time(s, h, 1e9, 2e9, 1, 1, 10, 20);
  CHECK(t.step_ms == 0);
  CHECK(t.backward_exposed_ms == 0);
  // Through the binary: --offload optimizer leaves the DDP row as it was.
  const auto dir = test::scratch_dir("whatif-offload-leak");
  const std::string cmd = "whatif --hf-config " + hf("llama-3.2-3b.json") + " --gpu H100 --gpus 2 --rows DDP --json ";
  REQUIRE(test::run_hetplan(cmd + (dir / "a.json").string()).exit_code == 0);
  REQUIRE(test::run_hetplan(cmd + (dir / "b.json").string() + " --offload optimizer").exit_code == 0);
  CHECK(read_json_file((dir / "a.json").string())["rows"][0] == read_json_file((dir / "b.json").string())["rows"][0]);
}

TEST_CASE("whatif defects: the backward is subtracted once from the offload copies", "[whatif][defects]") {
  TrainingSetup s;
  s.zero_stage = 3;
  s.offload_optimizer = s.offload_params = true;
  HostSpec h;
  h.h2d_bytes_per_s = h.d2h_bytes_per_s = 10e9;
  h.cpu_adam_params_per_s = h.cpu_cast_params_per_s = 1e12;
  // 1e9 trainable, 2e9 weight bytes, dp 1: gradients 4e9 B -> 400 ms; weights 2e9 B -> 200 ms.
  // A step's backward plus what it exposes: max(backward, 400 ms) whatever the backward, so that a longer
  // backward (recomputation) never makes the step shorter.
  for (double backward : {100.0, 150.0, 300.0, 500.0}) {
    const OffloadTime t = offload_time(s, h, 1e9, 2e9, 1, 1, 50, backward);
    INFO(backward);
    CHECK(backward + t.backward_exposed_ms == Approx(std::max(backward, 400.0)).epsilon(1e-12));
  }
}

TEST_CASE("whatif defects: recomputation never makes offload faster", "[whatif][defects]") {
  const auto dir = test::scratch_dir("whatif-offload-recompute");
  // (--gbs 16: eight micro-batches, where the double subtraction showed: ZeRO-3+offload 2876 -> 2782 ms.)
  for (const char* row : {"ZeRO-2+offload", "ZeRO-3+offload", "ZeRO-1+offload"}) {
    double step[2];
    for (int ckpt = 0; ckpt < 2; ++ckpt) {
      const std::string json = (dir / (std::to_string(ckpt) + ".json")).string();
      test::CommandResult r = test::run_hetplan("whatif --hf-config " + hf("llama-3.2-3b.json") +
                                                " --gpu H100 --gpus 2 --seq 1024 --gbs 16 --rows " + row +
                                                (ckpt ? " --recompute full" : "") + " --json " + json);
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      step[ckpt] = read_json_file(json)["rows"][0]["step_ms"].get<double>();
    }
    INFO(row);
    CHECK(step[1] >= step[0]);
  }
}

TEST_CASE("whatif defects: --export keeps precision, offload, accounting and the model", "[whatif][defects]") {
  const auto dir = test::scratch_dir("whatif-export-setup");
  test::CommandResult r = test::run_hetplan("whatif --hf-config " + hf("llama-3.2-3b.json") +
                                            " --gpu V100 --gpus 4 --rows ZeRO-3+offload --export " + dir.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const ordered_json plan = read_json_file((dir / "plan.json").string());
  CHECK(plan["precision"] == "fp16");  // V100: auto is fp16
  CHECK(plan["offload_optimizer"] == true);
  CHECK(plan["offload_params"] == true);
  CHECK(plan["accounting"] == "deepspeed");
  CHECK(plan["deepspeed_buffers"] == true);
  CHECK(plan["model"]["architecture"]["num_kv_heads"] == 8);
  CHECK(plan["zero_stage"] == 3);
  // simulate reads it back with no setup flags and agrees with whatif.
  test::CommandResult s = test::run_hetplan("simulate --plan " + (dir / "plan.json").string() +
                                            " --framework-mb 1024 --json " + (dir / "s.json").string());
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  test::CommandResult w = test::run_hetplan("whatif --hf-config " + hf("llama-3.2-3b.json") +
                                            " --gpu V100 --gpus 4 --rows ZeRO-3+offload --json " +
                                            (dir / "w.json").string());
  REQUIRE(w.exit_code == 0);
  CHECK(read_json_file((dir / "s.json").string())["iteration_ms"].get<double>() ==
        read_json_file((dir / "w.json").string())["rows"][0]["step_ms"].get<double>());
  CHECK(max_rank_total(read_json_file((dir / "s.json").string())) ==
        read_json_file((dir / "w.json").string())["rows"][0]["memory_per_gpu_bytes"].get<double>());
}

TEST_CASE("whatif defects: --help shows the real default precision", "[whatif][defects]") {
  test::CommandResult r = test::run_hetplan("whatif --help");
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("--precision TEXT=auto") != std::string::npos);
  CHECK(r.output.find("--precision TEXT=bf16") == std::string::npos);
  CHECK(r.output.find("--runtime TEXT=eager") != std::string::npos);
}

TEST_CASE("whatif defects: on one GPU the multi-GPU rows are not offered, ZeRO-Offload is", "[whatif][defects]") {
  const auto dir = test::scratch_dir("whatif-one-gpu");
  const std::string json = (dir / "w.json").string();
  test::CommandResult r = test::run_hetplan("whatif --hf-config " + hf("llama-3.2-3b.json") +
                                            " --gpu H100 --gpus 1 --json " + json);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto rows = rows_by_name(read_json_file(json));
  for (const char* name : {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP", "FSDP-hybrid", "LoRA+ZeRO-2"}) {
    INFO(name);
    CHECK(rows[name]["offered"] == false);
    CHECK(rows[name]["not_offered"].get<std::string>().find("needs more than one GPU") == 0);
  }
  for (const char* name : {"single GPU", "ZeRO-2+offload", "ZeRO-3+offload", "LoRA", "QLoRA", "bf16"}) {
    INFO(name);
    CHECK(rows[name]["offered"] == true);
  }
}

TEST_CASE("torch.autocast rows: weight casts every forward, gradients allocated in the backward",
          "[whatif][runtime]") {
  // Memory: with zero_grad(set_to_none=True) the gradients take the place the activations and the 16-bit
  // weight copies release; the peak holds the larger, not both.
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  TrainingSetup s;
  s.accounting = ZeroAccounting::kMegatron;
  s.flash_attention = true;
  RankShard r;
  r.first_layer = 0;
  r.end_layer = m.metis_num_layers();
  r.seq = 1024;
  const MemoryBreakdown kept = rank_memory(m, s, r);
  s.grads_in_backward = true;
  const MemoryBreakdown freed = rank_memory(m, s, r);
  const double released = kept.activations + kept.recompute_workspace + kept.states.weights;
  CHECK(freed.states.gradients == Approx(kept.states.gradients - std::min(kept.states.gradients, released)));
  CHECK(freed.allocated_peak() ==
        Approx(kept.allocated_peak() - kept.states.gradients - released + std::max(kept.states.gradients, released)));
  // Time: the casts (6 bytes per block weight each forward) are what makes an autocast row slower.
  WhatifInput in;
  in.shape = m;
  in.seq = 1024;
  in.gpu = find_gpu_spec("H100");
  in.gpus = 1;
  WhatifRow row = standard_whatif_rows(TrainingSetup(), 16, kTargetQ | kTargetV, 8)[0];
  REQUIRE(row.autocast);
  const double with_casts = cost_whatif_row(in, row).gpu_ms;
  row.autocast = false;
  const double without = cost_whatif_row(in, row).gpu_ms;
  const double cast_ms = (static_cast<double>(m.block_linear_weights()) * m.num_layers +
                          static_cast<double>(m.vocab_size) * m.hidden_size) *
                         kAutocastCastBytesPerParam / (in.gpu->memory_bw_gbs * 1e9 * 0.75) * 1e3;
  CHECK(with_casts - without == Approx(cast_ms).epsilon(1e-6));
}

// The rows say how the user's code runs: every row's loss is logits.float() + F.cross_entropy; the PyTorch
// autocast rows (fp32 parameters) keep an fp32 residual stream; FSDP's mixed precision and DeepSpeed cast the
// parameters, so their residual stream is 16-bit.
TEST_CASE("whatif rows: eager fp32 loss everywhere, fp32 residual stream under autocast", "[whatif][memory]") {
  for (const WhatifRow& r : standard_whatif_rows(TrainingSetup(), 16, kTargetQ | kTargetV, 8)) {
    INFO(r.name);
    CHECK(r.setup.eager_fp32_loss);
    CHECK(r.setup.fp32_residual == r.autocast);
    if (r.name == "single GPU" || r.name == "DDP") CHECK(r.autocast);
    if (r.name == "FSDP" || r.name == "ZeRO-2+offload") CHECK_FALSE(r.setup.fp32_residual);
  }
}

// The FSDP rows run fully_shard's mixed precision over fp32 parameters (tests/test_memory_model.cc, FSDP2
// accounting): at the peak of a step whose activations outweigh the gradients, no 16-bit weight shard is held
// beside the fp32 shard, so the row's memory is the ZeRO paper's less 2 bytes per parameter over dp.
TEST_CASE("whatif FSDP row: FSDP2's accounting, no 16-bit shard kept", "[whatif][memory]") {
  const ModelShape m = read_hf_config(hf("llama-3.2-3b.json"));
  WhatifInput in;
  in.shape = m;
  in.seq = 2048;
  in.micro_batch = 1;
  in.gpu = find_gpu_spec("H200");
  in.gpus = 2;
  in.gpus_per_node = 2;
  WhatifRow fsdp;
  for (const WhatifRow& r : standard_whatif_rows(TrainingSetup(), 16, kTargetQ | kTargetV, 2))
    if (r.name == "FSDP") fsdp = r;
  REQUIRE(fsdp.setup.accounting == ZeroAccounting::kFsdp2);
  const WhatifResult f = cost_whatif_row(in, fsdp);
  fsdp.setup.accounting = ZeroAccounting::kZeroPaper;
  const WhatifResult z = cost_whatif_row(in, fsdp);
  REQUIRE(f.memory.states.gradients == 0);  // (the activations outweigh the gradients at this size)
  REQUIRE(z.memory.states.gradients == 0);
  CHECK(z.memory.allocated_peak() - f.memory.allocated_peak() ==
        Approx(2.0 * static_cast<double>(m.parameter_count()) / 2).epsilon(1e-9));
}
