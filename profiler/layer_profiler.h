// LayerProfiler: measures each Metis layer's forward+backward time and memory
// for one tensor-parallel group and a list of micro-batch sizes, and writes
// one DeviceType.<TYPE>_tp<T>_bs<B>.json per batch size (rank 0 writes).
//
// Timing: layers are run one at a time with their inputs detached, so each
// layer's forward and backward can be bracketed by device events; the whole
// model's forward+backward and the Adam step are timed too. After `warmup`
// iterations, `iters` are measured and the median is reported, with the
// spread (max - min over median) in extra fields. Beyond Metis's fields, each
// file records every layer's forward alone (layer_forward_ms), the in-place
// add that accumulates a layer's gradients over micro-batches
// (layer_grad_accumulation_ms), the host time to issue each layer
// (layer_host_ms), and, for tp > 1, the tp group's gradient all-reduce time
// and bus bandwidth ("communication"). With sustained_seconds > 0 it also
// runs the whole model's forward+backward back to back for about that long
// (a pass count the tp ranks agree on) and
// records the pace it settles at (sustained_forward_backward_ms): the burst
// timings above leave the GPU idle between passes, so they start at boost
// clocks that a GPU busy all the time cannot hold under its power limit.
// They hold them only for the first tens of ms of a pass: an H200 running
// GEMMs back to back keeps its boost for 40-80 ms and then slows ~16% to its
// power-capped pace, and 20 ms idle restores it (logs/greenctx_h200.md,
// round 7). So a pass longer than that (large layers at large bs) is
// partly at the capped pace already, and its burst and sustained timings
// come out close. With boost_idle_ms > 0 it also times each layer's forward
// and backward on its own, each after that much idle (layer_boost_ms): the
// boost-clock pace of every layer, however large (logs/greenctx_h200.md,
// round 8). The simulator does not read it.
// Memory: per layer, what MixedPrecisionAdam holds per parameter (weights,
// fp32 main gradients, fp32 masters unless fp32, Adam moments) + the
// allocator's peak over that layer's forward and backward, each gradient
// freed as soon as it is produced (replay adds it into its main gradient).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "profiler/gpt.h"
#include "base/json_util.h"

namespace hetplan::profiler {

struct ProfileRequest {
  GPTConfig model;
  std::vector<int> batch_sizes;
  int warmup = 3;
  int iters = 10;
  // Seconds of back-to-back whole-model forward+backward after the burst
  // measurement (0: skip), for the sustained, power-limited pace.
  double sustained_seconds = 0;
  // > 0: each layer's forward and backward also timed on its own after this many ms of idle
  // (layer_boost_ms): the GPU's boost-clock pace, which a chained pass of large layers does not hold.
  double boost_idle_ms = 0;
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;
  std::string dtype_name = "fp32";
  std::string device_type = "CPU";  // the DeviceType name written into file names
  std::string out_dir;
  // An emulated device type's SM partition (SmPartition::record(),
  // profiler/green_context.h), written as the profile's profiler.emulation;
  // null when the measurement had the whole device.
  ordered_json emulation;
};

struct BatchOutcome {
  int bs = 0;
  bool ok = false;
  std::string error;        // why it was skipped
  std::string path;         // the file written (rank 0)
  double block_ms = 0;      // median fwd+bwd of one transformer block
  double block_tflops = 0;  // achieved by that block
  double block_spread = 0;  // (max - min) / median over iterations
  double block_boost_ms = 0;  // its forward and backward each timed alone after idle (0: not measured)
};

// Profiles every batch size in order. An out-of-memory error skips that
// batch size and goes on; `on_outcome` sees each result as it comes.
std::vector<BatchOutcome> profile_batch_sizes(const ProfileRequest& req, const TensorParallelGroup& group,
                                              const std::function<void(const BatchOutcome&)>& on_outcome);

// FLOPs of one transformer block's forward+backward (3x forward, no recompute)
// per rank: 3 ModelShape::block_forward_flops_per_token(seq) b s / tp.
double block_flops(const GPTConfig& c, int bs, int tp);

}  // namespace hetplan::profiler
