#include "sim/runtime_overheads.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "base/input_error.h"
#include "base/file_access.h"
#include "base/json_util.h"
#include "sim/offload.h"

namespace hetplan {

const char* to_string(LaunchRuntime r) { return r == LaunchRuntime::kEager ? "eager" : "graphs"; }

LaunchRuntime parse_launch_runtime(const std::string& s, const std::string& where) {
  if (s == "eager") return LaunchRuntime::kEager;
  if (s == "graphs") return LaunchRuntime::kGraphs;
  throw InputError(where + ": '" + excerpt(s) + "': expected eager or graphs");
}

std::string LaunchModel::describe() const {
  if (runtime == LaunchRuntime::kEager) return "eager (host model: " + host.source + ")";
  char buf[96];
  std::snprintf(buf, sizeof buf, "CUDA graphs (%.2f us/kernel floor)", graph_kernel_us);
  return buf;
}

HostCosts default_host_costs() {
  // The H200 probe's figures: logs/validate/host-probe-h200/ (scripts/gpu_host_probe.sh on 2 x H200, torch 2.11)
  // through host_costs_from_probe; sim/runtime_overheads.md shows each figure's arithmetic, and
  // read_host_probe(that file) gives the same numbers (tests/test_whatif.cc).
  HostCosts c;
  c.forward_op_us = 29.61473621102388;
  c.backward_kernel_us = 20.7220805902417;
  c.checkpoint_forward_us = 343.4415416669149;
  c.checkpoint_backward_us = 514.0016094125971;
  c.ddp_param_us = 48.24798972601398;
  c.fsdp2_module_us = 1510.532198347385;
  c.fsdp2_param_us = 162.1759008264461;
  c.fsdp2_forward_share = 0.42063640392468626;
  c.fsdp2_optimizer_share = 0.05923751144639712;
  c.adam_step_us = 29.050029999950752;
  c.adam_tensor_us = 2.4215324000010696;
  c.zero_grad_tensor_us = 1.3079863013813695;
  c.nograd_op_us = 11.365174711763053;
  c.source = "H200 host probe (logs/validate/host-probe-h200)";
  return c;
}

namespace {
bool rotary(const ModelShape& m) { return !m.learned_positions; }
double norm_kernels(const ModelShape& m) { return m.norm == NormKind::kRmsNorm ? 8 : 1; }
}  // namespace

double eager_block_forward_kernels(const ModelShape& m, bool autocast, bool fused_qkv) {
  const double linears = fused_qkv ? m.block_linears().size() - 2 : m.block_linears().size();
  const double casts_per_linear = autocast ? 1 + (m.attention_bias || m.mlp_bias ? 1 : 0) : 0;
  double k = 2 * norm_kernels(m);
  k += linears * (1 + casts_per_linear);
  k += 2;  // SDPA and the transpose copy of its output
  if (rotary(m)) k += 10;
  k += m.mlp == MlpKind::kSwiGlu ? 2 : 1;
  k += 2;  // residual adds
  return k;
}

double hf_decode_kernels_per_layer(const ModelShape& m) {
  double k = 2 * norm_kernels(m);
  k += m.learned_positions ? 1 : 3;  // GPT-2's c_attn (split: views); Llama's q, k, v
  if (rotary(m)) k += 10;
  k += 2;                                                     // KV-cache update
  if (m.num_kv_heads < m.num_heads) k += 2;                   // repeat_kv
  k += 3;                                                     // SDPA and its mask
  k += 2;                                                     // transpose copy, o_proj
  k += m.mlp == MlpKind::kSwiGlu ? 5 : 3;                     // gate, silu, up, mul, down | fc, gelu, proj
  k += 2;                                                     // residual adds
  return k;
}

double hf_decode_kernels_per_step(const ModelShape& m) {
  return 1 + 10 + norm_kernels(m) + 2 + 6;
}

double ddp_bucket_bytes(const DdpBuckets& d, double gradient_bytes) {
  if (!d.model) return 0.0;
  return d.gradient_as_bucket_view ? 0.0 : gradient_bytes;
}

std::string old_buckets_phases_name(const DdpBuckets& d) {
  return d.old_at_activation_peak ? (d.old_at_gradient_peak ? "both" : "activations")
                                  : (d.old_at_gradient_peak ? "gradients" : "none");
}

void parse_old_buckets_phases(const std::string& s, const std::string& where, DdpBuckets& d) {
  if (s != "none" && s != "activations" && s != "gradients" && s != "both")
    throw InputError(where + ": '" + excerpt(s) + "': expected none, activations, gradients or both");
  d.old_at_activation_peak = s == "activations" || s == "both";
  d.old_at_gradient_peak = s == "gradients" || s == "both";
}

double ddp_old_bucket_bytes(const DdpBuckets& d, double gradient_bytes) {
  return d.model && d.old_buckets_held_at_rebuild ? gradient_bytes : 0.0;
}

double old_buckets_alive_share(const DdpBuckets& d, double before_rebuild_ms, double after_rebuild_ms) {
  if (d.watchdog_period_ms <= 0) return 0.0;
  return std::clamp(1.0 - (before_rebuild_ms + after_rebuild_ms) / d.watchdog_period_ms, 0.0, 1.0);
}

void old_buckets_phases(DdpBuckets& d, double before_rebuild_ms, double activation_peak_ms, double gradient_peak_ms) {
  d.old_at_activation_peak = old_buckets_alive_share(d, before_rebuild_ms, activation_peak_ms) >= 0.5;
  d.old_at_gradient_peak = old_buckets_alive_share(d, before_rebuild_ms, gradient_peak_ms) >= 0.5;
}

}  // namespace hetplan

// ---------------------------------------------------------------- the host's side of an eager step

namespace hetplan {

// The figures of scripts/gpu_host_probe.py's JSON that HostCosts takes (see read_host_probe).
namespace {

double at(const ordered_json& j, const std::string& path, const std::string& file, const NumberRule& rule) {
  const ordered_json* cur = &j;
  std::string where;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (dot == std::string::npos) return require_number(*cur, key, file, where, rule);
    cur = &require_key(*cur, key, file, where);
    where += (where.empty() ? "" : ".") + key;
    start = dot + 1;
  }
}

}  // namespace

HostCosts host_costs_from_probe(const ordered_json& micro, const std::string& micro_path, const ordered_json* dist,
                                const std::string& dist_path) {
  const NumberRule us = rules::positive_up_to(1e7), any = rules::kAny;
  HostCosts c = default_host_costs();
  auto m = [&](const std::string& path, const NumberRule& rule) { return at(micro, path, micro_path, rule); };
  // The tiny GPT (the validation model's code), 24 blocks, no checkpointing: each phase's host time over the
  // ops the profiler counted in it.
  const std::string g0 = "tiny_gpt_step.blocks24_ckpt0.", g1 = "tiny_gpt_step.blocks24_ckpt1.";
  const double fwd0 = m(g0 + "forward", us), bwd0 = m(g0 + "backward", us);
  const double ops0 = m(g0 + "counts.forward.aten_top", us), kern0 = m(g0 + "counts.backward.kernels", us);
  c.forward_op_us = fwd0 * 1e3 / ops0;
  c.backward_kernel_us = bwd0 * 1e3 / kern0;
  // Checkpointing every block: what the forward gains per region; what the backward gains per region beyond
  // the recomputed forward's ops (at forward_op_us each).
  const double blocks = 24;
  const double fwd1 = m(g1 + "forward", us), bwd1 = m(g1 + "backward", us);
  const double block_ops = (ops0 - m("tiny_gpt_step.blocks12_ckpt0.counts.forward.aten_top", us)) / 12;
  c.checkpoint_forward_us = std::max(0.0, (fwd1 - fwd0) * 1e3 / blocks);
  c.checkpoint_backward_us = std::max(0.0, (bwd1 - bwd0) * 1e3 / blocks - block_ops * c.forward_op_us);
  c.adam_tensor_us = m("optimizer_step.adamw_fused.us_per_tensor", us);
  c.adam_step_us = std::max(0.0, m("optimizer_step.adamw_fused.us_fixed", any));
  // zero_grad(set_to_none=True) after the step: the tiny GPT's zero_grad phase over its parameter tensors.
  c.zero_grad_tensor_us = m(g0 + "zero_grad", us) * 1e3 / m(g0 + "parameters", us);
  // Decode: the tiny Llama-like loop's host time per token over its ops per token.
  c.nograd_op_us = m("decode.layers28.token_wall_us", us) / m("decode.layers28.aten_top_per_token", us);
  if (dist) {
    auto d = [&](const std::string& path, const NumberRule& rule) { return at(*dist, path, dist_path, rule); };
    // The tiny GPT's whole step under each wrapper against none (the same process group, no checkpointing).
    const double single = d("tiny_gpt_step.single_ckpt0.step", us);
    const double tensors = 24 * 12 + 4;  // its parameter tensors: 12 per GPT-2 block; wte, wpe, ln_f's two
    c.ddp_param_us = std::max(0.0, (d("tiny_gpt_step.ddp_ckpt0.step", us) - single) * 1e3 / tensors);
    // FSDP2: per module a + b x tensors. The chain's modules (nn.Linear: 2 tensors) give a + 2b; the tiny
    // GPT's 25 modules (24 blocks of 12 tensors, the root of 4) give 25 a + 292 b.
    const double chain = d("fsdp2_chain.added_us_per_module.step", us);
    const double gpt = (d("tiny_gpt_step.fsdp2_ckpt0.step", us) - single) * 1e3;
    c.fsdp2_param_us = std::max(0.0, (gpt - 25 * chain) / (tensors - 50));
    c.fsdp2_module_us = std::max(0.0, chain - 2 * c.fsdp2_param_us);
    // Where it falls: the tiny GPT's phases (each timed to the GPU's end) under FSDP2 against none.
    double added[3], total = 0;
    const char* phase[3] = {"forward", "backward", "optimizer"};
    for (int i = 0; i < 3; ++i) {
      added[i] = std::max(0.0, d(std::string("tiny_gpt_step.fsdp2_ckpt0.") + phase[i], us) -
                                   d(std::string("tiny_gpt_step.single_ckpt0.") + phase[i], us));
      total += added[i];
    }
    if (total > 0) c.fsdp2_forward_share = added[0] / total, c.fsdp2_optimizer_share = added[2] / total;
  }
  c.source = "probe " + micro_path + (dist ? " + " + dist_path : std::string());
  return c;
}

HostCosts read_host_probe(const std::string& path) {
  const ordered_json micro = read_json_file(path);
  const std::string dist_path = (std::filesystem::path(path).parent_path() / "host_probe_dist.json").string();
  if (file_kind(dist_path) == "missing") return host_costs_from_probe(micro, path, nullptr, "");
  const ordered_json dist = read_json_file(dist_path);
  return host_costs_from_probe(micro, path, &dist, dist_path);
}

bool read_host_probe_offload(const std::string& micro_path, HostSpec& h) {
  const std::string path = (std::filesystem::path(micro_path).parent_path() / "host_probe_offload.json").string();
  if (file_kind(path) == "missing") return false;
  const ordered_json j = read_json_file(path);
  const NumberRule rate = rules::positive_up_to(1e15);
  h.cpu_adam_params_per_s = at(j, "cpu_adamw_fused.params_per_s", path, rate);
  h.cpu_cast_params_per_s = at(j, "cpu_cast_fp32_bf16.params_per_s", path, rate);
  h.h2d_bytes_per_s = at(j, "pinned_copy.h2d_bytes_per_s", path, rate);
  h.d2h_bytes_per_s = at(j, "pinned_copy.d2h_bytes_per_s", path, rate);
  h.source = "probe " + path;
  return true;
}

HostCosts scaled_host_costs(const HostCosts& c, double factor) {
  HostCosts s = c;
  for (double* x : {&s.forward_op_us, &s.backward_kernel_us, &s.checkpoint_forward_us, &s.checkpoint_backward_us,
                    &s.ddp_param_us, &s.fsdp2_module_us, &s.fsdp2_param_us, &s.adam_step_us, &s.adam_tensor_us,
                    &s.zero_grad_tensor_us, &s.nograd_op_us})
    *x *= factor;
  if (factor != 1) s.source += " x " + std::to_string(factor).substr(0, 6) + " (the host's speed re-probed)";
  return s;
}

EagerOps& EagerOps::operator+=(const EagerOps& o) {
  forward_ops += o.forward_ops, backward_kernels += o.backward_kernels, backward_nodes += o.backward_nodes;
  return *this;
}

namespace {

// An nn.Linear: one op forward. Backward nodes: the GEMM's (addmm/mm), the transposed weight's, the input's
// view to 2-D and the output's view back, and per autocast cast (the weight, the bias, an fp32 input) its
// ToCopyBackward; kernels: the input- and weight-gradient GEMMs, the bias gradient's reduction, each cast's
// gradient cast back.
void add_linear(EagerOps& o, bool autocast, bool bias, bool fp32_input) {
  o.forward_ops += 1;
  const double casts = autocast ? 1 + (bias ? 1 : 0) + (fp32_input ? 1 : 0) : 0;
  o.backward_nodes += 4 + casts;
  o.backward_kernels += 2 + (bias ? 1 : 0) + casts;
}

// `n` ops with a node each whose backward launches `kernels` kernels each (0 for views).
void add_ops(EagerOps& o, double n, double kernels) {
  o.forward_ops += n;
  o.backward_nodes += n;
  o.backward_kernels += n * kernels;
}

// A norm: LayerNorm one op (backward: the input's gradient, the weight's and bias's); an eager RMSNorm
// eight (float, pow, mean, add, rsqrt, mul, cast back, scale), their backward kernels (pow, mean's expand,
// rsqrt, the muls' two gradients each, the cast).
void add_norm(EagerOps& o, const ModelShape& m) {
  if (m.norm == NormKind::kRmsNorm) {
    add_ops(o, 8, 0);
    o.backward_kernels += 10;
  } else {
    add_ops(o, 1, 2);
  }
}

}  // namespace

double block_parameter_tensors(const ModelShape& m) {
  const double norm = m.norm == NormKind::kLayerNorm ? 2 : 1;
  const bool fused_qkv = m.learned_positions;
  double t = 2 * norm + static_cast<double>(m.block_linears().size()) - (fused_qkv ? 2 : 0);
  if (m.attention_bias) t += fused_qkv ? 2 : 4;
  if (m.mlp_bias) t += m.mlp == MlpKind::kSwiGlu ? 3 : 2;
  return t;
}

double ends_parameter_tensors(const ModelShape& m) {
  const double norm = m.norm == NormKind::kLayerNorm ? 2 : 1;
  return 1 + (m.learned_positions ? 1 : 0) + norm + (m.tied_embeddings ? 0 : 1);
}

double parameter_tensors(const ModelShape& m) {
  return block_parameter_tensors(m) * m.num_layers + ends_parameter_tensors(m);
}

EagerOps eager_block_ops(const ModelShape& m, bool autocast) {
  EagerOps o;
  const bool gpt2 = m.learned_positions;  // GPT-2's code: fused c_attn, no rotary
  add_norm(o, m);
  // Norms run in fp32 under autocast: the projections after them cast their input too.
  if (gpt2) {
    add_linear(o, autocast, m.attention_bias, autocast);
    add_ops(o, 5, 0);         // view to (b, n, 3, heads, d), unbind, three transposes
    o.backward_kernels += 1;  // unbind's backward stacks the three gradients
  } else {
    for (int i = 0; i < 3; ++i) add_linear(o, autocast, m.attention_bias, autocast);
    add_ops(o, 6, 0);   // q, k, v: view and transpose each
    add_ops(o, 4, 0);   // rotate_half's two slices of q and of k
    add_ops(o, 10, 1);  // per q and k: neg, cat, two muls, the add
    o.backward_kernels += 4;  // the slices' gradients (zeros, copy) ...
    if (m.num_kv_heads < m.num_heads) {
      add_ops(o, 2, 0);  // the GQA repeat of k and v: expand
      add_ops(o, 2, 1);  // and its copy (backward: the sum over the group)
    }
  }
  add_ops(o, 1, 4);  // SDPA (fused backward: dq's memset, dot(do, o), the kernel, dq's conversion)
  add_ops(o, 1, 0);  // the output's transpose
  add_ops(o, 1, 0);  // its reshape copy (the backward's is a view)
  add_linear(o, autocast, m.attention_bias, false);
  add_ops(o, 1, autocast ? 1 : 0);  // residual add (under autocast the branch's gradient cast to 16 bits)
  add_norm(o, m);
  if (m.mlp == MlpKind::kSwiGlu) {
    add_linear(o, autocast, m.mlp_bias, autocast);  // gate
    add_linear(o, autocast, m.mlp_bias, autocast);  // up
    add_ops(o, 1, 1);                               // silu
    add_ops(o, 1, 2);                               // mul: both gradients
  } else {
    add_linear(o, autocast, m.mlp_bias, autocast);
    add_ops(o, 1, 1);  // GELU
  }
  add_linear(o, autocast, m.mlp_bias, false);
  add_ops(o, 1, autocast ? 1 : 0);  // residual add
  o.backward_kernels += 2;          // the residual stream's gradient sums at the two branch points
  o.backward_nodes += block_parameter_tensors(m);  // AccumulateGrad (set_to_none: taken over, no kernel)
  return o;
}

EagerOps eager_ends_ops(const ModelShape& m, bool autocast) {
  EagerOps o;
  add_ops(o, 1, 5);  // embedding (backward: embedding_dense_backward's sort, counts and scatter)
  if (m.learned_positions) {
    add_ops(o, 1, 2);  // wpe[:n] (backward: zeros and the slice's copy)
    add_ops(o, 1, 0);  // + positions
  } else {
    o.forward_ops += 8;  // the rotary table (arange, outer, cat, cos, sin, casts): no gradient
  }
  add_norm(o, m);
  add_linear(o, autocast, false, autocast);  // LM head (the tied table or its own)
  add_ops(o, 1, 1);                          // logits.float()
  add_ops(o, 2, 0);                          // the (tokens, vocab) and target views
  add_ops(o, 1, 2);                          // F.cross_entropy (log_softmax, nll_loss)
  if (m.tied_embeddings) o.backward_kernels += 1;  // the table's two gradients summed
  o.backward_nodes += ends_parameter_tensors(m);   // AccumulateGrad
  return o;
}

HostStep eager_training_host(const ModelShape& m, const TrainingHostSetup& s, const HostCosts& c) {
  const EagerOps block = eager_block_ops(m, s.autocast), ends = eager_ends_ops(m, s.autocast);
  const double L = m.num_layers;
  const double regions = s.checkpoint_every > 0 ? std::floor(L / s.checkpoint_every) : 0;
  HostStep h;
  h.forward_ms = (L * block.forward_ops + ends.forward_ops) * c.forward_op_us * 1e-3;
  h.backward_ms = (L * block.backward_kernels + ends.backward_kernels) * c.backward_kernel_us * 1e-3;
  h.recompute_ms = regions * (block.forward_ops * c.forward_op_us + c.checkpoint_backward_us) * 1e-3;
  h.forward_ms += regions * c.checkpoint_forward_us * 1e-3;
  h.backward_ms += h.recompute_ms;
  const double tensors = parameter_tensors(m);
  if (s.wrapper == DataParallelWrapper::kDdp) h.wrapper_ms = tensors * c.ddp_param_us * 1e-3;
  if (s.wrapper == DataParallelWrapper::kFsdp2)
    h.wrapper_ms = ((L + 1) * c.fsdp2_module_us + tensors * c.fsdp2_param_us) * 1e-3;
  h.optimizer_ms = (c.adam_step_us + tensors * (c.adam_tensor_us + c.zero_grad_tensor_us)) * 1e-3;
  if (s.wrapper == DataParallelWrapper::kFsdp2) {
    // Its pre/post-forward hooks in the forward, its optimizer over DTensors once per step, the rest (the
    // backward's all-gathers and reduce-scatters) in the backward.
    h.forward_ms += h.wrapper_ms * c.fsdp2_forward_share;
    h.optimizer_ms += h.wrapper_ms * c.fsdp2_optimizer_share;
    h.backward_ms += h.wrapper_ms * (1 - c.fsdp2_forward_share - c.fsdp2_optimizer_share);
  } else {
    h.backward_ms += h.wrapper_ms;  // DDP's per-parameter hooks and bucket copies run in the backward
  }
  return h;
}

double host_ahead_step_ms(const double* host_ms, const double* gpu_ms, int phases) {
  double h = 0, g = 0;
  for (int i = 0; i < phases; ++i) {
    h += host_ms[i];
    g = std::max(g + gpu_ms[i], h);
  }
  return g;
}

double hf_decode_ops_per_layer(const ModelShape& m) {
  const double views = 6 + (m.learned_positions ? 0 : 4) + (m.num_kv_heads < m.num_heads ? 4 : 0) + 1 + 1;
  return hf_decode_kernels_per_layer(m) + views;
}

double hf_decode_ops_per_step(const ModelShape& m) { return hf_decode_kernels_per_step(m) + 4; }

}  // namespace hetplan
