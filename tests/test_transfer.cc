// The layer time model (sim/layer_work.h, sim/layer_time_model.h), profile
// transfer (gen-profiles --from) and the analytic profiles on it
// (gen-profiles --analytic --hf-config). Expected values are derived here
// from the catalogue's numbers (sim/data/gpus.json) and ModelShape's counts.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>

#include "base/json_util.h"
#include "sim/analytic_profiles.h"
#include "sim/dp_overlap.h"
#include "sim/memory_model.h"
#include "sim/gpu_specs.h"
#include "sim/layer_time_model.h"
#include "sim/layer_work.h"
#include "sim/profile.h"
#include "sim/profile_model.h"
#include "sim/profile_transfer.h"
#include "tests/fixtures.h"

using namespace hetplan;

namespace {

std::string hf(const char* name) { return std::string(HETPLAN_SOURCE_DIR) + "/tests/data/hf/" + name; }

// A measured-looking profile of `shape` at (tp 1, bs) with every block's classes given.
ordered_json fake_profile(const ModelShape& s, long long seq, int bs, double gemm, double attn, double elem,
                          double host) {
  const int L = s.metis_num_layers();
  ordered_json j;
  j["model"] = profile_model_record(s, seq, 2);
  ordered_json et;
  ordered_json times = ordered_json::array(), dev = ordered_json::array(), g = ordered_json::array(),
               a = ordered_json::array(), e = ordered_json::array(), c = ordered_json::array(),
               h = ordered_json::array(), gemms = ordered_json::array(), fwd = ordered_json::array(),
               acc = ordered_json::array();
  for (int i = 0; i < L; ++i) {
    const double d = gemm + attn + elem;
    times.push_back(std::max(d, host));
    fwd.push_back(std::max(d, host) / 3);
    acc.push_back(0.1);
    dev.push_back(d);
    g.push_back(gemm);
    a.push_back(attn);
    e.push_back(elem);
    c.push_back(0.0);
    h.push_back(host);
    gemms.push_back(ordered_json::array({ordered_json::array({4096, 4096, 4096, 3, gemm})}));
  }
  et["total_time_ms"] = 100.0;
  et["forward_backward_time_ms"] = 90.0;
  et["batch_generator_time_ms"] = 0.1;
  et["optimizer_time_ms"] = 9.9;
  et["layer_compute_total_ms"] = times;
  et["layer_forward_ms"] = fwd;
  et["layer_grad_accumulation_ms"] = acc;
  et["kernel_classes"] = {{"device_ms", dev}, {"gemm_ms", g},      {"attention_ms", a}, {"communication_ms", c},
                          {"elementwise_ms", e}, {"host_ms", h}, {"gemms", gemms}};
  j["execution_time"] = et;
  ordered_json mem;
  ordered_json mb = ordered_json::array(), act = ordered_json::array();
  for (int i = 0; i < L; ++i) {
    mb.push_back(1000.0 + i);
    act.push_back(100.0 + i);
  }
  mem["total_memory"] = 1000.0 * L;
  mem["layer_memory_total_mb"] = mb;
  mem["layer_activation_mb"] = act;
  mem["layer_working_mb"] = act;
  mem["framework_mb"] = 700.0;
  j["execution_memory"] = mem;
  j["profiler"] = {{"tool", "hetplan profile"}, {"device_type", "H100"}, {"dtype", "bf16"}, {"tp", 1}, {"micro_batch_size", bs}};
  return j;
}

}  // namespace

TEST_CASE("layer work: a block's GEMMs are ModelShape's linear FLOPs, three passes, split by tp", "[transfer]") {
  const ModelShape llama = read_hf_config(hf("llama-3.1-8b.json"));
  const long long tokens = 2 * 2048;
  const LayerGemms g = layer_gemms(llama, LayerKind::kBlock, tokens, 2, Recompute::kNone);
  REQUIRE(g.count == 5);
  CHECK(g.flops() == Approx(3.0 * tokens * llama.linear_forward_flops_per_token() / 2).epsilon(1e-12));
  // Full recomputation runs the forward GEMMs again: 4 passes.
  CHECK(layer_gemms(llama, LayerKind::kBlock, tokens, 2, Recompute::kFull).flops() == Approx(g.flops() * 4 / 3));
  // The head: the vocabulary projection; the embedding: none.
  CHECK(layer_gemms(llama, LayerKind::kHead, tokens, 1, Recompute::kNone).flops() ==
        Approx(3.0 * tokens * llama.head_forward_flops_per_token()));
  CHECK(layer_gemms(llama, LayerKind::kEmbedding, tokens, 1, Recompute::kNone).count == 0);
  CHECK(layer_attention_flops(llama, LayerKind::kBlock, 2, 2048, 1, Recompute::kNone) ==
        Approx(3.0 * tokens * llama.attention_forward_flops_per_token(2048)));
  CHECK(layer_allreduces(LayerKind::kBlock, 2) == 4);
  CHECK(layer_allreduces(LayerKind::kBlock, 1) == 0);
}

TEST_CASE("rates: the catalogue's, an emulated partition's, a probe's curve", "[transfer]") {
  const RateDefaults d;
  const DeviceRates h100 = catalogue_rates("H100", ComputePrecision::kBf16, d, "test");
  CHECK(h100.peak_flops == Approx(989.5e12));
  CHECK(h100.bytes_per_s == Approx(3350e9 * d.memory_efficiency));
  // H100-66sm: 66 SMs rounded up to the driver's 8 -> 72 of 132.
  const DeviceRates part = catalogue_rates("H100-66sm", ComputePrecision::kBf16, d, "test");
  CHECK(part.peak_flops == Approx(989.5e12 * 72 / 132));
  CHECK(part.bytes_per_s == Approx(h100.bytes_per_s * 72 / 132));
  CHECK_THROWS_AS(catalogue_rates("Z999", ComputePrecision::kBf16, d, "test"), InputError);
  // V100 has no bf16: bf16 training runs there as fp16, its 16-bit peak.
  const DeviceRates v100 = catalogue_rates("V100", ComputePrecision::kBf16, d, "test");
  CHECK(v100.precision == ComputePrecision::kFp16);
  CHECK(v100.peak_flops == Approx(125e12));
  CHECK_THROWS_AS(catalogue_rates("V100", ComputePrecision::kFp8, d, "test"), InputError);
  // The catalogue's GEMM curve: half the large-GEMM efficiency at the half size.
  CHECK(h100.gemm_flops_per_s({1024, 1024, 1024, 1}) == Approx(989.5e12 * d.gemm_efficiency / 2));

  ordered_json probe = {{"gemm", {{"bf16", {{{"m", 1024}, {"tflops", 400.0}}, {{"m", 4096}, {"tflops", 700.0}}}}}},
                        {"copy", {{{"mb", 32}, {"tbs", 2.0}}, {{"mb", 1024}, {"tbs", 3.0}}}},
                        {"launch", {{"eager_host_us", 6.0}}}};
  const DeviceRates p = probe_rates(probe, "probe.json", "H100", ComputePrecision::kBf16, d);
  CHECK(p.probed);
  CHECK(p.gemm_flops_per_s({2048, 2048, 2048, 1}) == Approx(550e12));  // halfway in log size
  CHECK(p.gemm_flops_per_s({8192, 8192, 8192, 1}) == Approx(700e12));  // above: the largest point
  CHECK(p.gemm_flops_per_s({512, 512, 512, 1}) == Approx(200e12));    // below: in proportion to size
  CHECK(p.bytes_per_s == Approx(3.0e12));                               // the largest stream: HBM
  CHECK(p.launch_host_us == 6.0);
}

TEST_CASE("transfer: each kernel class scales by its own rate, the same GPU is the identity", "[transfer]") {
  const RateDefaults d;
  const DeviceRates h100 = catalogue_rates("H100", ComputePrecision::kBf16, d, "test");
  const DeviceRates h200 = catalogue_rates("H200", ComputePrecision::kBf16, d, "test");
  const DeviceRates a100 = catalogue_rates("A100", ComputePrecision::kBf16, d, "test");
  MeasuredLayer m;
  m.classes = {6.0, 2.0, 1.5, 0.0, 1.0};  // gemm, attention, elementwise, communication, floor
  m.gemms = {{4096, 4096, 4096, 3}};
  m.gemm_ms = {6.0};
  m.layer_ms = 9.9;  // the chained measurement: 10% above the device's 9.5 ms... and its gaps
  double ms = 0;
  KernelClassTimes same = transfer_layer(m, h100, h100, &ms);
  CHECK(ms == Approx(9.9));
  CHECK(same.gemm_ms == Approx(6.0));
  // H100 -> H200: the same peak, 4800 / 3350 the bandwidth: only the elementwise class moves.
  KernelClassTimes c = transfer_layer(m, h100, h200, &ms);
  CHECK(c.gemm_ms == Approx(6.0));
  CHECK(c.attention_ms == Approx(2.0));
  CHECK(c.elementwise_ms == Approx(1.5 * 3350 / 4800));
  CHECK(ms == Approx(9.9 * c.device_ms() / 9.5));
  // H100 -> A100: GEMMs and attention by the peaks (989.5 / 312), the rest by bandwidth (3350 / 2039).
  c = transfer_layer(m, h100, a100, &ms);
  CHECK(c.gemm_ms == Approx(6.0 * 989.5 / 312));
  CHECK(c.attention_ms == Approx(2.0 * 989.5 / 312));
  CHECK(c.elementwise_ms == Approx(1.5 * 3350 / 2039));
  CHECK(c.host_ms == 1.0);  // no probe on either side: the same host and runtime
  // A layer the host bounds stays at its floor while the device is faster than it.
  MeasuredLayer floor = m;
  floor.classes = {0.2, 0.1, 0.2, 0.0, 2.0};
  floor.gemm_ms = {0.2};
  floor.layer_ms = 2.0;
  transfer_layer(floor, h100, h200, &ms);
  CHECK(ms == Approx(2.0));
}

TEST_CASE("gen-profiles --from: a measured set moved to other GPUs, memory exactly kept", "[transfer]") {
  const ModelShape llama = read_hf_config(hf("llama-3.2-3b.json"));
  const auto src = test::scratch_dir("transfer-src"), out = test::scratch_dir("transfer-out");
  for (int bs : {1, 2}) {
    const ordered_json j = fake_profile(llama, 2048, bs, 6.0 * bs, 2.0 * bs, 1.5 * bs, 1.0);
    std::ofstream((src / ("DeviceType.H100_tp1_bs" + std::to_string(bs) + ".json")).string()) << j.dump(1);
  }
  TransferOptions o;
  o.from_dir = src.string();
  o.out_dir = out.string();
  o.types = {"A100", "H200", "H100-66sm"};
  const auto written = transfer_profiles(o);
  REQUIRE(written.size() == 6);
  const ProfileSet set = ProfileSet::load(out.string(), llama.metis_num_layers());
  CHECK(set.device_types().size() == 3);
  const ordered_json a = read_json_file((out / "DeviceType.A100_tp1_bs2.json").string());
  const double want = (12.0 * 989.5 / 312 + 4.0 * 989.5 / 312 + 3.0 * 3350 / 2039);
  CHECK(a["execution_time"]["layer_compute_total_ms"][1].get<double>() == Approx(want));
  CHECK(a["execution_time"]["optimizer_time_ms"].get<double>() == Approx(9.9 * 3350 / 2039));
  CHECK(a["execution_memory"] == fake_profile(llama, 2048, 2, 1, 1, 1, 1)["execution_memory"]);
  CHECK(a["model"]["family"] == "llama");
  CHECK(a["model"]["num_kv_heads"] == llama.num_kv_heads);
  CHECK(a["profiler"]["device_type"] == "A100");
  CHECK(a["profiler"]["transfer"]["from_type"] == "H100");
  // The partition: 72 of 132 SMs, for FLOPs and (no probe) bandwidth alike.
  const ordered_json p = read_json_file((out / "DeviceType.H100-66sm_tp1_bs1.json").string());
  CHECK(p["execution_time"]["layer_compute_total_ms"][1].get<double>() == Approx(9.5 * 132 / 72));

  // With both GPUs' probes, their curves decide.
  ordered_json probe_from = {{"gemm", {{"bf16", {{{"m", 1024}, {"tflops", 500.0}}, {{"m", 8192}, {"tflops", 800.0}}}}}},
                             {"copy", {{{"mb", 1024}, {"tbs", 3.0}}}}};
  ordered_json probe_to = {{"gemm", {{"bf16", {{{"m", 1024}, {"tflops", 500.0}}, {{"m", 8192}, {"tflops", 400.0}}}}}},
                           {"copy", {{{"mb", 1024}, {"tbs", 4.0}}}}};
  std::ofstream((src / "gpu_probe.H100.json").string()) << probe_from.dump();
  std::ofstream((src / "gpu_probe.H200.json").string()) << probe_to.dump();
  o.types = {"H200"};
  transfer_profiles(o);
  const ordered_json q = read_json_file((out / "DeviceType.H200_tp1_bs1.json").string());
  // GEMM 4096^3, two thirds of the way from 1024 to 8192 in log size: 700 against 433.3 TFLOP/s; attention
  // as the largest GEMMs: 800 against 400.
  CHECK(q["execution_time"]["layer_compute_total_ms"][1].get<double>() ==
        Approx(6.0 * 700 / (1300.0 / 3) + 2.0 * 800 / 400 + 1.5 * 3.0 / 4.0));
  CHECK(q["profiler"]["transfer"]["to_rates"]["source"].get<std::string>().find("probe") == 0);

  // Errors: no profiles, several types without --from-type.
  TransferOptions bad = o;
  bad.from_dir = out.string();
  CHECK_THROWS_WITH(transfer_profiles(bad), Catch::Contains("several device types"));
  bad.from_dir = test::scratch_dir("transfer-empty").string();
  CHECK_THROWS_WITH(transfer_profiles(bad), Catch::Contains("no DeviceType"));
}

TEST_CASE("gen-profiles --from: a profile without kernel classes is split by the analytic model", "[transfer]") {
  const auto src = test::scratch_dir("transfer-old"), out = test::scratch_dir("transfer-old-out");
  const ModelShape gpt = gpt2_shape(50257, 1024, 4, 16, 1024);
  ordered_json j = fake_profile(gpt, 1024, 1, 3.0, 1.0, 1.0, 0.5);
  j["execution_time"].erase("kernel_classes");
  std::ofstream((src / "DeviceType.A100_tp1_bs1.json").string()) << j.dump(1);
  TransferOptions o;
  o.from_dir = src.string();
  o.out_dir = out.string();
  o.types = {"A100", "H100"};
  transfer_profiles(o);
  const ordered_json same = read_json_file((out / "DeviceType.A100_tp1_bs1.json").string());
  CHECK(same["execution_time"]["layer_compute_total_ms"][1].get<double>() == Approx(5.0));
  const ordered_json h = read_json_file((out / "DeviceType.H100_tp1_bs1.json").string());
  const double got = h["execution_time"]["layer_compute_total_ms"][1].get<double>();
  CHECK(got < 5.0 * 2039 / 3350 * 1.0001);  // faster at least by the smaller of the two ratios
  CHECK(got > 5.0 * 312 / 989.5 * 0.9999);
  CHECK(h["profiler"]["transfer"]["classes"] == "analytic shares of the measured layer times");
}

TEST_CASE("gen-profiles --analytic --hf-config: a Llama on A100 and V100, fused attention, its shape recorded",
          "[transfer][analytic]") {
  AnalyticOptions o;
  ModelShape s = read_hf_config(hf("llama-3.2-3b.json"));
  s.num_layers = 4;
  o.shape = s;
  o.sequence_length = 4096;
  o.max_tp = 2;
  o.max_bs = 2;
  o.device_types = {"A100", "V100"};
  const auto dir = test::scratch_dir("analytic-llama");
  const auto written = generate_analytic_profiles(o, dir.string());
  CHECK(written.size() == 2 * 2 * 2);
  const ProfileSet set = ProfileSet::load(dir.string(), 6);
  CHECK(set.model().family == "llama");
  CHECK(set.model().num_kv_heads == s.num_kv_heads);
  CHECK(set.model().sequence_length == 4096);
  const ordered_json a = read_json_file((dir / "DeviceType.A100_tp2_bs2.json").string());
  const double act = a["execution_memory"]["layer_activation_mb"][1].get<double>();
  const double fused = layer_activation_bytes(s, 4096, 2, 2, false, Recompute::kNone, true, Precision::kBf16) / (1024.0 * 1024.0);
  CHECK(act == Approx(fused).epsilon(1e-5));
  CHECK(a["execution_memory"]["attention"] == "fused");
  // The time is the layer time model's on the catalogue's rates.
  const DeviceRates r = catalogue_rates("A100", ComputePrecision::kBf16, RateDefaults{}, "test");
  const KernelClassTimes c = analytic_layer_classes(s, 1, 2, 4096, 2, Recompute::kNone, r);
  CHECK(a["execution_time"]["layer_compute_total_ms"][1].get<double>() == Approx(c.layer_ms()));
  CHECK(c.communication_ms > 0);
  // V100 runs fp16 (it has no bf16), slower.
  const ordered_json v = read_json_file((dir / "DeviceType.V100_tp2_bs2.json").string());
  CHECK(v["profiler"]["dtype"] == "fp16");
  CHECK(v["execution_time"]["layer_compute_total_ms"][1].get<double>() >
        a["execution_time"]["layer_compute_total_ms"][1].get<double>());
  // Without fused attention the a s^2 scores are stored: more memory.
  o.flash_attention = false;
  const auto dir2 = test::scratch_dir("analytic-llama-eager");
  generate_analytic_profiles(o, dir2.string());
  const ordered_json e = read_json_file((dir2 / "DeviceType.A100_tp2_bs2.json").string());
  CHECK(e["execution_memory"]["layer_activation_mb"][1].get<double>() > act * 2);
  // ... and the time pays the score tensor's traffic: the materialised attention's classes.
  const KernelClassTimes m = analytic_layer_classes(s, 1, 2, 4096, 2, Recompute::kNone, r, {AttentionKernels::kMaterialized});
  CHECK(e["execution_time"]["layer_compute_total_ms"][1].get<double>() == Approx(m.layer_ms()));
  CHECK(e["execution_time"]["kernel_classes"]["attention_ms"][1].get<double>() == Approx(m.attention_ms));
  CHECK(m.attention_ms > c.attention_ms);
}

TEST_CASE("Materialised attention: the score tensor's GEMMs at their roofline, softmax and dropout at HBM rate",
          "[transfer][attention]") {
  // Narayanan et al. SC'21's 1.7B GPT (h 2304, 24 heads of 96, dropout) at micro-batch 16, seq 2048, tp 1.
  ModelConfig mc;
  mc.num_layers = 26;
  mc.hidden_size = 2304;
  mc.attention_heads = 24;
  mc.sequence_length = 2048;
  mc.vocab_size = 51200;
  const ModelShape s = shape_from_model_config(mc);
  REQUIRE(s.head_dim == 96);
  REQUIRE(s.dropout);
  const double n = 16.0 * 24 * 2048 * 2048;  // scores per pass
  // Bytes per score: forward softmax 2 + 2, dropout 2 + 2 + a 1-byte mask = 9; backward dropout 2 + 1 + 2,
  // softmax 2 + 2 + 2 = 11. Recomputation runs the forward's 9 again, and its 2 GEMMs.
  const ScoreTraffic none = layer_score_traffic(s, LayerKind::kBlock, 16, 2048, 1, Recompute::kNone, 2.0);
  CHECK(none.scores == n);
  CHECK(none.gemm_passes == 6);
  CHECK(none.gemm_flops_per_score == 192);
  CHECK(none.gemm_bytes_per_score == 2);
  CHECK(none.stream_bytes_per_score == 20);
  const ScoreTraffic full = layer_score_traffic(s, LayerKind::kBlock, 16, 2048, 1, Recompute::kFull, 2.0);
  CHECK(full.gemm_passes == 8);
  CHECK(full.stream_bytes_per_score == 29);
  // The GEMMs' FLOPs are the fused count's (Q K^T and P V, forward and backward).
  CHECK(full.gemm_flops() == Approx(layer_attention_flops(s, LayerKind::kBlock, 16, 2048, 1, Recompute::kFull)));
  // tp splits the heads; no scores outside blocks.
  CHECK(layer_score_traffic(s, LayerKind::kBlock, 16, 2048, 2, Recompute::kNone, 2.0).scores == n / 2);
  CHECK(layer_score_traffic(s, LayerKind::kHead, 16, 2048, 1, Recompute::kNone, 2.0).scores == 0);
  // Without dropout (Llama): softmax only, 4 forward and 6 backward bytes per score.
  ModelShape nodrop = s;
  nodrop.dropout = false;
  CHECK(layer_score_traffic(nodrop, LayerKind::kBlock, 16, 2048, 1, Recompute::kSelective, 2.0).stream_bytes_per_score ==
        4 + 4 + 6);

  // On the A100 (catalogue: 312 TFLOP/s, 2039 GB/s; attention 0.55, HBM 0.80): a GEMM over the scores with
  // head_dim 96 moves 2 bytes per 192 FLOPs, memory-bound: n x 2 / 1631.2 GB/s = 1.97475 ms (its FLOPs
  // would take n x 192 / 171.6 TFLOP/s = 1.80209 ms). Six of them, and 20 bytes per score of softmax and
  // dropout at 1631.2 GB/s (19.7475 ms): 31.596 ms, three times the fused kernel's 10.81 ms.
  const DeviceRates r = catalogue_rates("A100", ComputePrecision::kFp16, RateDefaults{}, "test");
  CHECK(materialized_attention_ms(none, r) == Approx(6 * 1.974749 + 19.747486).epsilon(1e-5));
  const KernelClassTimes fused = analytic_layer_classes(s, 1, 16, 2048, 1, Recompute::kNone, r);
  const KernelClassTimes mat = analytic_layer_classes(s, 1, 16, 2048, 1, Recompute::kNone, r, {AttentionKernels::kMaterialized});
  CHECK(fused.attention_ms == Approx(10.8122).epsilon(1e-4));
  CHECK(mat.attention_ms == Approx(31.5960).epsilon(1e-4));
  CHECK(mat.gemm_ms == fused.gemm_ms);
  CHECK(mat.elementwise_ms == fused.elementwise_ms);
  // Head dim 160 (the 1T model's): 320 FLOPs per 2 bytes, compute-bound at the attention rate.
  ModelShape wide = s;
  wide.head_dim = 160;
  const ScoreTraffic w = layer_score_traffic(wide, LayerKind::kBlock, 1, 2048, 1, Recompute::kNone, 2.0);
  const double gemm_ms = w.scores * 320 / (312e12 * 0.55) * 1e3;
  CHECK(materialized_attention_ms(w, r) == Approx(6 * gemm_ms + w.scores * 20 / (2039e9 * 0.8) * 1e3));
}

TEST_CASE("Sequence parallelism splits a block's norms, dropouts and residual adds over tp", "[transfer][seqpar]") {
  ModelConfig mc;
  mc.num_layers = 26;
  mc.hidden_size = 2304;
  mc.attention_heads = 24;
  mc.sequence_length = 2048;
  const ModelShape s = shape_from_model_config(mc);
  REQUIRE(s.ffn_hidden_size == 9216);
  // Values per token of the forward at tp 8: two LayerNorms (2 x 2h), two residual adds (2 x 3h), two
  // dropouts (2 x 2.5h) = 15h = 34560 on every rank without SP, 4320 with it; GELU on f / tp: 2 x 1152.
  // Three passes of 2048 tokens at 2 bytes.
  const double t = 2048;
  CHECK(layer_elementwise_bytes(s, LayerKind::kBlock, 2048, 8, Recompute::kNone, 2.0) == 3 * t * (34560 + 2304) * 2);
  CHECK(layer_elementwise_bytes(s, LayerKind::kBlock, 2048, 8, Recompute::kNone, 2.0, true) == 3 * t * (4320 + 2304) * 2);
  // At tp 1 it changes nothing.
  CHECK(layer_elementwise_bytes(s, LayerKind::kBlock, 2048, 1, Recompute::kNone, 2.0, true) ==
        layer_elementwise_bytes(s, LayerKind::kBlock, 2048, 1, Recompute::kNone, 2.0));
  // The analytic profiles made with it time the blocks so.
  AnalyticOptions o;
  o.model = mc;
  o.model.num_layers = 4;
  o.device_types = {"A100"};
  o.max_tp = 8;
  o.max_bs = 1;
  o.sequence_parallel = true;
  const auto dir = test::scratch_dir("analytic-seqpar");
  generate_analytic_profiles(o, dir.string());
  const ordered_json j = read_json_file((dir / "DeviceType.A100_tp8_bs1.json").string());
  const DeviceRates r = catalogue_rates("A100", ComputePrecision::kBf16, RateDefaults{}, "test");
  CHECK(j["execution_time"]["kernel_classes"]["elementwise_ms"][1].get<double>() ==
        Approx(3 * t * (4320 + 2304) * 2 / r.bytes_per_s * 1e3));
  CHECK(j["estimate"]["sequence_parallel"] == true);
}

TEST_CASE("gen-profiles CLI: --from and --analytic --hf-config, a search with disagreeing shape flags is refused",
          "[transfer][cli]") {
  const auto dir = test::scratch_dir("transfer-cli");
  const std::string root = HETPLAN_SOURCE_DIR;
  const std::string cfg = root + "/tests/data/hf/llama-3.2-3b.json";
  // A Llama config on A100 and V100, no measurement.
  auto r = test::run_hetplan("gen-profiles --analytic --hf-config " + cfg + " --seq-len 2048 --types A100,V100 --max-tp 2 " +
                             "6 2 --out " + (dir / "analytic").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Moved from A100 to V100 and H100 (same model, same grid).
  r = test::run_hetplan("gen-profiles --from " + (dir / "analytic").string() + " --from-type A100 --types V100,H100 --out " +
                        (dir / "derived").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("wrote 8 profiles") != std::string::npos);
  const ProfileSet set = ProfileSet::load((dir / "derived").string(), 6);
  CHECK(set.model().family == "llama");
  // The analytic files record their shape: a search for another hidden size is refused.
  r = test::run_hetplan("search -q --hostfile " + root + "/hostfiles/a100_v100_16.hostfile --clusterfile " + root +
                        "/hostfiles/clusterfile.json --profiles " + (dir / "analytic").string() +
                        " --num_layers 6 --hidden_size 4096 --gbs 8");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("hidden") != std::string::npos);
  // Bad input: exit 2, one line.
  r = test::run_hetplan("gen-profiles --from " + (dir / "analytic").string() + " --types V100 --out " + (dir / "x").string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("several device types") != std::string::npos);
  r = test::run_hetplan("gen-profiles --from " + (dir / "analytic").string() + " --from-type A100 --types Q7 --out " +
                        (dir / "x").string());
  CHECK(r.exit_code == 2);
  r = test::run_hetplan("gen-profiles --out " + (dir / "x").string());
  CHECK(r.exit_code == 2);
}

// Megatron-LM's asynchronous tensor-parallel backward (LayerKernels::async_tp_backward): a column-parallel
// linear's input-gradient all-reduce (under sequence parallelism: its reduce-scatter) runs beside its weight-
// gradient GEMM. Korthikanti et al.'s 1T GPT (h 25600, 160 heads, seq 2048) at tp 8, micro-batch 1 on the
// catalogue's A100: every weight-gradient GEMM outlasts the all-reduce, so a block hides 2 of its 4.
TEST_CASE("Async tp backward: the column-parallel inputs' backward collectives hidden by their weight-gradient GEMMs",
          "[transfer][async_tp]") {
  ModelConfig mc;
  mc.num_layers = 130;
  mc.hidden_size = 25600;
  mc.attention_heads = 160;
  mc.sequence_length = 2048;
  mc.vocab_size = 51200;
  const ModelShape s = shape_from_model_config(mc);
  const DeviceRates r = catalogue_rates("A100", ComputePrecision::kFp16, RateDefaults{}, "test");
  const int tp = 8;
  const double tokens = 2048;
  // One ring all-reduce of the tokens' activations: 2 (tp - 1) / tp x tokens x h x 2 bytes over the link.
  const double all_reduce_ms = 2.0 * 7 / 8 * tokens * 25600 * 2 / r.link_bytes_per_s * 1e3;
  LayerKernels sync;
  sync.async_tp_backward = false;
  const KernelClassTimes off = analytic_layer_classes(s, 1, 1, 2048, tp, Recompute::kNone, r, sync);
  const KernelClassTimes on = analytic_layer_classes(s, 1, 1, 2048, tp, Recompute::kNone, r);  // the default
  CHECK(off.communication_ms == Approx(4 * all_reduce_ms).epsilon(1e-12));
  CHECK(off.overlapped_ms == 0);
  // The QKV weight gradient (2 x 2048 x 25600 x 9600 FLOPs, ~4.5 ms) and the MLP's first GEMM's (~6 ms) each
  // outlast one all-reduce (~0.4 ms): both backward all-reduces hidden, whole.
  const LayerGemms g = layer_gemms(s, LayerKind::kBlock, 2048, tp, Recompute::kNone);
  GemmDims qkv = g.items[0];
  qkv.passes = 1;
  REQUIRE(qkv.flops() / r.gemm_flops_per_s(qkv) * 1e3 > all_reduce_ms);
  CHECK(on.overlapped_ms == Approx(2 * all_reduce_ms).epsilon(1e-12));
  CHECK(on.communication_ms == Approx(2 * all_reduce_ms).epsilon(1e-12));
  // The GEMMs run beside the collectives at the measured slowdown (sim/dp_overlap.h).
  CHECK(on.gemm_ms - off.gemm_ms == Approx((kCommComputeSlowdown - 1) * 2 * all_reduce_ms).epsilon(1e-9));
  CHECK(on.layer_ms() < off.layer_ms());
  // Under sequence parallelism the hidden collective is a reduce-scatter: half an all-reduce's bytes.
  LayerKernels sp;
  sp.sequence_parallel = true;
  const KernelClassTimes on_sp = analytic_layer_classes(s, 1, 1, 2048, tp, Recompute::kNone, r, sp);
  CHECK(on_sp.overlapped_ms == Approx(all_reduce_ms).epsilon(1e-12));
  CHECK(on_sp.communication_ms == Approx(3 * all_reduce_ms).epsilon(1e-12));
  // The head hides its one (the logits GEMM's input gradient); the embedding has none to hide.
  const int head = s.metis_num_layers() - 1;
  CHECK(analytic_layer_classes(s, head, 1, 2048, tp, Recompute::kNone, r).overlapped_ms ==
        Approx(all_reduce_ms).epsilon(1e-12));
  CHECK(analytic_layer_classes(s, head, 1, 2048, tp, Recompute::kNone, r).communication_ms == Approx(0).margin(1e-12));
  CHECK(analytic_layer_classes(s, 0, 1, 2048, tp, Recompute::kNone, r).overlapped_ms == 0);
  // tp 1: nothing to hide.
  CHECK(analytic_layer_classes(s, 1, 1, 2048, 1, Recompute::kNone, r).overlapped_ms == 0);
  // A link slower than the weight-gradient GEMM: only the GEMM's time is hidden.
  DeviceRates slow = r;
  slow.link_bytes_per_s = 1e9;
  double slowdown = 0;
  const double wgrad_ms = qkv.flops() / r.gemm_flops_per_s(qkv) * 1e3;
  const double slow_all_reduce = 2.0 * 7 / 8 * tokens * 25600 * 2 / 1e9 * 1e3;
  REQUIRE(slow_all_reduce > 10 * wgrad_ms);
  const double hidden = async_tp_hidden_ms(s, LayerKind::kBlock, 2048, tp, slow_all_reduce, slow, &slowdown);
  GemmDims up = g.items[2];
  up.passes = 1;
  CHECK(hidden == Approx(wgrad_ms + up.flops() / r.gemm_flops_per_s(up) * 1e3).epsilon(1e-12));
}

// A 6-block GPT of hidden 4096 on A100 up to tp 8, batch 1: the Megatron-LM setting tests' model.
static AnalyticOptions megatron_a100_options() {
  AnalyticOptions o;
  o.model.num_layers = 6;
  o.model.hidden_size = 4096;
  o.model.attention_heads = 32;
  o.model.sequence_length = 2048;
  o.model.vocab_size = 51200;
  o.max_tp = 8;
  o.max_bs = 1;
  o.device_types = {"A100"};
  return o;
}

TEST_CASE("Analytic profiles: Megatron-LM's async tp backward and gradient accumulation fusion, each a setting",
          "[transfer][async_tp][grad_acc_fusion]") {
  AnalyticOptions o = megatron_a100_options();
  const auto today = test::scratch_dir("analytic-megatron-today");
  generate_analytic_profiles(o, today.string());
  o.async_tp_backward = false;
  o.gradient_accumulation_fusion = false;
  const auto old = test::scratch_dir("analytic-megatron-2021");
  generate_analytic_profiles(o, old.string());
  const ordered_json a = read_json_file((today / "DeviceType.A100_tp8_bs1.json").string());
  const ordered_json b = read_json_file((old / "DeviceType.A100_tp8_bs1.json").string());
  CHECK(a["estimate"]["async_tp_backward"] == true);
  CHECK(a["estimate"]["gradient_accumulation_fusion"] == true);
  CHECK(b["estimate"]["async_tp_backward"] == false);
  CHECK(b["estimate"]["gradient_accumulation_fusion"] == false);
  const ModelShape s = shape_from_model_config(o.model);
  const DeviceRates r = catalogue_rates("A100", ComputePrecision::kBf16, RateDefaults{}, "test");
  const KernelClassTimes c = analytic_layer_classes(s, 1, 1, 2048, 8, Recompute::kNone, r);
  // The block's time loses the hidden collectives; its forward third is the layer's without the overlap.
  const auto& ta = a["execution_time"], & tb = b["execution_time"];
  CHECK(ta["layer_compute_total_ms"][1].get<double>() == Approx(c.layer_ms()));
  CHECK(ta["layer_compute_total_ms"][1].get<double>() < tb["layer_compute_total_ms"][1].get<double>());
  CHECK(ta["layer_forward_ms"][1].get<double>() == Approx((c.layer_ms() + c.overlapped_ms) / 3));
  // Accumulation: 3 16-bit values per parameter at the HBM rate; fused, the GEMM weights' (QKV 3h^2, output
  // h^2, MLP 8h^2, over tp) go into their weight-gradient GEMMs, the biases and norms keep theirs.
  const double h = 4096, rank_params = shard_params(s, 1, 2, 1, TrainingSetup{}).on_rank(8);
  CHECK(layer_gemm_weight_params(s, LayerKind::kBlock, 8) == 12 * h * h / 8);
  CHECK(tb["layer_grad_accumulation_ms"][1].get<double>() == Approx(6 * rank_params / r.bytes_per_s * 1e3));
  CHECK(ta["layer_grad_accumulation_ms"][1].get<double>() ==
        Approx(6 * (rank_params - 12 * h * h / 8) / r.bytes_per_s * 1e3));
  CHECK(ta["layer_grad_accumulation_ms"][1].get<double>() < 0.01 * tb["layer_grad_accumulation_ms"][1].get<double>());
}

// Where each micro-batch's gradients accumulate (gen-profiles --main-grads, LayerKernels::main_grads): bytes per
// parameter of the accumulation pass, 16-bit values: a 16-bit main gradient 3 x 2 = 6 (read two, write one); an fp32
// one (Megatron-LM's --accumulate-allreduce-grads-in-fp32) 2 + 4 read, 4 written = 10; DeepSpeed's BF16_Optimizer's
// cast to an fp32 temporary (2 read, 4 written) and add (4 + 4 read, 4 written) = 18.
TEST_CASE("Analytic profiles: where gradients accumulate sets the accumulation pass's bytes", "[transfer][main_grads]") {
  CHECK(main_grad_accumulation_bytes(MainGrads::k16Bit, 2) == 6);
  CHECK(main_grad_accumulation_bytes(MainGrads::kFp32, 2) == 10);
  CHECK(main_grad_accumulation_bytes(MainGrads::kFp32Cast, 2) == 18);
  CHECK(parse_main_grads("fp32-cast", "test") == MainGrads::kFp32Cast);
  CHECK_THROWS_AS(parse_main_grads("fp16", "test"), InputError);

  AnalyticOptions o = megatron_a100_options();
  o.gradient_accumulation_fusion = false;
  const ModelShape s = shape_from_model_config(o.model);
  const DeviceRates r = catalogue_rates("A100", ComputePrecision::kBf16, RateDefaults{}, "test");
  const double h = 4096, rank_params = shard_params(s, 1, 2, 1, TrainingSetup{}).on_rank(8);
  const struct {
    MainGrads g;
    const char* name;
    double bytes;
  } cases[] = {{MainGrads::k16Bit, "16bit", 6}, {MainGrads::kFp32, "fp32", 10}, {MainGrads::kFp32Cast, "fp32-cast", 18}};
  for (const auto& c : cases) {
    o.main_grads = c.g;
    o.gradient_accumulation_fusion = false;
    const auto unfused = test::scratch_dir(std::string("analytic-main-grads-") + c.name);
    generate_analytic_profiles(o, unfused.string());
    o.gradient_accumulation_fusion = true;
    const auto fused = test::scratch_dir(std::string("analytic-main-grads-fused-") + c.name);
    generate_analytic_profiles(o, fused.string());
    const ordered_json a = read_json_file((unfused / "DeviceType.A100_tp8_bs1.json").string());
    const ordered_json b = read_json_file((fused / "DeviceType.A100_tp8_bs1.json").string());
    CHECK(a["estimate"]["main_grads"] == c.name);
    CHECK(a["execution_time"]["layer_grad_accumulation_ms"][1].get<double>() ==
          Approx(c.bytes * rank_params / r.bytes_per_s * 1e3).epsilon(1e-12));
    // Fused: only the parameters outside the GEMMs (biases, norms) make the pass, at the same bytes each.
    CHECK(b["execution_time"]["layer_grad_accumulation_ms"][1].get<double>() ==
          Approx(c.bytes * (rank_params - 12 * h * h / 8) / r.bytes_per_s * 1e3).epsilon(1e-12));
  }
}
