#include "sim/runtime_overheads.h"

#include <cstdio>

#include "base/input_error.h"

namespace hetplan {

const char* to_string(LaunchRuntime r) { return r == LaunchRuntime::kEager ? "eager" : "graphs"; }

LaunchRuntime parse_launch_runtime(const std::string& s, const std::string& where) {
  if (s == "eager") return LaunchRuntime::kEager;
  if (s == "graphs") return LaunchRuntime::kGraphs;
  throw InputError(where + ": '" + excerpt(s) + "': expected eager or graphs");
}

std::string LaunchModel::describe() const {
  char buf[96];
  if (runtime == LaunchRuntime::kEager)
    std::snprintf(buf, sizeof buf, "eager (%.2f us/op host floor)", eager_op_us);
  else
    std::snprintf(buf, sizeof buf, "CUDA graphs (%.2f us/kernel floor)", graph_kernel_us);
  return buf;
}

double launch_bound_s(const LaunchModel& launch, double gpu_s, double kernels) {
  return std::max(gpu_s, kernels * launch.floor_s());
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
  return d.model && !d.gradient_as_bucket_view ? gradient_bytes : 0.0;
}

}  // namespace hetplan

// ---------------------------------------------------------------- the host's side of an eager step

namespace hetplan {

EagerOps& EagerOps::operator+=(const EagerOps& o) {
  kernel_ops += o.kernel_ops, view_ops += o.view_ops, linears += o.linears, sdpa += o.sdpa, modules += o.modules;
  backward_nodes += o.backward_nodes, backward_kernels += o.backward_kernels;
  return *this;
}

namespace {

// An nn.Linear: forward one call (linear_us covers the module, autocast's casts and the GEMM). Backward nodes:
// the GEMM's (addmm/mm), the transposed weight's, the input's view to 2-D and the output's view back, and per
// autocast cast (the weight, the bias, an fp32 input) its ToCopyBackward; kernels: the input- and
// weight-gradient GEMMs, the bias gradient's reduction, each cast's gradient cast back.
void add_linear(EagerOps& o, bool autocast, bool bias, bool fp32_input) {
  o.linears += 1;
  const double casts = autocast ? 1 + (bias ? 1 : 0) + (fp32_input ? 1 : 0) : 0;
  o.backward_nodes += 4 + casts;
  o.backward_kernels += 2 + (bias ? 1 : 0) + casts;
}

// A norm module: LayerNorm one op (backward: one node, the input's and the affine parameters' gradient
// kernels); an eager RMSNorm eight (float, pow, mean, add, rsqrt, mul, cast back, scale), each a node, and
// their backward kernels (pow, mean's expand, rsqrt, the two muls' two gradients each, the cast).
void add_norm(EagerOps& o, const ModelShape& m) {
  o.modules += 1;
  if (m.norm == NormKind::kRmsNorm) {
    o.kernel_ops += 8;
    o.backward_nodes += 8;
    o.backward_kernels += 10;
  } else {
    o.kernel_ops += 1;
    o.backward_nodes += 1;
    o.backward_kernels += 2;
  }
}

// `n` ops that launch a kernel each, each with its backward node launching `bwd_kernels` kernels.
void add_kernel_ops(EagerOps& o, double n, double bwd_kernels) {
  o.kernel_ops += n;
  o.backward_nodes += n;
  o.backward_kernels += n * bwd_kernels;
}

// `n` views: an op each, a node each, no kernel.
void add_views(EagerOps& o, double n) {
  o.view_ops += n;
  o.backward_nodes += n;
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
  o.modules += 1;                          // the block
  add_norm(o, m);
  // The norm's output is fp32 under autocast (norms run in fp32): the projections after it cast their input.
  if (gpt2) {
    add_linear(o, autocast, m.attention_bias, autocast);
    add_views(o, 5);  // view to (b, n, 3, heads, d), unbind, three transposes
    o.backward_kernels += 1;  // unbind's backward stacks the three gradients
  } else {
    for (int i = 0; i < 3; ++i) add_linear(o, autocast, m.attention_bias, autocast);
    add_views(o, 6);  // q, k, v: view and transpose each
    // Rotary on q and k: two slices (views), then neg, cat, two muls and the add (kernels).
    add_views(o, 4);
    add_kernel_ops(o, 10, 1);
    o.backward_kernels += 2 * 2;  // the slices' backward (zeros and copy) ...
    if (m.num_kv_heads < m.num_heads) {  // the GQA repeat of k and v: expand (view) and the copy
      add_views(o, 2);
      add_kernel_ops(o, 2, 1);
    }
  }
  o.sdpa += 1;
  o.backward_nodes += 1;
  o.backward_kernels += 3;  // fused attention backward: preprocess, the kernel, dq's conversion
  add_views(o, 1);          // the output's transpose
  add_kernel_ops(o, 1, 0);  // its reshape copy (the backward's is a view)
  add_linear(o, autocast, m.attention_bias, false);
  add_kernel_ops(o, 1, autocast ? 1 : 0);  // residual add (under autocast the branch's gradient cast to 16 bits)
  add_norm(o, m);
  if (m.mlp == MlpKind::kSwiGlu) {
    add_linear(o, autocast, m.mlp_bias, autocast);  // gate
    add_linear(o, autocast, m.mlp_bias, autocast);  // up
    add_kernel_ops(o, 1, 1);                        // silu
    add_kernel_ops(o, 1, 2);                        // mul: both gradients
  } else {
    add_linear(o, autocast, m.mlp_bias, autocast);
    add_kernel_ops(o, 1, 1);  // GELU
  }
  add_linear(o, autocast, m.mlp_bias, false);
  add_kernel_ops(o, 1, autocast ? 1 : 0);  // residual add
  o.backward_kernels += 2;                 // the residual stream's two gradient sums
  // AccumulateGrad per parameter (set_to_none: the gradient is taken over, no kernel).
  o.backward_nodes += block_parameter_tensors(m);
  return o;
}

EagerOps eager_ends_ops(const ModelShape& m, bool autocast) {
  EagerOps o;
  o.modules += 1;                      // the model
  add_kernel_ops(o, 1, 4);             // embedding (backward: embedding_dense_backward's sort and scatter)
  if (m.learned_positions) {
    add_views(o, 1);                   // wpe[:n]
    add_kernel_ops(o, 1, 0);           // + positions
    o.backward_kernels += 2;           // the slice's gradient (zeros, copy)
  } else {
    o.kernel_ops += 8;                 // the rotary table (arange, outer, cat, cos, sin, casts): no gradient
  }
  add_norm(o, m);
  add_linear(o, autocast, false, autocast);  // LM head (the tied table or its own)
  add_kernel_ops(o, 1, 1);             // logits.float()
  add_views(o, 2);                     // the (tokens, vocab) and target views
  add_kernel_ops(o, 2, 1);             // cross_entropy: log_softmax, nll_loss
  if (m.tied_embeddings) o.backward_kernels += 1;  // the table's two gradients summed
  o.backward_nodes += ends_parameter_tensors(m);  // AccumulateGrad
  return o;
}

double forward_host_us(const EagerOps& o, const HostCosts& c) {
  return o.kernel_ops * c.kernel_op_us + o.view_ops * c.view_op_us + o.linears * c.linear_us + o.sdpa * c.sdpa_us +
         o.modules * c.module_call_us;
}

double backward_host_us(const EagerOps& o, const HostCosts& c) {
  return o.backward_nodes * c.backward_node_us + o.backward_kernels * c.backward_kernel_us;
}

HostStep eager_training_host(const ModelShape& m, const TrainingHostSetup& s, const HostCosts& c) {
  HostCosts cc = c;
  if (!s.autocast) cc.linear_us = c.plain_linear_us;
  const EagerOps block = eager_block_ops(m, s.autocast), ends = eager_ends_ops(m, s.autocast);
  const double L = m.num_layers, mb = s.micro_batches;
  const double regions = s.checkpoint_every > 0 ? std::floor(L / s.checkpoint_every) : 0;
  HostStep h;
  h.forward_ms = mb * (L * forward_host_us(block, cc) + forward_host_us(ends, cc)) * 1e-3;
  h.backward_ms = mb * (L * backward_host_us(block, cc) + backward_host_us(ends, cc)) * 1e-3;
  h.recompute_ms = mb * regions * (forward_host_us(block, cc) + cc.checkpoint_region_us) * 1e-3;
  const double tensors = parameter_tensors(m);
  if (s.wrapper == DataParallelWrapper::kDdp) h.wrapper_ms = mb * tensors * cc.ddp_param_us * 1e-3;
  if (s.wrapper == DataParallelWrapper::kFsdp2) h.wrapper_ms = mb * (L + 1) * cc.fsdp2_module_us * 1e-3;
  const double per_tensor = s.wrapper == DataParallelWrapper::kFsdp2 && cc.dtensor_adam_tensor_us > 0
                                ? cc.dtensor_adam_tensor_us
                                : cc.adam_tensor_us;
  h.optimizer_ms = (cc.adam_step_us + tensors * per_tensor) * 1e-3;
  return h;
}

EagerOps hf_decode_ops_per_layer(const ModelShape& m) {
  EagerOps o;
  const double linears = m.learned_positions ? 4 : static_cast<double>(m.block_linears().size());
  const double sdpa = 1;
  o.linears = linears;
  o.sdpa = sdpa;
  o.kernel_ops = hf_decode_kernels_per_layer(m) - linears - sdpa;
  // Views: q, k, v view and transpose (GPT-2: the split's three views and transposes), rotate_half's two
  // slices of q and k, repeat_kv's index and expand of k and v, the mask's view, the output's transpose.
  o.view_ops = 6 + (m.learned_positions ? 0 : 4) + (m.num_kv_heads < m.num_heads ? 4 : 0) + 1 + 1;
  return o;
}

EagerOps hf_decode_ops_per_step(const ModelShape& m) {
  EagerOps o;
  o.linears = 1;  // the LM head
  o.kernel_ops = hf_decode_kernels_per_step(m) - 1;
  o.view_ops = 4;  // the last position's slice, the logits' and the token's views
  return o;
}

double nograd_host_us(const EagerOps& o, const HostCosts& c) {
  return o.kernel_ops * c.nograd_kernel_op_us + o.view_ops * c.nograd_view_op_us + o.linears * c.nograd_linear_us +
         o.sdpa * c.nograd_sdpa_us + o.modules * c.module_call_us;
}

}  // namespace hetplan
