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
//    goes device-to-host during the backward. With overlap_comm (stage 3's
//    default) the copies run on DeepSpeed's reduction stream, overlapped with
//    the backward (only what exceeds it shows); without it (ZeRO-1/2's
//    default) they are issued on the compute stream (stage_1_and_2.py
//    reduce_ipg_grads: with cpu_offload and no overlap_comm the stream is
//    current_stream(), its copy_grad_stream disabled) and add to the backward
//    in full. DeepSpeed copies a 16-bit gradient into
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

#include <algorithm>
#include <string>
#include <vector>

#include "sim/runtime_overheads.h"

namespace hetplan {

struct ModelShape;

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
  double allgather_bucket_size = 5e8;   // elements (config.py: allgather_bucket_size; ZeRO-1/2's weight gather)
  bool pin_memory = false;              // offload_optimizer/offload_param pin_memory (config default false)
  double param_persistence_threshold = 1e5;  // elements (stage3_param_persistence_threshold): smaller
                                             // parameters stay whole on every rank, never gathered
  double host_op_us = kDefaultEagerOpUs;     // the host's time per eager op (the coordinator's hooks)
  std::string from_config;              // the ds_config.json these came from; empty: DeepSpeed's defaults
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
// A pageable (unpinned) copy is staged: the CUDA driver copies host memory into a pinned bounce buffer
// with the CPU, then DMAs it, chunk by chunk; about half the pinned rate (an assumption, stated on the row;
// DeepSpeed's offload pin_memory defaults to false).
inline constexpr double kPageableCopyFactor = 0.5;
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

// A DeepSpeed config (ds_config.json) as whatif reads it, by DeepSpeed's semantics (deepspeed/runtime/
// zero/config.py, offload_config.py, runtime/config.py; re-implemented):
//   zero_optimization.stage (0-3, default 0); .offload_optimizer.device ("cpu"; "none" = off; "nvme" is
//   not modelled: an error) and .pin_memory (default false); .offload_param likewise (stage 3 only);
//   the deprecated .cpu_offload (true = offload_optimizer cpu); .reduce_bucket_size (5e8),
//   .allgather_bucket_size (5e8), .stage3_prefetch_bucket_size (5e7), .stage3_max_live_parameters (1e9),
//   .stage3_param_persistence_threshold (1e5), .overlap_comm (default: on for stage 3 only),
//   .contiguous_gradients (true); fp16.enabled / bf16.enabled (neither: fp32; both: an error);
//   train_micro_batch_size_per_gpu, gradient_accumulation_steps.
// Sizes written "auto" (the Hugging Face Trainer integration) take its rules: reduce_bucket_size
// hidden^2, stage3_prefetch_bucket_size 0.9 hidden^2, stage3_param_persistence_threshold 10 hidden
// (resolve_deepspeed_auto); a batch "auto" is left to the flags. Errors (InputError) name the file and key.
struct DeepSpeedRunConfig {
  std::string path;
  int stage = 0;
  bool offload_optimizer = false, offload_params = false;
  DeepSpeedBuffers buffers;          // sizes < 0: "auto" (resolve_deepspeed_auto)
  std::string precision;             // "fp16", "bf16", or "fp32" when neither is enabled
  int micro_batch = 0, accumulation = 0;  // 0: not given or "auto"
};
DeepSpeedRunConfig read_deepspeed_config(const std::string& path);
// The Hugging Face Trainer's "auto" bucket sizes for a model of hidden size `hidden`.
void resolve_deepspeed_auto(DeepSpeedRunConfig& c, long long hidden);

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

// DeepSpeed ZeRO-3's per-module gather and release (runtime/zero/stage3.py, partitioned_param_coordinator.py,
// re-implemented). Before a module's forward, and again before its backward, the rank's partitions of its
// parameters are all-gathered (with offload_param, first copied host-to-device); after it they are released.
// Parameters smaller than stage3_param_persistence_threshold stay whole on every rank and are never gathered.
// While a module computes, the coordinator prefetches the next modules' parameters, as long as those fetched
// ahead total at most stage3_prefetch_bucket_size elements and the gathered ones at most
// stage3_max_live_parameters; a module not prefetched is fetched on demand when it is reached. Gathers run one
// after another; each costs the coordinator's host work (kDeepSpeedGatherHostOps eager ops), the collective's
// latency and its bytes, so many small modules make the pass latency-bound.
// A transformer's modules in execution order: the embedding tables, each block's projections (GPT-2's
// q, k and v as its one c_attn), the LM head (tied: the embedding's weight gathered again); norms and biases
// below the threshold persist. Elements per rank before ZeRO's split (tp already divided out).
std::vector<double> zero3_gathered_modules(const ModelShape& m, int first_layer, int end_layer, int tp,
                                           double persistence_threshold);
// The coordinator's host work per gathered module, in eager ops (DeepSpeed's pre-/post-forward hooks: the
// fetch bookkeeping, the flat buffer, the all-gather launch, the views, the release): an assumption.
inline constexpr double kDeepSpeedGatherHostOps = 20;

// Milliseconds one forward (or backward) pass takes over `modules` (in the pass's order) when computing them
// takes `compute_ms` in all (shared in proportion to their elements) and gathering module i takes
// gather_ms(elements_i).
template <class GatherMs>
double zero3_pass_ms(const DeepSpeedBuffers& d, const std::vector<double>& modules, bool reverse, double compute_ms,
                     GatherMs gather_ms) {
  const int n = static_cast<int>(modules.size());
  if (n == 0) return compute_ms;
  double total = 0;
  for (double p : modules) total += p;
  auto at = [&](int i) { return modules[static_cast<std::size_t>(reverse ? n - 1 - i : i)]; };
  std::vector<double> ready(static_cast<std::size_t>(n), 0.0);
  double comm_free = 0, prev_end = 0, ahead = 0;
  int issued = 0;
  auto issue = [&](int j, double when) {
    comm_free = std::max(comm_free, when) + gather_ms(at(j));
    ready[static_cast<std::size_t>(j)] = comm_free;
  };
  for (int i = 0; i < n; ++i) {
    if (issued <= i) {  // not prefetched: fetched on demand
      issue(i, prev_end);
      issued = i + 1;
    } else {
      ahead -= at(i);
    }
    const double start = std::max(prev_end, ready[static_cast<std::size_t>(i)]);
    // Prefetch while module i computes, within the bucket and the live-parameter cap.
    while (issued < n && ahead + at(issued) <= d.prefetch_bucket_size &&
           at(i) + ahead + at(issued) <= d.max_live_parameters) {
      ahead += at(issued);
      issue(issued++, start);
    }
    prev_end = start + compute_ms * at(i) / total;
  }
  return std::max(prev_end, compute_ms);
}

}  // namespace hetplan
