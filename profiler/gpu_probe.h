// GPU probe: what converts a profile between GPUs (sim/layer_time_model.h),
// measured on this GPU, or on it restricted to N SMs (an emulated type,
// profiler/green_context.h):
//   gemm       achieved TFLOP/s of square m x m x m matmuls against m, per
//              precision (bf16, fp16, fp32);
//   memory     achieved TB/s of a streaming kernel (read + write) against the
//              bytes it streams;
//   launch     per-kernel cost of tiny kernels: the host's time to issue one
//              in eager mode, the device's time per kernel when they queue,
//              and per kernel replayed from a CUDA graph (whole GPU only).
// Written as gpu_probe.<TYPE>.json into a profile folder (`hetplan gpu-probe
// --out DIR --device-type TYPE`), where `gen-profiles --from` reads it.
// Every part that fails records its error instead of stopping the probe.
// REQUIRES a CUDA device and build (else InputError). Thread-safety: call on
// one thread; it changes the thread's current CUDA stream while it runs.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "base/json_util.h"

namespace hetplan::profiler {

struct GpuProbeOptions {
  std::vector<int64_t> gemm_sizes{256, 512, 1024, 2048, 4096, 8192};
  std::vector<std::string> precisions{"bf16", "fp16", "fp32"};
  std::vector<int64_t> copy_mb{8, 32, 128, 1024};
  int iters = 10;
  bool launch = true;  // the launch-latency part
};

// The probe's record for `device` restricted to `sms` SMs (0: the whole GPU).
ordered_json probe_gpu(torch::Device device, int sms, const GpuProbeOptions& options);

}  // namespace hetplan::profiler
