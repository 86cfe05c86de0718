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
