// Runtime overheads: what the framework around the kernels adds to a step, as
// named models with defaults that match what people run. Each is a mechanism
// with its own test (tests/test_whatif.cc, [runtime]); whatif and the
// inference what-if use them, and a profile's measurements
// (whatif_calibration.json, `hetplan gpu-probe`) replace the defaults.
//
//  - The launch floor (LaunchModel). A kernel cannot start before the host has
//    issued it. In eager PyTorch each op costs the host its Python and
//    dispatcher time plus the launch (kDefaultEagerOpUs); when the GPU work of
//    a stretch of kernels is shorter than the host's time to issue them, the
//    GPU waits on the CPU and the stretch takes kernels x that time. A
//    captured CUDA graph replays its kernels without the host; what is left
//    is the GPU's own per-kernel floor (launch from the graph, ramp-up and
//    drain: kDefaultGraphKernelUs). So a stretch takes
//        max(GPU work, kernels x floor),  floor = eager op time | graph floor.
//    The defaults are micro-benchmark measurements (logs/whatif_calibration_h200.md,
//    "kernel floor": 500 tiny kernels issued from Python vs replayed from a
//    graph, one H200 host): 7.47 us and 2.16 us per kernel.
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

#include "sim/model_shape.h"

namespace hetplan {

enum class LaunchRuntime { kEager, kGraphs };
const char* to_string(LaunchRuntime r);
// "eager" or "graphs"; throws InputError naming `where`.
LaunchRuntime parse_launch_runtime(const std::string& s, const std::string& where);

inline constexpr double kDefaultEagerOpUs = 7.47;     // host time per eager op issued from Python
inline constexpr double kDefaultGraphKernelUs = 2.16; // GPU floor per kernel of a replayed graph

struct LaunchModel {
  LaunchRuntime runtime = LaunchRuntime::kEager;
  double eager_op_us = kDefaultEagerOpUs;
  double graph_kernel_us = kDefaultGraphKernelUs;
  std::string source = "defaults: 7.47 us per eager op, 2.16 us per graph kernel (H200 host micro-benchmark)";
  // The per-kernel floor of this runtime, in seconds.
  double floor_s() const { return (runtime == LaunchRuntime::kEager ? eager_op_us : graph_kernel_us) * 1e-6; }
  // "eager (7.47 us/op host floor)" or "CUDA graphs (2.16 us/kernel floor)".
  std::string describe() const;
};

// Seconds of a stretch of `kernels` kernels whose GPU work is `gpu_s`: max(gpu_s, kernels x floor).
double launch_bound_s(const LaunchModel& launch, double gpu_s, double kernels);

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
// HostCosts (micro-benchmarks: scripts/gpu_host_probe.py, logs/host_probe/).

// Host microseconds per thing. Defaults: the H200 host's probe (sim/runtime_overheads.md); read_host_probe
// replaces them with another probe's figures.
struct HostCosts {
  // Issued from Python in a training forward (grad mode):
  double kernel_op_us = 0;      // an op that launches a kernel (add, GELU, a norm, a copy)
  double view_op_us = 0;        // an op that launches none (view, transpose, unbind, slice)
  double linear_us = 0;         // an nn.Linear call under torch.autocast (the module, its casts, the GEMM)
  double plain_linear_us = 0;   // an nn.Linear call without autocast
  double sdpa_us = 0;           // F.scaled_dot_product_attention
  double module_call_us = 0;    // an nn.Module call's own cost (around the ops above)
  // Issued from Python with autograd off (decode):
  double nograd_kernel_op_us = 0, nograd_view_op_us = 0, nograd_linear_us = 0, nograd_sdpa_us = 0;
  // The autograd engine's thread, per node it runs and per kernel it launches:
  double backward_node_us = 0, backward_kernel_us = 0;
  // torch.utils.checkpoint (use_reentrant=False), per region, besides the recomputed forward's ops:
  double checkpoint_region_us = 0;
  // DistributedDataParallel, per parameter tensor and step (its autograd hook, the copy into the bucket and
  // back, the bookkeeping):
  double ddp_param_us = 0;
  // FSDP2 (fully_shard), per sharded module and step (pre/post-forward and pre/post-backward hooks: the
  // all-gathers' copy-in/out, resharding, the reduce-scatter's issue):
  double fsdp2_module_us = 0;
  // torch.optim.AdamW(fused=True): per step and per parameter tensor (zero_grad's share included);
  // on FSDP2's DTensor parameters the per-tensor cost is dtensor_adam_tensor_us.
  double adam_step_us = 0, adam_tensor_us = 0, dtensor_adam_tensor_us = 0;
  std::string source;
};
// The defaults (the H200 probe's figures).
HostCosts default_host_costs();
// The costs a probe measured: `path` is scripts/gpu_host_probe.py's host_probe_micro.json; a
// host_probe_dist.json beside it adds the DDP and FSDP2 figures (else those stay the defaults').
// Throws InputError naming the file and key when a figure is missing or not a positive number.
HostCosts read_host_probe(const std::string& path);

// The ops of a stretch of eager code, by host cost class.
struct EagerOps {
  double kernel_ops = 0, view_ops = 0, linears = 0, sdpa = 0, modules = 0;  // issued from Python
  double backward_nodes = 0, backward_kernels = 0;                          // run by the autograd engine
  EagerOps& operator+=(const EagerOps& o);
};
// One transformer block of a training step, as a PyTorch user writes it (nanoGPT / Hugging Face style):
// GPT-2 (learned positions): LayerNorm modules, a fused qkv nn.Linear, view/unbind/transposes, SDPA, the
// output's transpose and reshape copy, proj, GELU MLP, two residual adds; Llama: eager RMSNorm (8 ops),
// separate q/k/v (views and transposes), rotary (per q and k: two slices, neg, cat, two muls, add), GQA
// repeat, SDPA, SwiGLU. Backward: one autograd node per op with autograd history (views included), and
// per nn.Linear under autocast its weight's and bias's cast nodes (ToCopyBackward) and the transposed
// weight; the kernels: per linear the input- and weight-gradient GEMMs, the bias gradient's reduction and
// the gradients' casts back to fp32; per other op its backward kernel.
EagerOps eager_block_ops(const ModelShape& m, bool autocast);
// The embedding (+ positions), the final norm, the LM head and the fp32 cross-entropy.
EagerOps eager_ends_ops(const ModelShape& m, bool autocast);
// Parameter tensors (what DDP hooks and the optimizer loop over): per block each linear's weight (and
// bias), each norm's weight (and bias); the embedding, the positions, the final norm, an untied head.
double parameter_tensors(const ModelShape& m);
double block_parameter_tensors(const ModelShape& m);
double ends_parameter_tensors(const ModelShape& m);
// Host microseconds of `ops`' forward (issued from Python, grad mode) and backward (the engine).
double forward_host_us(const EagerOps& ops, const HostCosts& c);
double backward_host_us(const EagerOps& ops, const HostCosts& c);

enum class DataParallelWrapper { kNone, kDdp, kFsdp2 };
struct TrainingHostSetup {
  bool autocast = true;
  int checkpoint_every = 0;  // 0: no activation checkpointing; k: every k-th block checkpointed
  DataParallelWrapper wrapper = DataParallelWrapper::kNone;
  int micro_batches = 1;     // gradient accumulation: forward and backward per micro-batch, one optimizer step
};
struct HostStep {
  double forward_ms = 0, backward_ms = 0, recompute_ms = 0, wrapper_ms = 0, optimizer_ms = 0;
  double total_ms() const { return forward_ms + backward_ms + recompute_ms + wrapper_ms + optimizer_ms; }
};
// The host's time to issue one eager training step: per micro-batch the forward (blocks and ends), the
// backward, the checkpointed blocks' recomputed forwards (+ the region cost each), the wrapper's hooks
// (DDP per parameter tensor; FSDP2 per block and the root); then AdamW(fused) over the parameter tensors.
HostStep eager_training_host(const ModelShape& m, const TrainingHostSetup& s, const HostCosts& c);

// Hugging Face's eager decode step, by host cost class (layers and the rest): per layer the ops of
// hf_decode_kernels_per_layer plus its views (q/k/v view and transpose, rotate_half's slices, repeat_kv's
// expand, the mask's and the output's views); host microseconds with autograd off.
EagerOps hf_decode_ops_per_layer(const ModelShape& m);
EagerOps hf_decode_ops_per_step(const ModelShape& m);
double nograd_host_us(const EagerOps& ops, const HostCosts& c);

// PyTorch DDP's gradient buckets (defaults: DistributedDataParallel's).
struct DdpBuckets {
  bool model = false;                    // off: not DDP, or not asked for
  double bucket_cap_mb = 25;             // MiB
  double first_bucket_mb = 1;            // MiB (the Reducer's first bucket)
  bool gradient_as_bucket_view = false;  // true: the .grad tensors are views of the buckets (no copy, no copies)
};

// GPU bytes of the buckets: the gradients' bytes again, unless gradient_as_bucket_view.
double ddp_bucket_bytes(const DdpBuckets& d, double gradient_bytes);

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
