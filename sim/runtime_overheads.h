// Runtime overheads: what the framework around the kernels adds to a step, as
// named models with defaults that match what people run. Each is a mechanism
// with its own test (tests/test_whatif.cc, [runtime]); whatif and the
// inference what-if use them, and a profile's measurements
// (whatif_calibration.json, `hetplan gpu-probe`) replace the defaults.
//
//  - The runtime (LaunchModel). Eager PyTorch issues every op from the CPU;
//    launches are asynchronous, so the host runs ahead of the GPU until the
//    step's end synchronises: a step takes the GPU's time where the GPU is the
//    bottleneck, the host's where the host is (host_ahead_step_ms over the
//    forward, backward and optimizer phases). The host's time is itemised from
//    the code (EagerOps: ops per block forward, backward kernels, checkpoint
//    regions, DDP's parameters, FSDP2's modules and parameters, the
//    optimizer's tensors) at per-op costs a probe measured in situ
//    (HostCosts: scripts/gpu_host_probe.py; defaults from an H200 host,
//    logs/validate/host-probe-h200/). A captured CUDA graph replays its kernels without
//    the host; what is left is the GPU's own per-kernel floor
//    (kDefaultGraphKernelUs), which eager kernels have too.
//  - Kernel counts. The number of kernels an eager implementation runs per
//    block, itemised from what the code does (eager_block_kernels for a
//    training step under torch.autocast; hf_decode_kernels_per_layer for
//    Hugging Face transformers' eager decoder layer in `generate`).
//  - PyTorch DDP's gradient buckets (DdpBuckets). DistributedDataParallel
//    (torch/nn/parallel/distributed.py, the C++ Reducer) packs the gradients,
//    in reverse parameter order, into buckets of bucket_cap_mb (25 MiB; the
//    first bucket 1 MiB). With gradient_as_bucket_view False (the default) the
//    buckets are their own storage, as large as all the gradients together:
//    one more copy of the gradients on the GPU. During the backward each
//    gradient is copied (divided by the world size while copied) into its
//    bucket; a bucket whose gradients are all ready is all-reduced at once, on
//    the communication stream, overlapped with the rest of the backward; after
//    the last, the reduced buckets are copied back into the .grad tensors. The
//    step sees the copies and the part of the all-reduces that outlasts the
//    backward (ddp_sync).
// Thread-safety: pure functions of their arguments.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "base/json_util.h"
#include "sim/model_shape.h"

namespace hetplan {

struct HostSpec;  // sim/offload.h (which includes this header)

enum class LaunchRuntime { kEager, kGraphs };
const char* to_string(LaunchRuntime r);
// "eager" or "graphs"; throws InputError naming `where`.
LaunchRuntime parse_launch_runtime(const std::string& s, const std::string& where);

// An op issued by the host with autograd off (torch.add on a tiny tensor in a loop: the H200 host's probe,
// logs/validate/host-probe-h200/host_probe_micro.json aten_op.add): the launch cost of the analytic layer model
// (sim/layer_time_model.h) and of DeepSpeed's coordinator (sim/offload.h). The GPU's floor per kernel of a
// replayed CUDA graph (logs/whatif_calibration_h200.md).
inline constexpr double kDefaultEagerOpUs = 6.04;
inline constexpr double kDefaultGraphKernelUs = 2.16;

// Host microseconds per thing, measured in situ: the validation model's code at a tiny width (the GPU keeps
// up, so a phase's wall time is the host's), divided by the ops the profiler counted in that phase; and the
// wrappers' and the optimizer's additions. Defaults: the H200 host's probe (sim/runtime_overheads.md);
// read_host_probe takes another probe's figures.
struct HostCosts {
  double forward_op_us = 0;           // a top-level op of an eager training forward (Python, autograd, autocast)
  double backward_kernel_us = 0;      // a kernel of the backward (the engine's nodes and launches, per kernel)
  double checkpoint_forward_us = 0;   // torch.utils.checkpoint, per region in the forward (RNG state, hooks)
  double checkpoint_backward_us = 0;  // ... per region in the backward, besides its recomputed forward's ops
  double ddp_param_us = 0;            // DistributedDataParallel, per parameter tensor (hook, bucket copies)
  double fsdp2_module_us = 0;         // FSDP2 (fully_shard), per sharded module and step (its four hooks)
  double fsdp2_param_us = 0;          // ... and per parameter tensor of it (copy-in/out, DTensor, its optimizer)
  // Where FSDP2's cost falls (the probe's tiny GPT, FSDP2 against none, phase by phase): the share in the forward
  // (pre-forward all-gather, post-forward reshard) and in the optimizer step (AdamW and zero_grad over DTensors:
  // once per step, not per micro-batch); the rest in the backward (pre-backward all-gather, reduce-scatter, the
  // sharded gradients). REQUIRES: each in [0, 1], their sum <= 1.
  double fsdp2_forward_share = 0, fsdp2_optimizer_share = 0;
  double adam_step_us = 0, adam_tensor_us = 0;  // AdamW(fused=True): per step and per parameter tensor
  double zero_grad_tensor_us = 0;     // optimizer.zero_grad(set_to_none=True): its Python loop, per parameter tensor
  double nograd_op_us = 0;            // an op of an eager decode step (autograd off)
  std::string source;
};
// The defaults (the H200 probe's figures, logs/validate/host-probe-h200/).
HostCosts default_host_costs();
// The costs a probe measured: `path` is scripts/gpu_host_probe.py's host_probe_micro.json; a
// host_probe_dist.json beside it adds the DDP and FSDP2 figures (else those stay the defaults').
// Throws InputError naming the file and key when a figure is missing or not a positive number.
HostCosts read_host_probe(const std::string& path);
// The offloading host a probe measured (scripts/gpu_host_probe.py offload: host_probe_offload.json beside the
// micro file `micro_path`): torch's fused CPU AdamW and the fp32 -> bf16 cast over a buffer far larger than the
// caches, with all the host's cores, and pinned copies each way. Fills `h`'s four rates and its source, and
// returns true; returns false (h untouched) when there is no such file. Throws InputError naming the file and
// key when a figure is missing or not positive.
bool read_host_probe_offload(const std::string& micro_path, HostSpec& h);
// Every cost times `factor`, the host's time per op now against when the costs were measured (a short re-probe's
// ratio: 1.2, the host 20% slower). The counts the host model multiplies them by do not depend on the host.
// REQUIRES: factor > 0.
HostCosts scaled_host_costs(const HostCosts& c, double factor);
// The same from parsed JSON (`dist` may be null).
HostCosts host_costs_from_probe(const ordered_json& micro, const std::string& micro_path, const ordered_json* dist,
                                const std::string& dist_path);

struct LaunchModel {
  LaunchRuntime runtime = LaunchRuntime::kEager;
  double graph_kernel_us = kDefaultGraphKernelUs;  // the GPU's floor per kernel (both runtimes: eager too)
  HostCosts host = default_host_costs();           // the host's side of an eager step
  std::string source = "defaults (H200 host probe)";
  // "eager (host model: <source>)" or "CUDA graphs (2.16 us/kernel floor)".
  std::string describe() const;
};

// Kernels of one transformer block's forward in an eager training step under torch.autocast (bf16/fp16):
// per linear its GEMM and autocast's cast of the fp32 weight (and bias); the norms (LayerNorm one kernel;
// an eager RMSNorm in fp32 eight: cast, pow, mean, add, rsqrt, mul, cast, scale); SDPA and the
// transpose copy of its output; rotary embeddings (ten: q and k, each mul, neg, cat, mul, add); the
// activation (GELU one; SwiGLU silu and mul); two residual adds. The backward runs about twice as many.
// `fused_qkv`: q, k and v as one GEMM (GPT-2's c_attn).
double eager_block_forward_kernels(const ModelShape& m, bool autocast, bool fused_qkv);
inline constexpr double kBackwardKernelsPerForward = 2;

// Kernels of one decoder layer of Hugging Face transformers' eager Llama/GPT-2 in one decode step:
// norms (RMSNorm eight each, LayerNorm one), the projections (q, k, v apart for Llama; GPT-2's c_attn and
// its split), rotary embeddings (ten), the KV-cache update (two), repeat_kv (two, GQA only), SDPA with its
// mask (three), the output transpose copy, o_proj, the MLP (SwiGLU five, GELU three), two residual adds.
double hf_decode_kernels_per_layer(const ModelShape& m);
// Kernels of one decode step outside the layers: the embedding, the rotary table and the mask (ten), the
// final norm, the LM head and its fp32 cast, generate's greedy selection and bookkeeping (six).
double hf_decode_kernels_per_step(const ModelShape& m);

// ---- The host's side of an eager step (issue 32) ----
// Eager PyTorch issues every op from the CPU: Python, the dispatcher, autograd's bookkeeping and the launch.
// Launches are asynchronous, so the CPU runs ahead of the GPU, queueing work, until something makes it wait
// for the GPU; in a training step that is the step's end (torch.cuda.synchronize, .item(), a logged loss).
// So a step takes
//     max(GPU time, host time)
// (host-bound: the GPU idles between kernels and the last kernels finish right after their issue; GPU-bound:
// the queue never drains). The host time is what the CPU spends issuing the step, itemised from the code
// (EagerOps: counts from the model's structure, which do not depend on its width) times the per-op costs of
// HostCosts (micro-benchmarks: scripts/gpu_host_probe.py, logs/validate/host-probe-h200/).

// The ops of a stretch of eager code, as the host's model counts them.
struct EagerOps {
  double forward_ops = 0;       // top-level aten ops issued from Python (views included)
  double backward_kernels = 0;  // kernels the autograd engine launches for them
  double backward_nodes = 0;    // its nodes (views' and AccumulateGrad's included; informational)
  EagerOps& operator+=(const EagerOps& o);
};
// One transformer block of a training step, as a PyTorch user writes it (nanoGPT / Hugging Face style),
// itemised from the code: GPT-2 (learned positions): two LayerNorms, a fused qkv nn.Linear, view, unbind and
// three transposes, SDPA, the output's transpose and reshape copy, proj, the GELU MLP, two residual adds
// (17 ops); Llama: eager RMSNorm (8 ops each), q/k/v with their views, rotary on q and k (two slices, neg, cat,
// two muls, add), the GQA repeat, SDPA, SwiGLU. Backward kernels: per linear the input- and weight-gradient
// GEMMs, the bias gradient's reduction, and under autocast each cast's gradient cast back (the weight, the
// bias, an fp32 input); a LayerNorm's two (input; weight and bias); fused attention's four; the residual
// stream's sums and casts; each elementwise op's one.
EagerOps eager_block_ops(const ModelShape& m, bool autocast);
// The embedding (+ positions), the final norm, the LM head and the fp32 cross-entropy.
EagerOps eager_ends_ops(const ModelShape& m, bool autocast);
// Parameter tensors (what DDP hooks and the optimizer loop over): per block each linear's weight (and
// bias), each norm's weight (and bias); the embedding, the positions, the final norm, an untied head.
double parameter_tensors(const ModelShape& m);
double block_parameter_tensors(const ModelShape& m);
double ends_parameter_tensors(const ModelShape& m);

enum class DataParallelWrapper { kNone, kDdp, kFsdp2 };
struct TrainingHostSetup {
  bool autocast = true;
  int checkpoint_every = 0;  // 0: no activation checkpointing; k: every k-th block checkpointed
  DataParallelWrapper wrapper = DataParallelWrapper::kNone;
};
// The host's time to issue one micro-batch's forward and backward and the optimizer step, in ms.
struct HostStep {
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
  double recompute_ms = 0, wrapper_ms = 0;  // (parts of the two above: the checkpoint regions', the wrapper's)
};
// Forward: the blocks' and ends' ops (+ the checkpoint regions' forward cost, FSDP2's pre/post-forward share);
// backward: their kernels, the checkpointed blocks' recomputed forwards and regions, DDP per parameter tensor,
// FSDP2's backward share; optimizer: AdamW(fused) over the parameter tensors, then zero_grad(set_to_none=True)
// over them (a host loop the GPU waits on only where the step is host-bound), and FSDP2's optimizer share.
// FSDP2 wraps each block and the root (fsdp2_module_us per module, fsdp2_param_us per tensor), split between the
// phases by HostCosts' fsdp2 shares. forward_ms and backward_ms are per micro-batch, optimizer_ms per step.
// wrapper_ms is the wrapper's whole cost for one micro-batch and the step's optimizer.
HostStep eager_training_host(const ModelShape& m, const TrainingHostSetup& s, const HostCosts& c);

// The step's time when the host runs ahead of the GPU (launches are asynchronous) and the step ends with a
// synchronisation: phases in order, each of host time H and GPU time G; a phase's GPU work ends no earlier
// than the host has issued all of it, nor before the GPU has finished what came before it and done G:
//     h += H;  g = max(g + G, h);   step = g after the last phase.
// One phase: max(G, H); a host-bound forward delays the GPU's backward, which the host cannot make up.
double host_ahead_step_ms(const double* host_ms, const double* gpu_ms, int phases);

// Hugging Face's eager decode step: per layer the ops of hf_decode_kernels_per_layer plus its views (q/k/v
// view and transpose, rotate_half's slices, repeat_kv's index and expand, the mask's view, the output's
// transpose); per step the embedding, rotary table, mask, final norm, head, greedy selection and their views.
double hf_decode_ops_per_layer(const ModelShape& m);
double hf_decode_ops_per_step(const ModelShape& m);

// PyTorch DDP's gradient buckets (defaults: DistributedDataParallel's).
struct DdpBuckets {
  bool model = false;                    // off: not DDP, or not asked for
  double bucket_cap_mb = 25;             // MiB
  double first_bucket_mb = 1;            // MiB (the Reducer's first bucket)
  bool gradient_as_bucket_view = false;  // true: the .grad tensors are views of the buckets (no copy, no copies)
  // DDP rebuilds its buckets once, at the second forward; the old ones stay allocated, kept by the tensor stash
  // of the collectives that last used them, until ProcessGroupNCCL's watchdog (polling every
  // `watchdog_period_ms`) sees those complete (sim/runtime_overheads.md, DDP). Off: a steady-state step.
  bool old_buckets_held_at_rebuild = true;
  double watchdog_period_ms = 100;  // ProcessGroupNCCL's kWatchdogThreadSleepMillis
  // Whether the old copy is still allocated at the second step's two memory peaks: the activations' (the
  // backward's start) and the gradients' (the backward's end). Set from the step's timing by
  // old_buckets_phases; without timing, the activations' peak only.
  bool old_at_activation_peak = true, old_at_gradient_peak = false;
};

// DdpBuckets' phases in words: "none", "activations", "gradients" or "both" (plan files, simulate --ddp-old-buckets);
// the parser throws InputError naming `where`.
std::string old_buckets_phases_name(const DdpBuckets& d);
void parse_old_buckets_phases(const std::string& s, const std::string& where, DdpBuckets& d);

// GPU bytes of the buckets' own storage: the gradients' bytes again, unless gradient_as_bucket_view.
double ddp_bucket_bytes(const DdpBuckets& d, double gradient_bytes);
// GPU bytes of the old buckets while they are held across the rebuild (the gradients' bytes, with or without
// gradient_as_bucket_view); 0 where not DDP or !old_buckets_held_at_rebuild. At which peaks: DdpBuckets'
// old_at_activation_peak / old_at_gradient_peak (rank_memory takes the larger peak).
double ddp_old_bucket_bytes(const DdpBuckets& d, double gradient_bytes);

// The share of runs whose old buckets are still allocated `after_rebuild_ms` after the rebuild (host time: the
// caching allocator counts a tensor when the host issues its op), when the first step's last collective
// completed `before_rebuild_ms` before it: the watchdog releases them at its first poll after that completion,
// and its polls fall at any phase of its period relative to the step:
//     max(0, 1 - (before_rebuild_ms + after_rebuild_ms) / watchdog_period_ms).
double old_buckets_alive_share(const DdpBuckets& d, double before_rebuild_ms, double after_rebuild_ms);

// Sets d.old_at_activation_peak / old_at_gradient_peak to what the median run holds (alive share >= 1/2), for a
// second step whose host reaches the activations' peak `activation_peak_ms` after the rebuild (the forward
// issued) and the gradients' `gradient_peak_ms` after it (the backward issued), the first step's last
// collective having completed `before_rebuild_ms` before it (the optimizer after it and the step's end).
void old_buckets_phases(DdpBuckets& d, double before_rebuild_ms, double activation_peak_ms, double gradient_peak_ms);

struct DdpSyncTime {
  double backward_added_ms = 0;  // copying the gradients into the buckets, on the compute stream
  double exposed_ms = 0;         // all-reduce beyond the end of the backward, then the copy back
  int buckets = 0;
};
// The all-reduce of `gradient_bytes` split into DDP's buckets over a backward of `backward_ms`, the gradients
// ready at a uniform rate over it in reverse parameter order, except `last_bytes` (the first layer's: the
// embedding, whose gradient is complete only when the backward ends) ready at its end. `all_reduce_ms(bytes)`
// prices one bucket; `copy_ms(bytes)` one pass over bytes of HBM (read and write). The buckets run one after
// another on the communication stream.
template <class AllReduceMs, class CopyMs>
DdpSyncTime ddp_sync(const DdpBuckets& d, double gradient_bytes, double last_bytes, double backward_ms,
                     AllReduceMs all_reduce_ms, CopyMs copy_ms) {
  DdpSyncTime t;
  if (gradient_bytes <= 0) return t;
  const double cap = d.bucket_cap_mb * 1024 * 1024, first = d.first_bucket_mb * 1024 * 1024;
  const double rest = std::max(0.0, gradient_bytes - last_bytes);
  double comm_end = 0, filled = 0;
  auto bucket = [&](double bytes, double ready_ms) {
    comm_end = std::max(comm_end, ready_ms) + all_reduce_ms(bytes);
    ++t.buckets;
  };
  // Buckets of the uniformly produced gradients: the first of `first` bytes, then of `cap`.
  for (double size = std::min(first, rest); filled < rest; size = std::min(cap, rest - filled)) {
    filled += size;
    bucket(size, backward_ms * filled / gradient_bytes);
  }
  // The first layer's gradients (the embedding table: one parameter larger than the cap, a bucket of
  // its own), ready when the backward ends.
  if (last_bytes > 0) bucket(last_bytes, backward_ms);
  t.exposed_ms = std::max(0.0, comm_end - backward_ms);
  if (!d.gradient_as_bucket_view) {
    t.backward_added_ms = copy_ms(gradient_bytes);
    t.exposed_ms += copy_ms(gradient_bytes);
  }
  return t;
}

}  // namespace hetplan
