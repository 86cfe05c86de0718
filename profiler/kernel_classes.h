// Kernel classes: each Metis layer's forward+backward time split into the
// classes that convert differently between GPUs (sim/layer_time_model.h reads
// them back and scales each):
//   gemm          the layer's matrix multiplies (forward, input and weight
//                 gradients), each timed alone at its exact shape: FLOP-bound;
//   attention     the fused causal attention, forward and backward, timed
//                 alone (FLOP-bound at training lengths);
//   communication the tensor-parallel all-reduces of activations (Megatron
//                 without sequence parallelism: 2 forward + 2 backward per
//                 block, 1 for the embedding, 1 for the head), timed alone;
//   elementwise   the rest of the layer's device time (norms, activations,
//                 residual adds, RoPE, dropout, cross-entropy, copies):
//                 memory-bound;
//   launch floor  the host time to issue the layer (layer_host_ms): where it
//                 exceeds the device time the GPU waits on the CPU.
// The device time comes from a pass whose queue was filled first
// (DeviceMeter::stall), so it never contains host gaps.
// Recomputation repeats the forward GEMMs (full) and attention (full,
// selective) in the backward: the classes count them as the layers ran them.
//
// Thread-safety: call on the rank's thread, the tp group's ranks together
// (the communication class runs collectives).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "base/json_util.h"
#include "profiler/gpt.h"
#include "profiler/device_meter.h"

namespace hetplan::profiler {

// One GEMM of a layer, per rank: (m x k) times (k x n), with its forward and its two gradients' time.
struct GemmShape {
  int64_t m = 0, k = 0, n = 0;
  int passes = 3;  // forward, input gradient, weight gradient (+1 forward with full recomputation)
  double ms = 0;   // measured: all passes
  double flops() const { return 2.0 * static_cast<double>(m) * k * n * passes; }
};

struct LayerClasses {
  std::vector<GemmShape> gemms;
  double gemm_ms = 0, attention_ms = 0, communication_ms = 0;
  double attention_flops = 0;  // causal-masked work is counted whole (ModelShape's count)
};

// The GEMMs of each Metis layer of `c` on tp ranks at micro-batch `bs` (ms not yet measured).
std::vector<LayerClasses> layer_gemm_shapes(const GPTConfig& c, int bs, int tp);

// Measures the gemm, attention and communication classes of each kind of
// layer (embedding, one block standing for all, head), `iters` times after
// `warmup`; medians.
std::vector<LayerClasses> measure_layer_classes(const GPTConfig& c, const TensorParallelGroup& g, int bs,
                                                torch::Device device, torch::Dtype dtype, int warmup, int iters,
                                                DeviceMeter& meter);

// The profile's execution_time.kernel_classes record: per layer the device
// time (`device_ms`), each class and the launch floor (`host_ms`), the
// elementwise class being device time minus the others (at least 0).
ordered_json kernel_classes_json(const std::vector<LayerClasses>& classes, const std::vector<double>& device_ms,
                                 const std::vector<double>& host_ms, const std::string& dtype_name);

}  // namespace hetplan::profiler
