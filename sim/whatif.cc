#include "sim/whatif.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "sim/analytic_profiles.h"
#include "base/checked.h"
#include "base/file_access.h"
#include "sim/inference.h"
#include "base/input_error.h"
#include "sim/plan_file.h"
#include "sim/roofline.h"

namespace hetplan {

namespace fs = std::filesystem;

namespace {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// The catalogue name as a profile/cluster type name (alphanumerics: profile file names allow no more).
std::string type_name(const GpuSpec& g) {
  std::string out;
  for (char c : g.name)
    if (std::isalnum(static_cast<unsigned char>(c))) out += c;
  return out;
}

// LLM.int8() (bitsandbytes Linear8bitLt): int8 weights with one fp32 absmax per output row.
QuantSpec int8_rowwise(long long row) { return QuantSpec{8, static_cast<double>(row), 32, 0, 0}; }

bool quantised_base(const TrainingSetup& s) { return s.finetune == Finetune::kQlora; }

// Per-layer forward and total (forward + backward) ms of one micro-batch of `bs` sequences.
struct LayerTimes {
  std::vector<double> forward, total;
  double optimizer_ms = 0;
};

// The achieved rates of a row (sim/roofline.h): GEMMs at the row's precision; attention and adapters at 16 bits
// (not in fp8: Transformer Engine's default recipe); HBM traffic at the memory efficiency, or at the efficiency a
// calibration measured for elementwise kernels and the optimizer step.
struct RowRooflines {
  Roofline gemm;         // linear layers, the LM head; bytes: embedding, logits, dequantisation
  Roofline adapters;     // LoRA adapters
  Roofline attention;    // fused attention
  Roofline elementwise;  // norms, activations, residuals (bytes only)
  Roofline optimizer;    // the GPU Adam step (bytes only)
};

RowRooflines row_rooflines(const WhatifInput& in, const TrainingSetup& s) {
  const GpuSpec& g = *in.gpu;
  const WhatifCalibration& c = in.calibration;
  const double gemm_eff = c.gemm_efficiency > 0 ? c.gemm_efficiency : in.gemm_efficiency;
  const double peak16 = g.peak_of(compute_precision(s.precision == Precision::kFp8 ? Precision::kBf16 : s.precision));
  const double hbm = achieved_bytes_per_s(g.memory_bw_gbs, in.memory_efficiency);
  auto hbm_at = [&](double measured) { return measured > 0 ? achieved_bytes_per_s(g.memory_bw_gbs, measured) : hbm; };
  RowRooflines r;
  r.gemm = {achieved_flops_per_s(g.peak_of(compute_precision(s.precision)), gemm_eff), hbm};
  r.adapters = {achieved_flops_per_s(peak16, gemm_eff), hbm};
  r.attention = {c.attention_efficiency > 0 ? achieved_flops_per_s(peak16, c.attention_efficiency)
                                            : r.adapters.flops_per_s,
                 hbm};
  r.elementwise = {0, hbm_at(c.elementwise_efficiency)};
  r.optimizer = {0, hbm_at(c.optimizer_hbm_efficiency)};
  return r;
}

// Seconds of one transformer block, forward and backward, for T tokens.
struct BlockSeconds {
  double forward = 0, backward = 0;
};

BlockSeconds block_seconds(const WhatifInput& in, const WhatifRow& row, const RowRooflines& r, double T) {
  const ModelShape& m = in.shape;
  const TrainingSetup& s = row.setup;
  const double e = s.precision == Precision::kFp32 ? 4 : 2;
  const double h = static_cast<double>(m.hidden_size);
  const bool peft = s.finetune != Finetune::kFull;
  const double elem_factor = row.torch_compile ? kCompileElementwiseFactor : 1.0;
  const double lora = peft ? m.lora_forward_flops_per_token(s.lora_rank, s.lora_targets) : 0.0;
  const double elem = r.elementwise.memory_s(kElementwiseBytesPerTokenHidden * h * e * T * elem_factor);
  const double gemm_fwd = r.gemm.compute_s(m.linear_forward_flops_per_token() * T);
  const double attn_fwd = r.attention.compute_s(m.attention_forward_flops_per_token(in.seq) * T);
  const double lora_fwd = r.adapters.compute_s(lora * T);
  // Dequantising the frozen base before each GEMM that uses it (forward, and the backward's input gradient).
  double dequant = 0;
  const bool measured_dequant = quantised_base(s) && in.calibration.qlora_dequant_factor > 0;
  if (quantised_base(s) && !measured_dequant)
    dequant = r.gemm.memory_s(static_cast<double>(m.block_linear_weights()) * (s.base_weights.bits_per_param() / 8 + 2));
  // torch.autocast casts every fp32 weight to 16 bits in each forward (and each recomputed forward).
  const double cast = row.autocast ? r.elementwise.memory_s(static_cast<double>(m.block_linear_weights()) *
                                                             kAutocastCastBytesPerParam)
                                   : 0.0;
  BlockSeconds b;
  b.forward = gemm_fwd + attn_fwd + lora_fwd + elem + dequant + cast;
  // Backward: weight and input gradients of every GEMM; a frozen base computes input gradients only.
  b.backward = (peft ? gemm_fwd : kBackwardPerForward * gemm_fwd) + kBackwardPerForward * attn_fwd +
               kBackwardPerForward * lora_fwd + kBackwardPerForward * elem + dequant;
  if (measured_dequant)
    b.forward *= in.calibration.qlora_dequant_factor, b.backward *= in.calibration.qlora_dequant_factor;
  // The GPU's own floor per kernel (sim/runtime_overheads.h; the host's side of an eager step is costed for
  // the whole step in cost_whatif_row).
  const double kernels = eager_block_forward_kernels(m, row.autocast, m.learned_positions);
  const double floor_s = in.launch.graph_kernel_us * 1e-6;
  b.forward = std::max(b.forward, kernels * floor_s);
  b.backward = std::max(b.backward, kernels * kBackwardKernelsPerForward * floor_s);
  return b;
}

LayerTimes roofline_layers(const WhatifInput& in, const WhatifRow& row, int bs) {
  const ModelShape& m = in.shape;
  const TrainingSetup& s = row.setup;
  const RowRooflines r = row_rooflines(in, s);
  const double e = s.precision == Precision::kFp32 ? 4 : 2;
  const double T = static_cast<double>(bs) * in.seq;
  const double h = static_cast<double>(m.hidden_size), V = static_cast<double>(m.vocab_size);
  const bool peft = s.finetune != Finetune::kFull;
  const BlockSeconds block = block_seconds(in, row, r, T);

  LayerTimes t;
  // Embedding: gather rows forward; scatter-add into the table's gradient backward (none when frozen).
  const double emb_fwd = r.gemm.memory_s(2 * T * h * e);
  const double emb_bwd = peft ? 0.0 : r.gemm.memory_s(2 * T * h * e);
  t.forward.push_back(emb_fwd);
  t.total.push_back(emb_fwd + emb_bwd);
  for (int i = 0; i < m.num_layers; ++i) {
    t.forward.push_back(block.forward);
    t.total.push_back(block.forward + block.backward);
  }
  // Final norm, LM head and the fp32 cross-entropy (logits written, read by softmax, gradient written).
  const double head_gemm = r.gemm.compute_s(m.head_forward_flops_per_token() * T);
  const double logits = r.gemm.memory_s(3 * T * V * 4);
  // torch.autocast casts the head's fp32 weight (the tied embedding table, or the untied head) each forward.
  const double head_cast = row.autocast ? r.elementwise.memory_s(V * h * kAutocastCastBytesPerParam) : 0.0;
  const double head_fwd = head_gemm + logits + r.gemm.memory_s(2 * T * h * e) + head_cast;
  const double head_bwd = (peft ? head_gemm : kBackwardPerForward * head_gemm) + logits + r.gemm.memory_s(2 * T * h * e);
  t.forward.push_back(head_fwd);
  t.total.push_back(head_fwd + head_bwd);
  for (auto* v : {&t.forward, &t.total})
    for (double& x : *v) x *= 1e3;
  // Adam on the GPU over every parameter (plan_cost scales it to the trainable share and ZeRO's partition):
  // kCpuAdamBytesPerParam bytes per parameter, as on the CPU.
  t.optimizer_ms = r.optimizer.memory_s(static_cast<double>(m.parameter_count()) * kCpuAdamBytesPerParam) * 1e3;
  return t;
}

ordered_json profile_json(const WhatifInput& in, const WhatifRow& row, const LayerTimes& t) {
  ordered_json j;
  j["estimate"] = {{"method", "whatif roofline (sim/whatif.h)"},
                   {"device", in.gpu->name},
                   {"source", in.gpu->source_url},
                   {"row", row.name}};
  ordered_json params = ordered_json::array();
  double total = 0;
  for (long long p : in.shape.metis_layer_params()) {
    params.push_back(static_cast<double>(p) * 2);
    total += static_cast<double>(p) * 2;
  }
  j["model"] = {{"model_name", in.shape.name},
                {"num_layers", in.shape.metis_num_layers()},
                {"parameters", {{"total_parameters_bytes", total}, {"parameters_per_layer_bytes", params}}}};
  double sum = 0;
  for (double x : t.total) sum += x;
  ordered_json et;
  et["total_time_ms"] = sum + t.optimizer_ms;
  et["forward_backward_time_ms"] = sum;
  et["batch_generator_time_ms"] = 0.0;
  et["optimizer_time_ms"] = t.optimizer_ms;
  et["layer_compute_total_ms"] = t.total;
  et["layer_forward_ms"] = t.forward;
  j["execution_time"] = et;
  ordered_json mem = ordered_json::array();
  for (std::size_t i = 0; i < t.total.size(); ++i) mem.push_back(0);
  j["execution_memory"] = {{"note", "memory comes from the memory model (sim/memory_model.h), not from this file"},
                           {"total_memory", 0},
                           {"layer_memory_total_mb", mem},
                           {"attention", row.setup.flash_attention ? "fused" : "materialized"}};
  return j;
}

// The same numbers a loader would read from profile_json (ProfileSet::load).
LayerProfile layer_profile(const LayerTimes& t, int bs, double sum) {
  LayerProfile p;
  p.path = "whatif roofline";
  p.tp = 1;
  p.bs = bs;
  p.layer_ms = t.total;
  p.forward_ms = t.forward;
  p.forward_backward_ms = sum;
  p.memory_mb.assign(t.total.size(), 0.0);
  p.optimizer_ms = t.optimizer_ms;
  return p;
}

int row_gpus(const WhatifInput& in, const WhatifRow& row) { return row.gpus > 0 ? std::min(row.gpus, in.gpus) : in.gpus; }

int accumulation_of(const WhatifInput& in) {
  const auto per_step = checked_mul(in.micro_batch, in.gpus);
  if (!per_step || *per_step > kMaxGlobalBatch)
    throw InputError("--micro-batch x GPUs: " + std::to_string(in.micro_batch) + " x " + std::to_string(in.gpus) +
                     " sequences per step is more than " + std::to_string(kMaxGlobalBatch));
  const int gbs = in.gbs > 0 ? in.gbs : *per_step;
  if (gbs % *per_step != 0)
    throw InputError("--gbs: expected a multiple of --micro-batch x GPUs (" + std::to_string(*per_step) + ")");
  return gbs / *per_step;
}


// The host's side of the eager step (sim/runtime_overheads.h): per micro-batch a forward and a backward phase,
// then the optimizer; on the GPU the forward is the roofline profile's forward, the optimizer its optimizer
// step, the backward the rest of the simulator's step (backward, recomputation, exposed communication).
void apply_host_model(const WhatifInput& in, const WhatifRow& row, WhatifResult& r) {
  TrainingHostSetup h;
  h.autocast = row.autocast;
  h.checkpoint_every = row.setup.recompute == Recompute::kFull ? std::max(1, row.setup.recompute_every) : 0;
  h.wrapper = row.framework == "FSDP"                 ? DataParallelWrapper::kFsdp2
              : (row.setup.ddp.model && r.gpus > 1)    ? DataParallelWrapper::kDdp
                                                       : DataParallelWrapper::kNone;
  const HostStep host = eager_training_host(in.shape, h, in.launch.host);
  const LayerTimes t = roofline_layers(in, row, in.micro_batch);
  double gpu_forward = 0;
  for (double x : t.forward) gpu_forward += x;
  const int acc = r.accumulation;
  const double gpu_optimizer = std::min(t.optimizer_ms, r.gpu_ms);
  const double gpu_backward = std::max(0.0, (r.gpu_ms - gpu_optimizer) / acc - gpu_forward);
  std::vector<double> hp, gp;
  for (int i = 0; i < acc; ++i) {
    hp.push_back(host.forward_ms), gp.push_back(std::min(gpu_forward, (r.gpu_ms - gpu_optimizer) / acc));
    hp.push_back(host.backward_ms), gp.push_back(gpu_backward);
  }
  hp.push_back(host.optimizer_ms), gp.push_back(gpu_optimizer);
  r.host_ms = acc * (host.forward_ms + host.backward_ms) + host.optimizer_ms;
  const double step = std::max(r.gpu_ms, host_ahead_step_ms(hp.data(), gp.data(), static_cast<int>(hp.size())));
  if (step > r.step_ms) {
    r.tokens_per_s *= r.step_ms / step;
    if (r.mfu >= 0) r.mfu *= r.step_ms / step;
    r.step_ms = step;
  }
  r.assumptions.push_back(
      "host: " + fixed(r.host_ms, 1) + " ms issuing the eager step (forward " + fixed(host.forward_ms, 1) +
      ", backward " + fixed(host.backward_ms, 1) +
      (host.recompute_ms > 0 ? " incl. recompute " + fixed(host.recompute_ms, 1) : std::string()) +
      (host.wrapper_ms > 0 ? std::string(h.wrapper == DataParallelWrapper::kDdp ? ", DDP hooks " : ", FSDP2 hooks ") +
                                 fixed(host.wrapper_ms, 1)
                           : std::string()) +
      (acc > 1 ? " per micro-batch" : "") + ", optimizer " + fixed(host.optimizer_ms, 1) +
      "; the host runs ahead of the GPU, the step ends synchronised): " +
      (r.step_ms > r.gpu_ms ? "host-bound, " + fixed(r.step_ms, 1) + " ms against the GPU's " + fixed(r.gpu_ms, 1)
                            : "GPU-bound"));
}

}  // namespace

int whatif_accumulation(const WhatifInput& in) { return accumulation_of(in); }

ComputePrecision compute_precision(Precision p) {
  switch (p) {
    case Precision::kFp32: return ComputePrecision::kFp32;
    case Precision::kFp16: return ComputePrecision::kFp16;
    case Precision::kBf16: return ComputePrecision::kBf16;
    case Precision::kFp8: return ComputePrecision::kFp8;
  }
  return ComputePrecision::kBf16;
}

WhatifCalibration read_whatif_calibration(const std::string& dir) {
  WhatifCalibration c;
  const fs::path path = fs::path(dir) / "whatif_calibration.json";
  if (dir.empty() || file_kind(path.string()) == "missing") return c;
  c.path = path.string();
  const ordered_json j = read_json_file(c.path);
  auto num = [&](const ordered_json& o, const char* key, const std::string& where, double* out, NumberRule rule) {
    if (o.is_object() && o.contains(key)) *out = require_number(o, key, c.path, where, rule);
  };
  const NumberRule gbs = rules::positive_up_to(1e5), frac = rules::positive_up_to(1);
  if (j.contains("host")) {
    double h2d = 0, d2h = 0;
    num(j["host"], "h2d_gbs", "host", &h2d, gbs);
    num(j["host"], "d2h_gbs", "host", &d2h, gbs);
    num(j["host"], "cpu_adam_params_per_s", "host", &c.host.cpu_adam_params_per_s, rules::positive_up_to(1e15));
    num(j["host"], "cpu_cast_params_per_s", "host", &c.host.cpu_cast_params_per_s, rules::positive_up_to(1e15));
    c.host.h2d_bytes_per_s = h2d * 1e9;
    c.host.d2h_bytes_per_s = d2h * 1e9;
    c.host.source = "measured (" + c.path + ")";
  }
  if (j.contains("training")) {
    num(j["training"], "qlora_dequant_factor", "training", &c.qlora_dequant_factor, rules::positive_up_to(100));
    num(j["training"], "gemm_efficiency", "training", &c.gemm_efficiency, frac);
    num(j["training"], "attention_efficiency", "training", &c.attention_efficiency, frac);
    num(j["training"], "elementwise_efficiency", "training", &c.elementwise_efficiency, frac);
    num(j["training"], "optimizer_hbm_efficiency", "training", &c.optimizer_hbm_efficiency, frac);
  }
  if (j.contains("inference")) {
    const ordered_json& inf = j["inference"];
    if (inf.is_object() && inf.contains("decode_hbm_efficiency")) {
      num(inf["decode_hbm_efficiency"], "bf16", "inference.decode_hbm_efficiency", &c.decode_hbm_efficiency_bf16, frac);
      num(inf["decode_hbm_efficiency"], "int4", "inference.decode_hbm_efficiency", &c.decode_hbm_efficiency_int4, frac);
    }
    num(inf, "prefill_compute_efficiency", "inference", &c.prefill_compute_efficiency, frac);
    num(inf, "kernel_floor_us", "inference", &c.kernel_floor_us, rules::positive_up_to(1e4));
    num(inf, "eager_op_us", "inference", &c.eager_op_us, rules::positive_up_to(1e5));
    num(inf, "attention_hbm_efficiency", "inference", &c.attention_hbm_efficiency, frac);
    num(inf, "decode_kernels_per_layer", "inference", &c.decode_kernels_per_layer, rules::positive_up_to(1e5));
    num(inf, "int4_row_params_per_s", "inference", &c.int4_row_params_per_s, rules::positive_up_to(1e18));
    auto flag = [&](const char* key, bool* out) {
      if (!inf.is_object() || !inf.contains(key)) return;
      if (!inf[key].is_boolean()) throw InputError(c.path + ": inference." + key + ": expected true or false");
      *out = inf[key].get<bool>();
    };
    flag("kv_repeat_materialised", &c.kv_repeat_materialised);
    flag("static_kv_cache", &c.static_kv_cache);
    flag("decode_hbm_efficiency_net_of_floor", &c.decode_hbm_efficiency_net_of_floor);
  }
  return c;
}

namespace {

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

WhatifRow deepspeed_config_row(const TrainingSetup& base, const DeepSpeedRunConfig& c, bool accounting_given) {
  WhatifRow r;
  r.name = "ds_config";
  r.framework = "DeepSpeed";
  r.setup = base;
  r.setup.zero_stage = c.stage;
  if (!accounting_given) r.setup.accounting = c.stage > 0 ? ZeroAccounting::kDeepSpeed : ZeroAccounting::kMegatron;
  r.setup.deepspeed = c.buffers;
  r.setup.deepspeed.model = c.stage > 0;
  r.setup.offload_optimizer = c.offload_optimizer;
  r.setup.offload_params = c.offload_params;
  r.multi_gpu = c.stage > 0 && !c.offload_optimizer;
  r.assumptions.push_back(deepspeed_settings_text(r.setup));
  return r;
}

std::string deepspeed_settings_text(const TrainingSetup& s) {
  const DeepSpeedBuffers& d = s.deepspeed;
  std::string out = std::string(d.from_config.empty() ? "DeepSpeed defaults" : "DeepSpeed config " + d.from_config) +
                    ": reduce_bucket_size " + sci(d.reduce_bucket_size) + ", overlap_comm " +
                    (deepspeed_overlap_comm(s) ? "on" : "off");
  if (s.zero_stage <= 2) out += ", allgather_bucket_size " + sci(d.allgather_bucket_size);
  if (s.zero_stage == 3)
    out += ", stage3_prefetch_bucket_size " + sci(d.prefetch_bucket_size) + ", stage3_max_live_parameters " +
           sci(d.max_live_parameters);
  if (s.offload_optimizer || s.offload_params) out += std::string(", offload ") + (d.pin_memory ? "pinned" : "pageable");
  return out;
}

std::vector<WhatifRow> standard_whatif_rows(const TrainingSetup& base, int lora_rank, unsigned lora_targets,
                                            int gpus_per_node, bool accounting_given) {
  std::vector<WhatifRow> rows;
  // The base's offload is for the ZeRO rows that take it (FSDP, PEFT+ZeRO); every other row starts without.
  TrainingSetup plain = base;
  plain.offload_optimizer = plain.offload_params = false;
  auto row = [&](const std::string& name, const std::string& framework, auto edit) {
    WhatifRow r;
    r.name = name;
    r.framework = framework;
    r.setup = plain;
    // Every row runs the user's PyTorch model code (Hugging Face's, nanoGPT's): its loss is logits.float() and
    // F.cross_entropy, not a fused vocab-parallel loss (TrainingSetup::eager_fp32_loss).
    r.setup.eager_fp32_loss = true;
    const bool pytorch = framework == "PyTorch" || framework == "PyTorch DDP";
    edit(r);
    const bool sixteen = r.setup.precision == Precision::kBf16 || r.setup.precision == Precision::kFp16;
    if (pytorch && sixteen && r.setup.finetune == Finetune::kFull) {
      // torch.autocast over fp32 parameters: fp32 weights and gradients, Adam states, and the 16-bit copies
      // autocast makes in the forward (Megatron's 18 bytes per parameter).
      r.autocast = true;
      r.setup.fp32_residual = true;      // the embedding's fp32 output: the residual stream stays fp32
      r.setup.grads_in_backward = true;  // zero_grad(set_to_none=True)
      if (!accounting_given) r.setup.accounting = ZeroAccounting::kMegatron;
      r.assumptions.push_back("torch.autocast: fp32 parameters and gradients, each weight cast to " +
                              std::string(to_string(r.setup.precision)) +
                              " in every forward; gradients allocated in the backward (zero_grad set_to_none)");
    }
    if (framework == "PyTorch DDP" && r.gpus != 1) {
      r.setup.ddp.model = true;  // (dropped where the row runs on one GPU: nothing wraps it in DDP there)
      r.multi_gpu = name == "DDP";
      r.assumptions.push_back("DDP: bucket_cap_mb 25, gradient_as_bucket_view False (buckets are a second copy "
                              "of the gradients, and at the second step, when DDP rebuilds them, the old ones "
                              "while still held: a third), bucketed all-reduce overlapped with the backward");
    }
    if (r.setup.zero_stage >= 1 && !r.setup.offload_optimizer) r.multi_gpu = true;
    rows.push_back(std::move(r));
  };
  // The ZeRO rows that take --offload: the optimizer, and the parameters too at ZeRO-3.
  auto base_offload = [&](WhatifRow& r) {
    r.setup.offload_optimizer = base.offload_optimizer;
    r.setup.offload_params = base.offload_params && r.setup.zero_stage >= 3;
  };
  auto deepspeed = [&](WhatifRow& r, int stage, bool opt, bool params) {
    r.setup.zero_stage = stage;
    if (!accounting_given) r.setup.accounting = ZeroAccounting::kDeepSpeed;
    r.setup.deepspeed = base.deepspeed;  // DeepSpeed's defaults, or a --deepspeed-config's sizes
    r.setup.deepspeed.model = true;
    r.setup.offload_optimizer = opt;
    r.setup.offload_params = params;
    r.assumptions.push_back(deepspeed_settings_text(r.setup));
  };
  row("single GPU", "PyTorch", [](WhatifRow& r) {
    r.gpus = 1;
    r.setup.zero_stage = 0;
  });
  row("DDP", "PyTorch DDP", [](WhatifRow& r) { r.setup.zero_stage = 0; });
  row("ZeRO-1", "DeepSpeed", [&](WhatifRow& r) { deepspeed(r, 1, false, false); });
  row("ZeRO-1+offload", "DeepSpeed", [&](WhatifRow& r) { deepspeed(r, 1, true, false); });
  row("ZeRO-2", "DeepSpeed", [&](WhatifRow& r) { deepspeed(r, 2, false, false); });
  row("ZeRO-2+offload", "DeepSpeed", [&](WhatifRow& r) { deepspeed(r, 2, true, false); });
  row("ZeRO-3", "DeepSpeed", [&](WhatifRow& r) { deepspeed(r, 3, false, false); });
  row("ZeRO-3+opt-offload", "DeepSpeed", [&](WhatifRow& r) { deepspeed(r, 3, true, false); });
  row("ZeRO-3+offload", "DeepSpeed", [&](WhatifRow& r) { deepspeed(r, 3, true, true); });
  row("FSDP", "FSDP", [&](WhatifRow& r) {
    r.setup.zero_stage = 3;
    r.setup.grads_in_backward = true;
    if (!accounting_given) r.setup.accounting = ZeroAccounting::kFsdp2;
    base_offload(r);
    r.assumptions.push_back("fully_shard per block, MixedPrecisionPolicy(16-bit params, fp32 reduce): fp32 shards "
                            "(the master), Adam states and fp32 gradients sharded; 16-bit weights only while a unit "
                            "is gathered");
  });
  row("FSDP-hybrid", "FSDP", [&](WhatifRow& r) {
    r.setup.zero_stage = 3;
    r.setup.grads_in_backward = true;
    if (!accounting_given) r.setup.accounting = ZeroAccounting::kFsdp2;
    base_offload(r);
    r.setup.shard_group = gpus_per_node;
    r.assumptions.push_back("HYBRID_SHARD: sharded within a node of " + std::to_string(gpus_per_node) +
                            " GPUs, replicated across nodes; communication costed as FULL_SHARD's");
  });
  for (Precision p : {Precision::kFp32, Precision::kFp16, Precision::kBf16, Precision::kFp8}) {
    const std::string name = p == Precision::kFp8 ? "FP8" : to_string(p);
    row(name, p == Precision::kFp8 ? "Transformer Engine" : "PyTorch DDP", [&](WhatifRow& r) {
      r.setup.zero_stage = 0;
      r.setup.precision = p;
      if (p == Precision::kFp16) r.assumptions.push_back("fp16 AMP with dynamic loss scaling (skipped steps ignored)");
      if (p == Precision::kFp8)
        r.assumptions.push_back("Transformer Engine delayed-scaling recipe: linear GEMMs in fp8, attention and the "
                                "rest in bf16; an fp8 weight copy beside the bf16 one");
    });
    if (p == Precision::kBf16 || p == Precision::kFp8) {
      row(name + "+ckpt-every-2", p == Precision::kFp8 ? "Transformer Engine" : "PyTorch DDP", [&](WhatifRow& r) {
        r.setup.zero_stage = 0;
        r.setup.precision = p;
        r.setup.recompute = Recompute::kFull;
        r.setup.recompute_every = 2;
        r.assumptions.push_back("selective activation checkpointing: every 2nd block recomputed (torchtitan's "
                                "selective_ac_option \"2\")");
      });
    }
  }
  row("torch.compile", "PyTorch DDP", [](WhatifRow& r) {
    r.setup.zero_stage = 0;
    r.torch_compile = true;
    r.assumptions.push_back("torch.compile assumed to halve elementwise HBM traffic (fusion); GEMMs unchanged");
  });
  auto peft = [&](WhatifRow& r, Finetune kind, bool gc, int stage) {
    r.setup.finetune = kind;
    r.setup.lora_rank = lora_rank;
    r.setup.lora_targets = lora_targets;
    r.setup.zero_stage = 0;
    if (kind == Finetune::kQlora) r.setup.base_weights = nf4_double_quant();
    if (gc) r.setup.recompute = Recompute::kFull, r.setup.recompute_every = 1;
    if (stage > 0) {
      deepspeed(r, stage, false, false);
      base_offload(r);
    }
    r.assumptions.push_back("frozen base: its backward computes input gradients only; adapters in fp32 with Adam");
    if (kind == Finetune::kQlora)
      r.assumptions.push_back("NF4 with double quantisation (4.127 bits); each projection dequantised before its "
                              "forward and backward GEMM");
  };
  row("LoRA", "PEFT", [&](WhatifRow& r) { peft(r, Finetune::kLora, false, 0); });
  row("LoRA+GC", "PEFT", [&](WhatifRow& r) { peft(r, Finetune::kLora, true, 0); });
  row("QLoRA", "PEFT", [&](WhatifRow& r) { peft(r, Finetune::kQlora, false, 0); });
  row("QLoRA+GC", "PEFT", [&](WhatifRow& r) { peft(r, Finetune::kQlora, true, 0); });
  row("LoRA+ZeRO-2", "PEFT+DeepSpeed", [&](WhatifRow& r) { peft(r, Finetune::kLora, false, 2); });
  row("LoRA+ZeRO-3", "PEFT+DeepSpeed", [&](WhatifRow& r) { peft(r, Finetune::kLora, false, 3); });
  row("QLoRA+ZeRO-2", "PEFT+DeepSpeed", [&](WhatifRow& r) { peft(r, Finetune::kQlora, false, 2); });
  row("QLoRA+ZeRO-3", "PEFT+DeepSpeed", [&](WhatifRow& r) { peft(r, Finetune::kQlora, false, 3); });
  row("8-bit base+8-bit Adam+GC", "PEFT+bitsandbytes", [&](WhatifRow& r) {
    peft(r, Finetune::kQlora, true, 0);
    r.setup.base_weights = int8_rowwise(4096);
    r.setup.adam_8bit = true;
    r.assumptions.back() = "LLM.int8() base (8 bits, one fp32 absmax per row); dequantised before each GEMM";
    r.assumptions.push_back("bitsandbytes 8-bit Adam (2 bytes of state per trainable parameter)");
  });
  row("4-bit base+8-bit Adam+GC", "PEFT+bitsandbytes", [&](WhatifRow& r) {
    peft(r, Finetune::kQlora, true, 0);
    r.setup.adam_8bit = true;
    r.assumptions.push_back("bitsandbytes 8-bit Adam (2 bytes of state per trainable parameter)");
  });
  return rows;
}

std::string whatif_unsupported(const WhatifInput& in, const WhatifRow& row) {
  if (row.multi_gpu && row_gpus(in, row) < 2)
    return "needs more than one GPU (" + row.framework + " " +
           (row.setup.zero_stage > 0 ? "partitions over data-parallel ranks" : "replicates over data-parallel ranks") +
           "); on one GPU see 'single GPU' or the ZeRO-Offload rows";
  const ComputePrecision p = compute_precision(row.setup.precision);
  if (in.gpu->supports(p)) return "";
  return in.gpu->name + " has no " + to_string(p) + " (it supports " + in.gpu->supported() + ")";
}

WhatifSimulation whatif_simulation(const WhatifInput& in, const WhatifRow& row) {
  WhatifSimulation w;
  const GpuSpec& g = *in.gpu;
  w.device_type = type_name(g);
  const int gpus = row_gpus(in, row);
  const int per_node = std::min(in.gpus_per_node, gpus);
  const int accumulation = accumulation_of(in);
  w.gbs = in.micro_batch * gpus * accumulation;

  // The cluster: ceil(gpus / per_node) nodes of this GPU.
  std::vector<std::pair<std::string, int>> hosts;
  std::vector<ClusterfileEntry> entries;
  for (int left = gpus, i = 1; left > 0; left -= per_node, ++i) {
    const std::string ip = "10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256);
    hosts.push_back({ip, std::min(per_node, left)});
    ClusterfileEntry e;
    e.ip = ip;
    e.instance_type = w.device_type;
    e.inter_bandwidth = in.inter_gbs;
    e.intra_bandwidth = in.intra_gbs > 0 ? in.intra_gbs : g.nvlink_gbs;
    e.memory_gb = in.memory_gb > 0 ? in.memory_gb : g.memory_gb;
    entries.push_back(e);
  }
  w.cluster = Cluster::from_parts(hosts, entries, "whatif hostfile", "whatif clusterfile");

  // The roofline profile set: bs 1 (the set's model-level file) and the micro-batch.
  std::vector<int> sizes{1};
  if (in.micro_batch != 1) sizes.push_back(in.micro_batch);
  for (int bs : sizes) {
    const LayerTimes t = roofline_layers(in, row, bs);
    double sum = 0;
    for (double x : t.total) sum += x;
    w.profiles.add(w.device_type, layer_profile(t, bs, sum));
    w.profile_files.push_back(profile_json(in, row, t));
    w.profile_names.push_back("DeviceType." + w.device_type + "_tp1_bs" + std::to_string(bs) + ".json");
  }
  std::vector<double> param_bytes;
  for (long long p : in.shape.metis_layer_params()) param_bytes.push_back(static_cast<double>(p) * 2);
  w.profiles.finalize("whatif roofline", roofline_layers(in, row, 1).optimizer_ms, 0.0, std::move(param_bytes));

  w.options.schedule = Schedule::k1F1B;
  w.options.setup = row.setup;
  if (gpus == 1) w.options.setup.ddp.model = false;  // one GPU: no DDP wrapper, no buckets
  w.options.network.unit = BandwidthUnit::kGBps;
  w.options.measured_collectives = false;  // no measured bus bandwidth: the link's
  w.options.host = in.calibration.host;
  // whatif's rows carry their own framework constant and are checked against published numbers
  // (logs/whatif_published.md): the device-memory terms and headroom of sim/device_memory.h stay off.
  w.options.device_memory.enabled = false;
  w.options.device_memory.headroom_fraction = 0;
  w.plan.node_sequence = {w.device_type};
  w.plan.device_groups = {gpus};
  w.plan.strategies = {Strategy{gpus, 1}};
  w.plan.batches = accumulation;
  w.plan.layer_partition = {0, in.shape.metis_num_layers()};
  return w;
}

// DDP's old buckets across its rebuild at the second forward (sim/runtime_overheads.h, DdpBuckets): at which of
// the second step's peaks the median run still holds them, from when the first step's last all-reduce
// completed (then the optimizer ran on the GPU, or on the host where that is longer) and when the host reaches
// each peak after the rebuild (eager: having issued the forward, then the backward; CUDA graphs: the GPU's).
// Returns the row with DdpBuckets' phases set, and the shares in words in `note`.
WhatifRow with_old_bucket_phases(const WhatifInput& in, const WhatifRow& row, std::string& note) {
  WhatifRow out = row;
  DdpBuckets& d = out.setup.ddp;
  if (!d.model || !d.old_buckets_held_at_rebuild || row_gpus(in, row) == 1) return out;
  const LayerTimes t = roofline_layers(in, row, in.micro_batch);
  double gpu_forward = 0, gpu_total = 0;
  for (double x : t.forward) gpu_forward += x;
  for (double x : t.total) gpu_total += x;
  double before = t.optimizer_ms, at_activations = gpu_forward, at_gradients = gpu_total;
  if (in.launch.runtime == LaunchRuntime::kEager) {
    TrainingHostSetup h;
    h.autocast = row.autocast;
    h.checkpoint_every = row.setup.recompute == Recompute::kFull ? std::max(1, row.setup.recompute_every) : 0;
    h.wrapper = DataParallelWrapper::kDdp;
    const HostStep host = eager_training_host(in.shape, h, in.launch.host);
    before = std::max(before, host.optimizer_ms);
    at_activations = host.forward_ms;
    at_gradients = host.forward_ms + host.backward_ms;
  }
  old_buckets_phases(d, before, at_activations, at_gradients);
  auto share = [&](double after) { return fixed(100 * old_buckets_alive_share(d, before, after), 0) + "%"; };
  note = "DDP's old buckets (held across the rebuild at the second forward until ProcessGroupNCCL's watchdog, "
         "polling every " + fixed(d.watchdog_period_ms, 0) + " ms, sees their all-reduce done " +
         fixed(before, 1) + " ms before it): still allocated at the activations' peak (" + fixed(at_activations, 1) +
         " ms after it) in " + share(at_activations) + " of runs, at the gradients' peak (" +
         fixed(at_gradients, 1) + " ms) in " + share(at_gradients) + "; the median run's counted: " +
         (d.old_at_activation_peak && d.old_at_gradient_peak ? "at both"
          : d.old_at_activation_peak                         ? "at the activations' peak"
          : d.old_at_gradient_peak                           ? "at the gradients' peak"
                                                             : "at neither");
  return out;
}

WhatifResult cost_whatif_row(const WhatifInput& in, const WhatifRow& row) {
  WhatifResult r;
  r.name = row.name;
  r.assumptions = row.assumptions;
  r.gpus = row_gpus(in, row);
  r.accumulation = accumulation_of(in);
  r.gbs = in.micro_batch * r.gpus * r.accumulation;
  r.assumptions.push_back("runtime: " + in.launch.describe());
  r.not_offered = whatif_unsupported(in, row);
  if (!r.not_offered.empty()) {
    r.offered = false;
    return r;
  }
  std::string old_buckets;
  const WhatifSimulation w = whatif_simulation(in, with_old_bucket_phases(in, row, old_buckets));
  if (!old_buckets.empty()) r.assumptions.push_back(old_buckets);
  const PlanSimulator simulator(w.cluster, w.profiles, in.shape, in.seq, w.options);
  const PlanSimulation sim = simulator.simulate(w.plan, w.gbs);
  r.gpu_ms = sim.timeline.iteration_ms;
  r.step_ms = r.gpu_ms;
  r.tokens_per_s = sim.timeline.tokens_per_s;
  r.mfu = sim.timeline.mfu;
  if (in.launch.runtime == LaunchRuntime::kEager) apply_host_model(in, row, r);
  double peak = -1;
  for (const RankMemory& m : sim.ranks)
    if (m.breakdown.gpu_total() > peak) {
      peak = m.breakdown.gpu_total();
      r.memory = m.breakdown;
      r.capacity_bytes = m.capacity_bytes;
    }
  r.fits = sim.fits && r.memory.cpu_per_node() <= in.cpu_memory_gb * 1024.0 * 1024.0 * 1024.0;
  if (row.setup.offload_optimizer || row.setup.offload_params) {
    HostSpec d = default_host_spec(in.gpu->host_link_gbs);
    const HostSpec& h = in.calibration.host;
    const bool measured = h.h2d_bytes_per_s > 0 && h.d2h_bytes_per_s > 0 && h.cpu_adam_params_per_s > 0;
    const double h2d = h.h2d_bytes_per_s > 0 ? h.h2d_bytes_per_s : d.h2d_bytes_per_s;
    const double adam = h.cpu_adam_params_per_s > 0 ? h.cpu_adam_params_per_s : d.cpu_adam_params_per_s;
    const std::string measured_by = h.source.empty() ? "measured" : h.source;
    const bool pinned = !row.setup.deepspeed.model || row.setup.deepspeed.pin_memory;
    r.assumptions.push_back("host: " + fixed(h2d / 1e9 * (pinned ? 1 : kPageableCopyFactor), 1) + " GB/s " +
                            (pinned ? "pinned" : "pageable (pin_memory false)") + " copies per GPU (" +
                            (h.h2d_bytes_per_s > 0 ? measured_by : std::string("default")) + "), CPU Adam " +
                            fixed(adam / 1e9, 2) + "e9 params/s per host (" +
                            (h.cpu_adam_params_per_s > 0 ? measured_by : std::string("default")) + "), fp32->16-bit cast " +
                            fixed((h.cpu_cast_params_per_s > 0 ? h.cpu_cast_params_per_s : d.cpu_cast_params_per_s) / 1e9, 2) +
                            "e9 params/s (" + (h.cpu_cast_params_per_s > 0 ? measured_by : std::string("default")) +
                            "), gradients fp32 device-to-host " +
                            (deepspeed_overlap_comm(row.setup) ? "on the reduction stream, under the backward (overlap_comm)"
                                                               : "on the compute stream, after the backward's kernels (no overlap_comm)") +
                            "; shared by " +
                            std::to_string(std::min(in.gpus_per_node, r.gpus)) + " ranks" +
                            (measured ? std::string() : "; defaults: " + d.source.substr(10)));
  }
  return r;
}

void export_whatif_row(const WhatifInput& in, const WhatifRow& row, const std::string& dir) {
  const std::string why = whatif_unsupported(in, row);
  if (!why.empty()) throw InputError("--export: row '" + row.name + "' is not offered: " + why);
  const WhatifSimulation w = whatif_simulation(in, row);
  make_output_folder(dir);
  const std::string profiles = make_subfolder(dir, "profiles");
  for (std::size_t i = 0; i < w.profile_files.size(); ++i)
    write_json_file_in(profiles, safe_file_name(w.profile_names[i]), w.profile_files[i]);
  std::string hostfile;
  for (const auto& n : w.cluster.nodes()) hostfile += n.ip + " slots=" + std::to_string(n.num_devices) + "\n";
  write_file_in(dir, "hostfile", hostfile);
  ordered_json cf;
  for (const auto& e : w.cluster.clusterfile())
    cf[e.ip] = {{"instance_type", e.instance_type},
                {"inter_bandwidth", e.inter_bandwidth},
                {"intra_bandwidth", e.intra_bandwidth},
                {"memory", e.memory_gb}};
  write_json_file_in(dir, "clusterfile.json", cf);
  PlanFile pf;
  pf.plan = w.plan;
  pf.model = in.shape.to_model_config(in.seq);
  pf.gbs = w.gbs;
  // Names relative to the plan's folder: read_plan_file finds them from any working directory.
  pf.hostfile = "hostfile";
  pf.clusterfile = "clusterfile.json";
  pf.profile_dir = "profiles";
  pf.zero_stage = row.setup.zero_stage;
  pf.recompute = to_string(row.setup.recompute);
  pf.schedule = "1f1b";
  // The rest of the row's setup, so that `simulate --plan` costs the same thing without flags.
  pf.shape = in.shape;
  pf.precision = to_string(row.setup.precision);
  pf.offload_optimizer = row.setup.offload_optimizer;
  pf.offload_params = row.setup.offload_params;
  pf.accounting = row.setup.accounting == ZeroAccounting::kDeepSpeed ? "deepspeed"
                  : row.setup.accounting == ZeroAccounting::kMegatron ? "megatron"
                  : row.setup.accounting == ZeroAccounting::kFsdp2    ? "fsdp2"
                                                                      : "zero";
  pf.deepspeed_buffers = row.setup.deepspeed.model;
  pf.ddp_buckets = w.options.setup.ddp.model;
  if (pf.ddp_buckets) {
    std::string note;
    pf.ddp_old_buckets = old_buckets_phases_name(with_old_bucket_phases(in, row, note).setup.ddp);
  }
  pf.grads_in_backward = row.setup.grads_in_backward;
  pf.fp32_residual = row.setup.fp32_residual;
  pf.eager_fp32_loss = row.setup.eager_fp32_loss;
  write_json_file_in(dir, "plan.json", plan_file_to_json(pf));
}

namespace {

ordered_json model_constants_json(const ModelShape& m, int seq) {
  return {{"name", m.name},
          {"parameters", m.parameter_count()},
          {"blocks", m.num_layers},
          {"metis_layers", m.metis_num_layers()},
          {"hidden_size", m.hidden_size},
          {"heads", m.num_heads},
          {"kv_heads", m.num_kv_heads},
          {"head_dim", m.head_dim},
          {"ffn_hidden_size", m.ffn_hidden_size},
          {"vocab_size", m.vocab_size},
          {"seq", seq},
          {"block_linear_weights", m.block_linear_weights()},
          {"linear_forward_flops_per_token", m.linear_forward_flops_per_token()},
          {"attention_forward_flops_per_token", m.attention_forward_flops_per_token(seq)},
          {"attention_forward_flops_per_token_per_context_token", m.attention_forward_flops_per_token(1)},
          {"head_forward_flops_per_token", m.head_forward_flops_per_token()},
          {"kv_cache_bytes_per_token", kv_cache_bytes_per_token(m)}};
}

ordered_json gpu_constants_json(const GpuSpec& g) {
  ordered_json peaks;
  for (int p = 0; p < kNumComputePrecisions; ++p)
    peaks[to_string(static_cast<ComputePrecision>(p))] = g.peak_of(static_cast<ComputePrecision>(p));
  return {{"name", g.name},
          {"peak_tflops", g.peak_tflops},
          {"peak_tflops_by_precision", peaks},
          {"memory_bw_gbs", g.memory_bw_gbs},
          {"memory_gb", g.memory_gb},
          {"nvlink_gbs", g.nvlink_gbs},
          {"source", g.source_url}};
}

}  // namespace

ordered_json whatif_constants_json(const WhatifInput& in) {
  const AnalyticOptions analytic;
  ordered_json j;
  j["about"] = "hetplan's model and roofline constants (hetplan whatif --print-constants; sim/roofline.h, "
               "sim/model_shape.h, sim/whatif.h, sim/inference.h)";
  j["model"] = model_constants_json(in.shape, in.seq);
  j["flops"] = {{"training_flops_per_forward_flop", kTrainingFlopsPerForwardFlop},
                {"attention_flops_per_context_dim", kAttentionFlopsPerContextDim}};
  j["roofline"] = {
      {"formula", "max(flops / (peak_tflops x 1e12 x compute efficiency), bytes / (memory_bw_gbs x 1e9 x memory "
                  "efficiency)) seconds, plus floors"},
      {"whatif_gemm_efficiency", in.gemm_efficiency},
      {"whatif_memory_efficiency", in.memory_efficiency},
      {"analytic_compute_efficiency", analytic.compute_efficiency},
      {"analytic_memory_efficiency", analytic.memory_efficiency},
      {"inference_decode_hbm_efficiency", kDefaultDecodeHbmEfficiency},
      {"inference_prefill_compute_efficiency", kDefaultPrefillComputeEfficiency}};
  j["whatif"] = {{"elementwise_bytes_per_token_hidden", kElementwiseBytesPerTokenHidden},
                 {"backward_per_forward", kBackwardPerForward},
                 {"compile_elementwise_factor", kCompileElementwiseFactor},
                 {"optimizer_bytes_per_param", kCpuAdamBytesPerParam},
                 {"bytes_per_16bit_value", 2}};
  j["gpu"] = gpu_constants_json(*in.gpu);
  return j;
}

}  // namespace hetplan
