// HostMeter: what ZeRO-Offload's cost (sim/offload.h) needs of the machine
// `hetplan profile` runs on, measured there:
//  - pinned host-to-device and device-to-host bandwidth per GPU, every local
//    GPU copying at once (ranks of one host share its memory and PCIe root);
//  - CPU Adam throughput of the whole host (all threads): a single-pass Adam
//    over fp32 parameter, gradient and both moments writing a 16-bit copy,
//    the work and memory traffic of DeepSpeed's cpu_adam (30 bytes per
//    parameter), compiled by us (vectorised by the compiler, not DeepSpeed's
//    hand-written AVX: a lower bound on its speed).
// Recorded as the "host" section of <profile folder>/whatif_calibration.json
// (sim/whatif.h reads it). The copies need CUDA LibTorch (HETPLAN_TORCH_CUDA);
// a CPU-only build records them as not measured.
// Thread-safety: call from one thread (it starts and joins its own).
#pragma once

#include <cstdint>
#include <string>

namespace hetplan::profiler {

struct HostMeasurement {
  double h2d_gbs = -1, d2h_gbs = -1;  // slowest GPU's GB/s with all copying at once; -1: not measured
  int gpus = 0;
  double cpu_adam_params_per_s = -1;
  int threads = 0;
  std::string note;  // why copies were not measured, if they were not
};

// `cuda`: measure the copies on every visible GPU. `copy_bytes` per copy, `adam_params` parameters.
HostMeasurement measure_host(bool cuda, int64_t copy_bytes = int64_t{1} << 30, int64_t adam_params = int64_t{1} << 26);

// Writes m into `path` (whatif_calibration.json) as its "host" section, keeping any other section the
// file has. Throws InputError if an existing file is not a JSON object.
void write_host_calibration(const HostMeasurement& m, const std::string& path, const std::string& device);

}  // namespace hetplan::profiler
