// Analytic profiles: a Metis-format profile set estimated from GPU datasheet
// numbers, so that a fresh checkout can plan with no measured data.
//
// Each layer's forward+backward time is the layer time model
// (sim/layer_time_model.h) on the catalogue's rates: the layer's GEMMs one by
// one at the achieved FLOP/s for their size, fused attention, memory-bound
// elementwise traffic, Megatron's tensor-parallel all-reduces over the link,
// and the launch floor (kernel count x host time per kernel). Memory follows
// the rules measured profiles show: mixed-precision Adam state
// (state_bytes_per_parameter per parameter of the rank's shard), the
// activations a micro-batch stores (sim/memory_model.h, fused attention by
// default as every current framework runs it, vocab-parallel fp32 logits)
// and each layer's transient working set. The files record the model shape
// they were made for ("model", as `hetplan profile` writes it: search and
// simulate refuse shape flags that disagree) and an "estimate" block that
// says they are not measured.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/layer_time_model.h"
#include "sim/model_config.h"
#include "sim/model_shape.h"

namespace hetplan {

struct AnalyticOptions {
  ModelConfig model;                // GPT shape (num_layers counts the embedding and the head), when no `shape`
  std::optional<ModelShape> shape;  // a Hugging Face config's shape (gen-profiles --hf-config)
  long long sequence_length = 0;    // with `shape`; 0: model.sequence_length
  std::vector<std::string> device_types{"A100", "V100"};
  int max_tp = 8;
  int max_bs = 128;
  double compute_efficiency = RateDefaults{}.gemm_efficiency;  // achieved fraction of peak on large GEMMs
  double memory_efficiency = RateDefaults{}.memory_efficiency; // achieved fraction of HBM bandwidth
  // Megatron's sequence parallelism in the time (tp > 1): the norms, dropouts and residual adds on 1/tp of
  // the tokens (LayerKernels). Memory stays the files' no-SP rule: the simulator applies a plan's SP to it.
  bool sequence_parallel = false;
  bool flash_attention = true;      // false: no fused attention: the a s^2 score tensors are stored, and the
                                    // time pays their HBM traffic (AttentionKernels::kMaterialized)
  // Megatron-LM's kernel options of its linear layers (LayerKernels; today's Megatron-LM has both on):
  // false: as --no-async-tensor-model-parallel-allreduce / --no-gradient-accumulation-fusion run.
  bool async_tp_backward = true;
  bool gradient_accumulation_fusion = true;
  // Where gradients accumulate (LayerKernels::main_grads): a 16-bit main gradient by default.
  MainGrads main_grads = MainGrads::k16Bit;
  // hetplan's per-layer extensions (forward split, gradient accumulation, host floor, kernel classes,
  // activation/working split); false: Metis's keys only (and the model record), the form of files that lack
  // them, which the simulator prices by its fallback rules.
  bool extensions = true;
};

// The shape and sequence length the options describe.
ModelShape analytic_shape(const AnalyticOptions& options, long long* seq);

// Writes DeviceType.<TYPE>_tp<T>_bs<B>.json for T, B in 1, 2, 4, ... up to
// the limits (tp only where it divides the heads, kv heads, ffn and vocab).
// Returns the file names written. Throws InputError for a device type
// without a spec.
std::vector<std::string> generate_analytic_profiles(const AnalyticOptions& options, const std::string& out_dir);

}  // namespace hetplan
