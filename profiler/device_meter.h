// DeviceMeter: wall time and memory of work on one device, measured the way
// the device allows. On CUDA, time comes from CUDA events on the current
// stream and memory from the caching allocator's peak statistics. On the CPU,
// time is the steady clock, and memory comes from a counting allocator that
// wraps LibTorch's CPU allocator (LibTorch < 2.3) and can also enforce a
// memory limit, so that a CPU run can emulate a device's capacity.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace hetplan::profiler {

class DeviceMeter {
 public:
  explicit DeviceMeter(torch::Device device);
  ~DeviceMeter();

  // Timing: mark() records a point in the device's work; after sync(),
  // elapsed_ms(a, b) is the time between two marks.
  int mark();
  void sync();
  double elapsed_ms(int a, int b) const;
  void clear_marks();
  // Holds the current stream for `ms`: a host function on the stream
  // (cudaLaunchHostFunc) that sleeps that long. Work issued right after it
  // queues up behind it, so marks around that work time the device alone,
  // never a device waiting for the host to issue the next kernel (as long as
  // issuing takes less than `ms`). No-op on the CPU.
  void stall(double ms);

  // Memory: bytes live now, and the highest since reset_peak().
  bool has_memory_stats() const;
  int64_t allocated() const;
  int64_t peak() const;
  void reset_peak();
  void release_cached();  // return cached blocks after an out-of-memory
  // Device memory this process holds outside PyTorch's allocator (CUDA
  // context, cuBLAS/cuDNN/NCCL workspaces); -1 where it cannot be measured.
  int64_t framework_bytes() const;
  // CUDA: the caching allocator's peak reserved bytes since reset_peak(),
  // and the device memory in use now by every process on the device
  // (cudaMemGetInfo: total - free; CUDA context, NCCL and library workspaces
  // included); -1 elsewhere.
  int64_t peak_reserved() const;
  int64_t device_used() const;

  // CPU only: refuse allocations past `bytes` (0: no limit).
  static bool set_cpu_memory_limit(int64_t bytes);

 private:
  torch::Device device_;
  struct Impl;
  Impl* impl_;
};

// The device a --device flag (auto, cuda or cpu) names for a rank; auto is
// CUDA when a GPU is visible. Throws InputError for a bad flag, EnvironmentError
// for cuda where no CUDA device is visible.
torch::Device parse_device(const std::string& flag, int local_rank);
// bf16, fp16 or fp32. Throws InputError.
torch::Dtype parse_dtype(const std::string& flag);

// Makes `device` the calling process's current CUDA device (no-op on the CPU),
// so that NCCL and the caching allocator work on this rank's GPU only.
void use_device(torch::Device device);

// True for the errors LibTorch raises when memory runs out.
bool is_out_of_memory(const std::exception& e);

// "H200", "NVIDIA H200", ... for the device, for the profile's record.
std::string device_description(torch::Device device);

}  // namespace hetplan::profiler
