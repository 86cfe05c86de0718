// DeepSpeed's buffers and ZeRO-Offload's time: what offloading and ZeRO's
// bucketing cost beyond the model states of sim/memory_model.h.
//
// Buffers (GPU bytes), from DeepSpeed's source (microsoft/DeepSpeed at
// 38327e0, deepspeed/runtime/zero/config.py defaults; stage_1_and_2.py and
// stage3.py allocations):
//  - ZeRO-1/2 with contiguous_gradients (default true, forced on by
//    offload_optimizer): ipg_buffer, reduce_bucket_size elements of the
//    16-bit dtype, and a second one when overlap_comm (double buffering);
//    with offload_optimizer also temp_grad_buffer_for_gpu_offload, the largest
//    parameter's elements in the 16-bit dtype (its pinned twin is on the host).
//  - ZeRO-3: one __ipg_bucket_flat_buffer of reduce_bucket_size elements, and
//    the parameters gathered ahead of use: up to stage3_prefetch_bucket_size
//    elements beyond the module being computed (that module is in
//    ModelStateBytes::transient already), never more than
//    stage3_max_live_parameters live.
// Defaults: reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7,
// stage3_max_live_parameters 1e9 (config.py); overlap_comm defaults to true
// for stage 3 and false otherwise (config.py's overlap_comm_valid).
//
// Time, by DeepSpeed's overlap rules (Ren et al. 2021, "ZeRO-Offload", Sec.
// 4.1-4.2; Rajbhandari et al. 2021, "ZeRO-Infinity", Sec. 6):
//  - offload_optimizer (ZeRO-1/2/3): each micro-batch's gradient partition
//    goes device-to-host during the backward, overlapped with it (only what
//    exceeds the backward shows). DeepSpeed copies a 16-bit gradient into
//    its fp32 host buffer with one Tensor.copy_ (stage_1_and_2.py
//    async_inplace_copy_grad_to_fp32_buffer_from_gpu; stage3.py likewise),
//    with non_blocking=True, and PyTorch converts a non-blocking
//    cross-device copy on the GPU (aten/src/ATen/native/cuda/Copy.cu,
//    copy_kernel_cuda: "If non_blocking is true - type conversions are
//    performed on the GPU"), so 4 bytes per gradient element cross the
//    link, not 2. The
//    optimizer step then runs on the CPU, serially (CPU Adam over the rank's
//    partition, the host's throughput shared by the ranks on it), then the
//    updated fp32 partition is cast to the 16-bit dtype on the host
//    (bit16 partition .copy_(fp32 partition), blocking: Copy.cu converts a
//    blocking copy on the CPU; with offload_params the 16-bit partition is on
//    the host and the cast is all), at the host's measured cast throughput
//    (HostSpec::cpu_cast_params_per_s), followed by the host-to-device copy of
//    the updated 16-bit partition (not with offload_params, whose weights stay
//    on the host).
//  - offload_params (ZeRO-3): each layer's partition is fetched host-to-device
//    before its forward and again before its backward; prefetching overlaps
//    each fetch with the compute of the pass (only what exceeds it shows).
// Thread-safety: pure functions.
#pragma once

#include <string>

namespace hetplan {

struct TrainingSetup;

// DeepSpeed's bucket and prefetch settings; `model` off (the default) counts none of them
// (the setup is not DeepSpeed, or the caller does not want them).
struct DeepSpeedBuffers {
  bool model = false;
  double reduce_bucket_size = 5e8;      // elements (config.py: reduce_bucket_size)
  double prefetch_bucket_size = 5e7;    // elements (config.py: stage3_prefetch_bucket_size)
  double max_live_parameters = 1e9;     // elements (config.py: stage3_max_live_parameters)
  int overlap_comm = -1;                // -1: DeepSpeed's default (true for stage 3 only); 0/1: as set
  bool contiguous_gradients = true;     // config.py default
};

// The host a rank offloads to: pinned copy bandwidth per GPU (with the node's
// GPUs copying at once, as measured; or the stated default) and CPU Adam
// throughput of the whole host (all cores).
struct HostSpec {
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;
  double cpu_adam_params_per_s = 0;
  // fp32 -> 16-bit casts of the updated partition on the host (all cores), elements/s; 0: the default.
  double cpu_cast_params_per_s = 0;
  std::string source;  // "measured (profiles/host.json)" or the defaults' statement
};

// Defaults when nothing is measured: the GPU's nominal PCIe link (catalogue host_link_gbs) at
// kPinnedCopyEfficiency, and CPU Adam as a roofline over host memory bandwidth.
inline constexpr double kPinnedCopyEfficiency = 0.8;  // PCIe 128b/130b encoding and TLP headers: ~80% of nominal
inline constexpr double kCpuAdamBytesPerParam = 30;   // DeepSpeed cpu_adam: reads fp32 param, grad, exp_avg,
                                                      // exp_avg_sq (16 B), writes three (12 B) and the 16-bit copy (2 B)
inline constexpr double kCpuCastBytesPerParam = 6;   // the cast reads fp32 (4 B) and writes 16 bits (2 B)
inline constexpr double kDefaultHostMemoryGBps = 100; // a two-socket server's sustained DRAM bandwidth (STREAM-class)
HostSpec default_host_spec(double host_link_gbs, double host_memory_gbps = kDefaultHostMemoryGBps);

// GPU bytes of DeepSpeed's buffers for a rank whose largest parameter has `largest_param` elements.
double deepspeed_buffer_bytes(const TrainingSetup& s, double largest_param);
// Whether overlap_comm is on for this setup (the config's value or DeepSpeed's default).
bool deepspeed_overlap_comm(const TrainingSetup& s);

struct OffloadTime {
  double forward_exposed_ms = 0;   // per micro-batch: parameter fetch beyond the forward
  double backward_exposed_ms = 0;  // per micro-batch: gradient copy / parameter fetch beyond the backward
  double step_ms = 0;              // per iteration: CPU Adam and the copy of the updated weights back
};

// For a rank holding `trainable` trainable parameters before the ZeRO split and `weight_bytes` of
// 16-bit weights before the split (gradients cross device-to-host as fp32 when the 16-bit
// weights are bf16/fp16: DeepSpeed's fp32 host gradient buffer, see above), with ZeRO over `dp` ranks, `ranks_per_host` ranks sharing the
// host, and a micro-batch's forward and backward times. All zero without offload.
OffloadTime offload_time(const TrainingSetup& s, const HostSpec& host, double trainable, double weight_bytes, int dp,
                         int ranks_per_host, double forward_ms, double backward_ms);

}  // namespace hetplan
