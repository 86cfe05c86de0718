// Whatif: memory per GPU and step time of the training setups practitioners
// choose between (DDP, ZeRO-1/2/3 with or without offload, FSDP full and
// hybrid shard, fp32/fp16/bf16/FP8, full/LoRA/QLoRA fine-tuning, a frozen 8-
// or 4-bit base with 8-bit Adam, checkpointing of every k-th layer,
// torch.compile), for one model on one GPU type from the catalogue
// (sim/gpu_specs.h).
//
// One cost model: each row is a TrainingSetup costed by PlanSimulator (the
// simulator `simulate` and `search --cost-model sim` use) as a one-stage plan
// (dp = the row's GPUs, tp 1, gradient accumulation as micro-batches), with
// the memory model of sim/memory_model.h and the offload rules of
// sim/offload.h. What a measurement would supply, the per-layer forward and
// backward times, comes from a roofline profile set built here (WhatifProfile)
// for that row: matrix-multiply FLOPs at the GPU's dense peak for the row's
// precision x `gemm` efficiency, plus elementwise traffic (norms,
// activations, residuals, softmax) at the HBM bandwidth x `memory`
// efficiency. Rows differ in that profile only where the work differs:
//  - LoRA/QLoRA: the frozen base's backward computes input gradients only
//    (one GEMM instead of two), the adapters' GEMMs are added;
//  - QLoRA / frozen 8-bit base: each projection's weight is dequantised before
//    its forward and its backward GEMM (read the packed weight, write 16 bits),
//    at the HBM roofline; or the measured QLoRA/LoRA slowdown
//    (WhatifCalibration::qlora_dequant_factor) where a profile gives one;
//  - FP8 (Transformer Engine recipe): the GEMMs at the fp8 peak, the rest as bf16;
//  - torch.compile: the elementwise traffic x kCompileElementwiseFactor (fusion), a stated assumption;
//  - torch.autocast (the PyTorch rows: fp32 parameters, 16-bit compute): each forward, and each
//    recomputed forward, casts every fp32 weight to the 16-bit type (read 4 bytes, write 2) at the HBM
//    roofline; their model states are counted as Megatron's accounting does (fp32 parameters and
//    gradients, Adam states, the 16-bit weight copies) unless --accounting names another;
//  - the runtime (sim/runtime_overheads.h, WhatifInput::launch): a block's forward and backward each take at
//    least their kernel count x the GPU's per-kernel floor; in eager mode the step takes max(GPU, host), the
//    host's time to issue it itemised from the code (ops, autograd nodes, checkpoint regions, DDP's and
//    FSDP2's hooks, the optimizer's tensors) at the probe's per-op costs;
//  - PyTorch DDP (the DDP-framework rows on more than one GPU): its gradient buckets, in memory (a second
//    copy of the gradients) and in time (bucketed all-reduces overlapped with the backward, the copies).
// The multi-GPU rows (DDP, ZeRO without offload, FSDP) are not offered on one GPU; ZeRO-Offload is (its
// single-GPU use). --offload applies to the ZeRO rows that do not choose their own offload (FSDP, the
// PEFT+ZeRO rows), never to rows without ZeRO.
// A row whose precision the GPU lacks (fp8 or bf16 on V100) is not offered
// (WhatifResult::offered false, with the reason).
//
// Thread-safety: pure functions of their inputs (the catalogue is read-only
// once the CLI has loaded --gpu-spec files).
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/gpu_specs.h"
#include "base/json_util.h"
#include "sim/memory_model.h"
#include "sim/model_shape.h"
#include "sim/offload.h"
#include "sim/plan.h"
#include "sim/plan_simulator.h"
#include "sim/profile.h"
#include "sim/runtime_overheads.h"

namespace hetplan {

// torch.compile's assumed effect: its fusion halves the elementwise HBM traffic (norm, activation, residual
// and dropout chains become single kernels); the GEMMs are unchanged. An assumption, stated on the row.
inline constexpr double kCompileElementwiseFactor = 0.5;
// Elementwise HBM traffic of one transformer block per token, in units of hidden_size x 2 bytes, forward
// (eager PyTorch: two norms, residual adds, the MLP activation, rotary/bias and softmax-side tensors,
// each read and written once); the backward moves twice that.
inline constexpr double kElementwiseBytesPerTokenHidden = 20;
// The backward's time per forward's for the attention, the adapters, the elementwise kernels and a trained
// GEMM (input and weight gradients); a frozen GEMM's backward computes input gradients only (1x).
inline constexpr double kBackwardPerForward = kTrainingFlopsPerForwardFlop - 1;
// torch.autocast's cast of an fp32 weight to 16 bits in each forward: read 4 bytes, write 2.
inline constexpr double kAutocastCastBytesPerParam = 6;

// Measured corrections a profile folder may carry (whatif_calibration.json; every key optional):
//   {"host": {"h2d_gbs": .., "d2h_gbs": .., "cpu_adam_params_per_s": .., "cpu_cast_params_per_s": ..},
//    "training": {"qlora_dequant_factor": .., "gemm_efficiency": .., "attention_efficiency": ..,
//                 "elementwise_efficiency": .., "optimizer_hbm_efficiency": ..},
//    "inference": {"decode_hbm_efficiency": {"bf16": .., "int4": ..}, "prefill_compute_efficiency": ..,
//                  "kernel_floor_us": .., "eager_op_us": .., "decode_kernels_per_layer": .., "int4_row_params_per_s": ..,
//                  "attention_hbm_efficiency": ..,
//                  "kv_repeat_materialised": bool, "static_kv_cache": bool,
//                  "decode_hbm_efficiency_net_of_floor": bool}}
// The inference keys are mechanism constants measured by micro-benchmarks (sim/inference.h): the decode
// HBM efficiency of the projections' GEMV kernels alone, the per-kernel floor of a graph of small kernels,
// the kernel count of one decode step, the int4 kernel's per-row cost; the two booleans name what the
// measured implementation does (HF-style eager attention with a static cache).
// Written by scripts/gpu_whatif_calibrate.sh. Absent values stay 0 (= the stated defaults).
struct WhatifCalibration {
  std::string path;                  // empty: none read
  HostSpec host;                     // zero fields: defaults
  double qlora_dequant_factor = 0;   // QLoRA step time / LoRA step time, measured; 0: roofline
  double gemm_efficiency = 0;        // 0: WhatifInput::gemm_efficiency
  // Attention (fused SDPA forward + backward) FLOPs as the roofline counts them (4 x seq x heads x head_dim
  // per token forward, twice that backward) over the measured time, as a fraction of the 16-bit peak;
  // 0: gemm efficiency (the roofline's default for attention).
  double attention_efficiency = 0;
  // The roofline's elementwise bytes (kElementwiseBytesPerTokenHidden) of one block forward + backward over the
  // time that block's measured forward + backward leaves after its GEMMs and attention, as a fraction of the HBM
  // bandwidth; 0: WhatifInput::memory_efficiency.
  double elementwise_efficiency = 0;
  // The GPU optimizer step: the roofline's kCpuAdamBytesPerParam bytes per parameter over the measured time
  // of the trainer's step on a slice (fp32 gradients made, fused Adam, 16-bit weights written back), as a
  // fraction of the HBM bandwidth; 0: WhatifInput::memory_efficiency.
  double optimizer_hbm_efficiency = 0;
  double decode_hbm_efficiency_bf16 = 0, decode_hbm_efficiency_int4 = 0;
  double prefill_compute_efficiency = 0;
  double kernel_floor_us = 0, decode_kernels_per_layer = 0, int4_row_params_per_s = 0;
  double eager_op_us = 0;  // host time per eager op (inference.eager_op_us); 0: the LaunchModel default
  double attention_hbm_efficiency = 0;
  bool kv_repeat_materialised = false, static_kv_cache = false;
  // Whether decode_hbm_efficiency was measured net of the GEMV kernels' floor (scripts/gpu_whatif_calibrate.py
  // since the floor is charged to every kernel); false (older files): it holds their floor already, so the
  // streamed kernels are not charged it again (InferenceSetup::streamed_kernels_pay_floor).
  bool decode_hbm_efficiency_net_of_floor = false;
};
// Reads `dir`/whatif_calibration.json if it exists (else an empty calibration). Throws InputError.
WhatifCalibration read_whatif_calibration(const std::string& dir);

struct WhatifInput {
  ModelShape shape;
  int seq = 2048;
  int micro_batch = 1;  // sequences per GPU per micro-batch
  int gbs = 0;          // 0: micro_batch x GPUs (no accumulation)
  const GpuSpec* gpu = nullptr;
  int gpus = 8, gpus_per_node = 8;
  double memory_gb = 0;   // per GPU; 0: the datasheet's
  double intra_gbs = 0;   // 0: the catalogue's link
  double inter_gbs = 25;  // per GPU between nodes
  double cpu_memory_gb = 1024;
  double gemm_efficiency = 0.6;    // achieved fraction of the dense peak on matrix multiplies
  double memory_efficiency = 0.75; // achieved fraction of HBM bandwidth on elementwise kernels
  LaunchModel launch;              // eager (default) or CUDA graphs, and the per-kernel floors
  WhatifCalibration calibration;
};

// One row: a training setup and how it runs. Rows are data (standard_whatif_rows gives the usual set).
struct WhatifRow {
  std::string name;
  TrainingSetup setup;
  int gpus = 0;               // 0: all of WhatifInput::gpus; 1: a single GPU
  bool torch_compile = false;
  bool autocast = false;      // torch.autocast over fp32 parameters (the weights are cast in every forward)
  bool multi_gpu = false;     // needs more than one GPU (DDP, ZeRO without offload, FSDP)
  std::string framework;      // "PyTorch DDP", "DeepSpeed", "FSDP", "PEFT", "Transformer Engine"
  std::vector<std::string> assumptions;
};

struct WhatifResult {
  std::string name;
  bool offered = true;
  std::string not_offered;  // why, when !offered
  int gpus = 0, accumulation = 1, gbs = 0;
  double step_ms = 0, tokens_per_s = 0, mfu = -1;
  double gpu_ms = 0;   // the GPU's step (the simulator's)
  double host_ms = 0;  // the host's time to issue the eager step (0: CUDA graphs); step_ms = max(gpu_ms, host_ms)
  MemoryBreakdown memory;  // the rank with the largest total
  double capacity_bytes = 0;
  bool fits = false;
  std::vector<std::string> assumptions;  // the row's and the model's, in order
};

// The usual rows over a base setup (precision, recompute, flash attention and framework constant are the
// base's unless the row is about them). `lora_rank`/`lora_targets` for the PEFT rows. The base's offload
// goes to FSDP and the PEFT+ZeRO rows only (parameter offload to their ZeRO-3 ones). Accounting: the
// base's when `accounting_given`, else each framework's (PyTorch AMP: Megatron's; DeepSpeed: its
// estimator's; FSDP: FSDP2's, kFsdp2).
std::vector<WhatifRow> standard_whatif_rows(const TrainingSetup& base, int lora_rank, unsigned lora_targets,
                                            int gpus_per_node, bool accounting_given = false);

// The row a DeepSpeed config describes ("ds_config": its stage, offload, precision and sizes; DeepSpeed's
// accounting unless `accounting_given`). REQUIRES: resolve_deepspeed_auto done.
WhatifRow deepspeed_config_row(const TrainingSetup& base, const DeepSpeedRunConfig& c, bool accounting_given);

// DeepSpeed's settings a row assumes, in words (its bucket sizes, overlap_comm, pinned or pageable offload).
std::string deepspeed_settings_text(const TrainingSetup& s);

// The simulator's inputs for a row: a one-type cluster, the roofline profile set and the one-stage plan.
struct WhatifSimulation {
  Cluster cluster;
  ProfileSet profiles;
  SimulationOptions options;
  PlanResult plan;
  int gbs = 0;
  std::string device_type;  // the profile/cluster type name (the catalogue name, alphanumerics only)
  std::vector<ordered_json> profile_files;  // the profile set as Metis-format files (for export)
  std::vector<std::string> profile_names;
};
WhatifSimulation whatif_simulation(const WhatifInput& in, const WhatifRow& row);

// Costs a row. Throws InputError for inputs no row can run (sizes), never for a precision the GPU lacks
// (that row is returned with offered = false).
WhatifResult cost_whatif_row(const WhatifInput& in, const WhatifRow& row);
// "" if the GPU runs the row's precision, else why not ("V100 has no bf16 (it supports fp32, fp16; ...)").
std::string whatif_unsupported(const WhatifInput& in, const WhatifRow& row);

// Writes the row's simulator inputs (profiles/, hostfile, clusterfile.json, plan.json) to `dir`, so that
// `hetplan simulate --plan dir/plan.json` costs the same setup.
void export_whatif_row(const WhatifInput& in, const WhatifRow& row, const std::string& dir);

// Micro-batches per step: gbs / (micro_batch x gpus). Throws InputError when that product overflows the
// batch limit or does not divide gbs.
int whatif_accumulation(const WhatifInput& in);

// The TrainingSetup's compute precision on the GPU's matrix units.
ComputePrecision compute_precision(Precision p);

// The constants of the model (FLOP and byte counts of in.shape at in.seq), of the roofline (efficiencies:
// whatif's from `in`, the analytic profiles' and inference's defaults) and of the GPU in.gpu, as
// `hetplan whatif --print-constants` prints them for scripts/gpu_whatif_calibrate.py. REQUIRES: in.gpu.
ordered_json whatif_constants_json(const WhatifInput& in);

}  // namespace hetplan
