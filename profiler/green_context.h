// SmPartition: this process's LibTorch work on one GPU restricted to N of its
// SMs, through a CUDA green context: the way an emulated device type
// (sim/cluster.h, "device_types") runs, in `hetplan profile` and in each
// rank of `hetplan replay` whose type is emulated.
//
// How: the CUDA driver API, loaded at run time from libcuda.so.1 (dlopen;
// the build needs no CUDA driver header): cuDeviceGetDevResource gives the
// GPU's SMs, cuDevSmResourceSplitByCount cuts one group of at least N SMs,
// cuDevResourceGenerateDesc and cuGreenCtxCreate make a green context of it,
// and cuGreenCtxStreamCreate a stream in it, which is made LibTorch's current
// CUDA stream for the device (c10::cuda::getStreamFromExternal +
// setCurrentCUDAStream) on the constructing thread. The primary context stays
// current: memory, cuBLAS handles and NCCL communicators are the ordinary
// ones, only kernels launched on that stream are confined to the partition.
// LibTorch's autograd runs each backward op on the stream its forward op
// used, so the backward pass (on autograd's own thread) is confined too.
//
// The driver rounds N up to its partition granularity (documented as
// multiples of 8 SMs on H100/H200 with the default flags): granted_sms, read back from the green context, is what ran.
// N at or above the GPU's SM count runs on the whole GPU (no green context).
//
// What runs outside the partition (kOutsidePartition, recorded with every
// measurement): NCCL's kernels (collectives and p2p run on
// ProcessGroupNCCL's own streams of the primary context, on any SM); work any
// library issues on a stream of its own; copy-engine transfers (these use no
// SMs). The partition limits SMs only: HBM capacity and L2 are the whole
// GPU's (an emulated type has its base GPU's memory), and so is the power
// budget, so clocks may run higher than on a real GPU of that size. cuBLAS
// and other libraries pick kernels for the whole GPU's SM count.
//
// Lifetime: the green context and its stream are never destroyed (the caching
// allocator keeps blocks keyed by stream until the process exits; LibTorch
// leaks its own green-context streams the same way). The destructor waits for
// the stream and restores the thread's previous current stream.
// Thread-safety: construct, use and destroy on one thread; other threads keep
// their own current streams.
//
// A build without CUDA LibTorch compiles it to a refusal: the constructor
// throws InputError ("emulated device types need a CUDA build").
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "sim/cluster.h"
#include "base/json_util.h"

namespace hetplan::profiler {

// One sentence for records: what the partition does not confine.
extern const char* const kOutsidePartition;
// "HETPLAN_GREEN_CONTEXT_CURRENT": set to 1, the constructor also makes the
// green context the thread's current CUDA context (cuCtxFromGreenCtx +
// cuCtxSetCurrent), as torch.cuda.green_contexts' set_context does: events,
// streams, allocations and NCCL communicators made on this thread afterwards
// belong to it, so NCCL's kernels are confined to the partition too. An
// escape hatch should a driver refuse events of the primary context on the
// partition's stream; off by default.
extern const char* const kGreenContextCurrentEnv;

struct SmPartitionInfo {
  std::string device_type;  // the emulated type's name, e.g. "H200-33sm"
  std::string base;         // its declared base GPU, e.g. "H200"
  std::string device_name;  // the GPU's own name, e.g. "NVIDIA H200"
  int device_index = 0;
  int requested_sms = 0;
  int granted_sms = 0;      // SMs the kernels may use (the whole GPU's when no green context)
  int device_sms = 0;       // the GPU's SM count
  bool green_context = false;       // false: requested_sms >= device_sms, the whole GPU
  bool stream_verified = false;     // cuStreamGetGreenCtx named our green context
  bool green_context_current = false;  // kGreenContextCurrentEnv was 1
  int driver_version = 0;           // e.g. 13000
  bool base_matches_device = false; // device_name contains base
};

class SmPartition {
 public:
  // Restricts this thread's LibTorch kernels on `device` to `emulated.sms`
  // SMs. REQUIRES `device` to be CUDA. Throws InputError when the build has
  // no CUDA, the device is not CUDA or the driver refuses the split;
  // EnvironmentError when the driver cannot be loaded or started or lacks
  // green contexts (CUDA 12.4+ driver, cuGreenCtxStreamCreate 12.5+).
  SmPartition(torch::Device device, const std::string& device_type, const EmulatedDevice& emulated);
  ~SmPartition();
  SmPartition(const SmPartition&) = delete;
  SmPartition& operator=(const SmPartition&) = delete;

  const SmPartitionInfo& info() const { return info_; }
  // The record profiles and replay reports carry: base, requested, granted
  // and device SMs, how, and kOutsidePartition.
  ordered_json record() const;
  // One line for a terminal: "H200-33sm: H200 (NVIDIA H200, device 0) restricted to 40 of 132 SMs (requested 33) ..."
  std::string summary() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  SmPartitionInfo info_;
};

// The partition for `device_type` when `cluster_types` declares it emulated,
// else nullptr (a plain type runs on the whole GPU). Prints summary() (and a
// warning when the GPU is not the declared base, or the driver rounded the
// SM count) to stderr.
std::unique_ptr<SmPartition> enter_device_type(
    torch::Device device, const std::string& device_type,
    const std::vector<std::pair<std::string, EmulatedDevice>>& cluster_types);

// A bf16 GEMM's and a streaming kernel's speed inside a partition, for
// checking an emulated type against its base (`hetplan gpu-probe`).
struct PartitionProbe {
  int requested_sms = 0, granted_sms = 0, device_sms = 0;
  bool green_context = false;
  double gemm_tflops = 0;  // median of `iters` m x m x m bf16 matmuls: 2 m^3 / time
  double copy_tbs = 0;     // median of an elementwise copy kernel (neg) over `bytes`: read + written bytes / time
  double gemm_ms = 0, copy_ms = 0;
};
// Runs on `device` restricted to `sms` SMs (0 or >= the GPU's: the whole GPU).
// REQUIRES a CUDA device and build (else InputError).
PartitionProbe probe_partition(torch::Device device, int sms, int64_t m, int64_t bytes, int iters);

}  // namespace hetplan::profiler
