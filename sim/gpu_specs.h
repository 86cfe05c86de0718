// GpuSpec: datasheet numbers of the GPUs hetplan can estimate without
// measuring. Dense (no sparsity) tensor-core peak for bf16, or fp16 where
// the chip has no bf16 (V100).
#pragma once

#include <string>
#include <vector>

namespace hetplan {

struct GpuSpec {
  std::string name;
  double peak_tflops;         // dense bf16/fp16 tensor-core TFLOP/s
  double memory_gb;           // HBM per GPU
  double memory_bw_gbs;       // HBM bandwidth, GB/s
  double nvlink_gbs;          // per-direction NVLink bandwidth, GB/s
};

// A100 SXM 80GB, V100 SXM2 32GB, H100 SXM 80GB, H200 SXM 141GB.
const std::vector<GpuSpec>& gpu_specs();
// nullptr if unknown.
const GpuSpec* find_gpu_spec(const std::string& name);

}  // namespace hetplan
