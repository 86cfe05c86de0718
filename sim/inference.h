// Inference what-if: time to first token, per-token decode latency, tokens/s,
// and weights and KV-cache memory of one model on one GPU, for bf16/fp16
// weights or weight-only INT8/INT4 (NF4, or AWQ-style group-wise).
//
// A roofline over the catalogue's HBM bandwidth and dense peak
// (sim/gpu_specs.h), each at an achieved efficiency:
//  - prefill (the first token): the prompt's forward FLOPs (linear layers,
//    attention scores with the causal half skipped, the LM head of the last
//    token) at the 16-bit peak x compute efficiency, or the weights' bytes
//    at the HBM bandwidth, whichever is longer;
//  - decode (each later token, the batch at once): every weight byte and
//    the KV cache read once per step (bytes over bandwidth x HBM
//    efficiency), or the step's FLOPs, whichever is longer. Weight-only
//    quantisation dequantises inside the kernel (AWQ/Marlin/bitsandbytes
//    GEMV): the weights' packed bytes move; the GEMMs run at the 16-bit peak.
// The per-token latency is the mean over the output (the KV cache grows
// from prompt to prompt + output tokens).
// The runtime (sim/runtime_overheads.h, InferenceSetup::launch): Hugging Face
// `generate` runs the decoder eagerly, kernel by kernel from Python; a
// graph-captured decoder (CUDA graphs, torch.compile's reduce-overhead)
// replays the step's kernels without the host. The step has
// hf_decode_kernels_per_layer x layers + hf_decode_kernels_per_step kernels
// (or kernels_per_layer x layers where a calibration counted them):
//  - graphs: every kernel takes the GPU's per-kernel floor (the replayed
//    graph's gap before it, its ramp and drain) on top of its bytes: the
//    small kernels (norms, rotary, residual adds, KV-cache writes, softmax,
//    casts) are about all floor, the streamed GEMVs pay it beside their bytes
//    at the streaming rate: kernels x the graph floor is added to the
//    roofline step;
//  - eager: the GPU waits on the host, which issues every kernel at its
//    per-op time: the step takes max(that graph step, kernels x eager op time).
// Mechanisms an implementation adds to the decode step (each off by default,
// set from a calibration that measured them separately, or by flags):
//  - a materialised GQA repeat (HF transformers' repeat_kv in eager/SDPA
//    attention): each layer's K and V are expanded to num_heads before the
//    attention reads them, so the step also writes and reads the expanded
//    copy: 2 x num_heads / num_kv_heads times the layer's KV bytes more;
//  - a static KV cache (preallocated to prompt + output, masked): the
//    attention reads the whole allocated cache every step, not the context;
//  - the attention's own HBM efficiency (attention_hbm_efficiency): the KV
//    bytes above move at that fraction of the bandwidth (an unfused repeat,
//    mask and softmax stream worse than a GEMV); 0: hbm_efficiency;
//  - a per-row dequantisation cost of int4 kernels (tinygemm-style kernels
//    dequantise the weight tile for each row block, so their time grows with
//    the batch): batch x the projections' parameters / int4_row_params_per_s. The efficiencies default to
// stated values and are replaced by a profile's measurements
// (WhatifCalibration, sim/whatif.h) where present.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "sim/gpu_specs.h"
#include "sim/memory_model.h"
#include "sim/model_shape.h"
#include "sim/runtime_overheads.h"

namespace hetplan {

enum class WeightFormat { kBf16, kFp16, kInt8, kInt4Nf4, kInt4Awq };
const char* to_string(WeightFormat f);
// "bf16", "fp16", "int8", "nf4" (or "int4"), "awq"; throws InputError naming `where`.
WeightFormat parse_weight_format(const std::string& s, const std::string& where);
// Bits per weight of the projections, constants included.
QuantSpec weight_quant(WeightFormat f);

// Defaults where no profile measured them.
inline constexpr double kDefaultDecodeHbmEfficiency = 0.75;    // of the datasheet bandwidth, streaming reads
inline constexpr double kDefaultPrefillComputeEfficiency = 0.6;  // of the dense 16-bit peak

struct InferenceSetup {
  WeightFormat weights = WeightFormat::kBf16;
  int batch = 1;
  int prompt = 512;
  int output = 128;
  double hbm_efficiency = kDefaultDecodeHbmEfficiency;
  double compute_efficiency = kDefaultPrefillComputeEfficiency;
  double framework_bytes = 1024.0 * 1024 * 1024;  // CUDA context and workspaces
  LaunchModel launch;               // eager (HF generate's default) or CUDA graphs, and the per-kernel floors
  double kernels_per_layer = 0;     // decode kernels per step / layers (measured); 0: the HF eager count
  bool kv_repeat_materialised = false;
  bool static_kv_cache = false;
  double attention_hbm_efficiency = 0;  // 0: hbm_efficiency
  double int4_row_params_per_s = 0; // 0: no per-row dequantisation cost (int4 formats only)
  // Whether the streamed GEMV kernels (and the LM head) pay the per-kernel floor beside their bytes; false
  // only where hbm_efficiency was measured with their floor inside it (an older calibration).
  bool streamed_kernels_pay_floor = true;
  std::vector<std::string> assumptions;
};

struct InferenceResult {
  std::string name;
  bool offered = true;
  std::string not_offered;
  double ttft_ms = 0, decode_ms_per_token = 0, tokens_per_s = 0;  // tokens_per_s: the batch's generated tokens
  double weights_bytes = 0, kv_cache_bytes = 0, activation_bytes = 0, framework_bytes = 0;
  double total_bytes() const { return weights_bytes + kv_cache_bytes + activation_bytes + framework_bytes; }
  double capacity_bytes = 0;
  bool fits = false;
  std::vector<std::string> assumptions;
};

// Bytes of one token's KV cache: K and V of every block, 16-bit.
double kv_cache_bytes_per_token(const ModelShape& m);

// REQUIRES: batch, prompt, output >= 1.
InferenceResult cost_inference(const ModelShape& m, const GpuSpec& g, const InferenceSetup& s, double capacity_gb = 0);

}  // namespace hetplan
