// PipelineRuntime: one rank's part of a replayed plan. It builds the rank's
// stage of the GPT (its layers, its tp shard; under interleaved 1F1B one
// model chunk per virtual stage), the process groups it belongs to, and runs
// training iterations under a GPipe, 1F1B or interleaved 1F1B schedule (the
// op order of sim/schedule.h, the one the simulator costs):
// micro-batches flow forward and gradients backward through point-to-point
// c10d sends and receives, gradients are added into fp32 main gradients
// and summed over the stage's data-parallel replicas (and, with tied
// embeddings split over the first and last stages, between those), and
// Adam steps on fp32 master weights (profiler/mixed_precision.h), as
// Megatron trains with bf16 weights. Losses are scaled by each replica's
// share of the global batch, so the update equals single-process training
// on the same global batch.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "executor/pipeline_layout.h"
#include "profiler/distributed.h"
#include "profiler/gpt.h"
#include "base/json_util.h"
#include "sim/schedule.h"

namespace hetplan::executor {

struct ReplayConfig {
  profiler::GPTConfig model;
  int gbs = 1;
  int warmup = 1, iters = 3;
  Schedule schedule = Schedule::k1F1B;  // each stage's op order: StageOps (sim/schedule.h)
                                        // (interleaved: the layout's virtual_stages chunks)
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;
  double lr = 1e-3;
  // ZeRO over each stage's data-parallel replicas. 1: sharded fp32 masters
  // and Adam state (MixedPrecisionAdam; the gradient sum is one all-reduce
  // of the flat fp32 buffer). 2: also the fp32 gradients, reduce-scattered
  // per layer and micro-batch; 3: also the 16-bit weights, gathered per
  // layer just in time (executor/zero_optimizer.h).
  int zero_stage = 0;
  // ZeRO-2/3: each layer unit's reduce-scatter left running while the backward goes on, waited for at
  // the micro-batch's end (ZeroOptimizer::set_overlap; DeepSpeed's overlap_comm). ZeRO-1 (one model
  // chunk per rank, dp > 1): the summed main gradients reduce-scattered layer by layer during the
  // step's last backward (Megatron's distributed optimizer with --overlap-grad-reduce), on
  // ZeroOptimizer's stage 1; otherwise ZeRO-1 reduce-scatters in the optimizer step.
  bool overlap_grad_reduce = false;
  // ZeRO-3: the next layer's weights all-gathered while the current layer computes, in the forward and
  // the backward (ZeroOptimizer::prefetch; Megatron's --overlap-param-gather, FSDP's prefetch).
  bool overlap_param_gather = false;
  uint64_t data_seed = 42;
  std::chrono::milliseconds timeout{300000};
  std::string dump_dir;  // if set: parameters after the last step, for checks
};

// The global batch of iteration `step`: token ids and targets [gbs, seq],
// the same on every rank and in the single-process reference.
std::pair<torch::Tensor, torch::Tensor> global_batch(const ReplayConfig& c, int step);

struct Span {
  std::string name;  // forward, backward, send, recv, allreduce, optimizer
  double start_ms, end_ms;
  int micro_batch;
  int chunk = 0;  // the model chunk (interleaved 1F1B); 0 otherwise
};

struct RankReport {
  int rank = 0, stage = 0, replica = 0, tp_index = 0;
  std::vector<double> iteration_ms;  // measured iterations
  std::vector<double> losses;        // this rank's share of each step's loss (last stage, tp index 0)
  // Memory over the measured iterations (the warmup's excluded), as the simulator predicts it (MiB;
  // nullopt where not measurable, memory_note says why). peak_memory_mb = peak_allocated_mb (0 where not
  // measured): the larger of the forward/backward phase's and the optimizer step's peak of live tensors.
  double peak_memory_mb = 0, peak_forward_backward_mb = 0, peak_optimizer_mb = 0;
  std::optional<double> peak_allocated_mb;
  std::optional<double> peak_reserved_mb;   // CUDA caching allocator's peak reserved (cached) bytes
  std::optional<double> device_used_mb;     // max over the run of cudaMemGetInfo total - free (context, NCCL included)
  std::string memory_note;
  long long overlapped_collectives = 0;  // ZeRO-1/2/3 reduce-scatters started while another was running
  long long prefetched_gathers = 0;      // ZeRO-3 all-gathers started ahead of their layer (overlap_param_gather)
  std::vector<Span> trace;           // the last measured iteration
};

// Runs warmup + iters steps on this rank. Throws on errors (after which the
// launcher stops the other ranks).
RankReport run_pipeline_rank(const PipelineLayout& layout, const ReplayConfig& config, const profiler::DistEnv& env);

ordered_json rank_report_to_json(const RankReport& r);
RankReport rank_report_from_json(const ordered_json& j);

}  // namespace hetplan::executor
