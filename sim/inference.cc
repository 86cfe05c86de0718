#include "sim/inference.h"

#include <algorithm>
#include <cmath>

#include "base/input_error.h"
#include "sim/roofline.h"

namespace hetplan {

const char* to_string(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kFp16: return "fp16";
    case WeightFormat::kInt8: return "int8";
    case WeightFormat::kInt4Nf4: return "nf4";
    case WeightFormat::kInt4Awq: return "awq";
  }
  return "?";
}

WeightFormat parse_weight_format(const std::string& s, const std::string& where) {
  if (s == "bf16") return WeightFormat::kBf16;
  if (s == "fp16") return WeightFormat::kFp16;
  if (s == "int8") return WeightFormat::kInt8;
  if (s == "nf4" || s == "int4") return WeightFormat::kInt4Nf4;
  if (s == "awq") return WeightFormat::kInt4Awq;
  throw InputError(where + ": '" + excerpt(s) + "': expected bf16, fp16, int8, nf4 (or int4) or awq");
}

QuantSpec weight_quant(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBf16:
    case WeightFormat::kFp16: return bf16_weights();
    // Weight-only int8 with one fp16 scale per output row of 4096 (W8A16): 8.004 bits.
    case WeightFormat::kInt8: return QuantSpec{8, 4096, 16, 0, 0};
    case WeightFormat::kInt4Nf4: return nf4_double_quant();
    // AWQ (Lin et al. 2024): groups of 128 with an fp16 scale and a 4-bit zero point: 4 + 20/128 = 4.156 bits.
    case WeightFormat::kInt4Awq: return QuantSpec{4, 128, 20, 0, 0};
  }
  return bf16_weights();
}

double kv_cache_bytes_per_token(const ModelShape& m) {
  return 2.0 * static_cast<double>(m.num_layers) * m.num_kv_heads * m.head_dim * 2;  // K and V, 16-bit
}

InferenceResult cost_inference(const ModelShape& m, const GpuSpec& g, const InferenceSetup& s, double capacity_gb) {
  InferenceResult r;
  r.name = to_string(s.weights);
  r.assumptions = s.assumptions;
  const bool fp16 = s.weights == WeightFormat::kFp16;
  // The activations' 16-bit type: fp16 for fp16 weights, else bf16 where the chip has it, else fp16.
  const ComputePrecision act = fp16 || !g.supports(ComputePrecision::kBf16) ? ComputePrecision::kFp16
                                                                             : ComputePrecision::kBf16;
  if (s.weights == WeightFormat::kBf16 && !g.supports(ComputePrecision::kBf16)) {
    r.offered = false;
    r.not_offered = g.name + " has no bf16 (it supports " + g.supported() + ")";
    return r;
  }
  const Roofline roofline = make_roofline(g.peak_of(act), s.compute_efficiency, g.memory_bw_gbs, s.hbm_efficiency);
  const double L = m.num_layers, h = static_cast<double>(m.hidden_size), V = static_cast<double>(m.vocab_size);
  const double b = s.batch, P = s.prompt, O = s.output;

  // The projections' weights (the int4 per-row cost below is over these).
  const double lin_params = static_cast<double>(m.block_linear_weights()) * L;
  const double other_params = static_cast<double>(m.parameter_count()) - lin_params;
  const double quant_bits = weight_quant(s.weights).bits_per_param();
  r.weights_bytes = lin_params * quant_bits / 8 + other_params * 2;
  const double kv_per_token = kv_cache_bytes_per_token(m);
  r.kv_cache_bytes = kv_per_token * b * (P + O);
  // Prefill's working set: one layer's hidden states and MLP intermediates for the whole prompt, and the
  // last token's fp32 logits (generate keeps only those).
  r.activation_bytes = b * P * (4 * h + 2 * static_cast<double>(m.ffn_hidden_size)) * 2 + b * V * 4;
  r.framework_bytes = s.framework_bytes;
  r.capacity_bytes = (capacity_gb > 0 ? capacity_gb : g.memory_gb) * 1024.0 * 1024 * 1024;
  r.fits = r.total_bytes() <= r.capacity_bytes;

  const double linear_flops = L * m.linear_forward_flops_per_token();
  const double head_flops = m.head_forward_flops_per_token();
  const double attn_per_token_ctx = m.attention_forward_flops_per_token(1);  // QK^T and AV per context token
  // Prefill: causal attention over the prompt averages P/2 context tokens.
  const double prefill_flops = b * P * (linear_flops + L * attn_per_token_ctx * P / 2) + b * head_flops;
  const double prefill_bytes = r.weights_bytes + kv_per_token * b * P;  // (the whole table: small next to the FLOPs)
  r.ttft_ms = roofline.seconds(prefill_flops, prefill_bytes) * 1e3;
  // Decode: mean context over the output.
  const double ctx = P + O / 2;
  const double step_flops = b * (linear_flops + head_flops + L * attn_per_token_ctx * ctx);
  // Every weight byte (the LM head's too: the embedding table when tied, in other_params) and the KV cache.
  // An untied embedding table is not streamed: a step reads only the batch's rows of it.
  const double streamed = r.weights_bytes - (m.tied_embeddings ? 0.0 : V * h * 2);
  // The KV bytes the attention reads: the context (or the whole static cache), plus the expanded copy a
  // materialised GQA repeat writes and reads again.
  const double kv_len = s.static_kv_cache ? P + O : ctx;
  const double gqa = static_cast<double>(m.num_heads) / std::max<long long>(m.num_kv_heads, 1);
  const double kv_factor = 1 + (s.kv_repeat_materialised && gqa > 1 ? 2 * gqa : 0.0);
  const double kv_bytes = kv_per_token * b * kv_len * kv_factor;
  const double bw_attn = s.attention_hbm_efficiency > 0 ? achieved_bytes_per_s(g.memory_bw_gbs, s.attention_hbm_efficiency)
                                                        : roofline.bytes_per_s;
  double step_s = std::max(roofline.compute_s(step_flops), roofline.memory_s(streamed) + kv_bytes / bw_attn);
  const bool int4 = s.weights == WeightFormat::kInt4Nf4 || s.weights == WeightFormat::kInt4Awq;
  if (int4 && s.int4_row_params_per_s > 0) step_s += b * lin_params / s.int4_row_params_per_s;
  // The runtime's per-kernel floors (sim/runtime_overheads.h).
  const double kernels = s.kernels_per_layer > 0 ? s.kernels_per_layer * L
                                                 : hf_decode_kernels_per_layer(m) * L + hf_decode_kernels_per_step(m);
  // Every kernel pays the floor, the streamed GEMVs too: the floor is what a kernel costs beyond its bytes
  // (the replayed graph's gap before it, its blocks' ramp and drain), and the streamed bytes above are at the
  // steady streaming rate (a calibration's GEMV efficiency is measured net of these floors).
  const double streamed_kernels = m.block_linears().size() * L + 1;  // the projections' GEMVs, the LM head
  const double floored = s.streamed_kernels_pay_floor ? kernels : std::max(0.0, kernels - streamed_kernels);
  step_s += floored * s.launch.graph_kernel_us * 1e-6;
  if (s.launch.runtime == LaunchRuntime::kEager) {
    // The host issues every op of the step from Python (autograd off) and runs ahead of the GPU: the step is
    // max(the GPU's, the host's). A calibration's kernel count replaces the itemised kernels per layer.
    const double per_layer = s.kernels_per_layer > 0
                                 ? hf_decode_ops_per_layer(m) - hf_decode_kernels_per_layer(m) + s.kernels_per_layer
                                 : hf_decode_ops_per_layer(m);
    const double host_s = (L * per_layer + hf_decode_ops_per_step(m)) * s.launch.host.nograd_op_us * 1e-6;
    step_s = std::max(step_s, host_s);
  }
  r.decode_ms_per_token = step_s * 1e3;
  r.tokens_per_s = b / (r.decode_ms_per_token / 1e3);
  return r;
}

}  // namespace hetplan
