// simulate_timeline: one training iteration as a task graph (Boost.Graph),
// scheduled with each device group as a resource: the "explain" path of a
// plan's iteration time, with every task's span.
//
// Tasks are the forward and backward of every micro-batch on every stage,
// the p2p transfers of activations (stage i -> i + 1) and gradients
// (i + 1 -> i), each stage's data-parallel gradient all-reduce and its
// optimizer step. Edges are data dependencies plus the order each resource
// runs its tasks in: a stage's compute follows the schedule's op order
// (StageOps, sim/schedule.h), each link sends in micro-batch order. A task
// starts when all its predecessors are done, so the makespan is the longest
// path, computed once in topological order. Every backward but a stage's
// first also pays the stage's gradient accumulation
// (StageCosts::accumulation_ms). PlanCostModel::iteration_ms
// (sim/plan_cost.h) computes the same makespan without the graph, bit for bit.
//
// Promises: the iteration time, the bubble fraction, per-stage busy time,
// the peak number of micro-batches each stage holds, tokens/s and MFU, and
// the spans for a Chrome trace named "forward", "backward", "send", "recv",
// "allreduce" and "optimizer" (the names replay's trace uses), sorted by
// start time.
//
// Interleaved 1F1B (virtual_stages v > 1): each stage (pipeline rank) runs
// v model chunks; TimelineInput::chunks holds the costs of the pp * v
// virtual stages in the model's order (virtual stage k is chunk k / pp of
// stage k % pp, sim/schedule.h). Forwards then flow k -> k + 1, so the last
// stage's chunk c sends to the first stage's chunk c + 1, and a stage's
// sends leave in the order its own ops produce them (micro-batch order
// without interleaving). Accumulation is per chunk (every backward of a chunk
// but its first); the all-reduce and optimizer stay the stage's.
//
// REQUIRES: at least one stage and one micro-batch, and
// interleaving_error(schedule, stages, microbatches, virtual_stages) empty
// with chunks.size() == stages x virtual_stages where virtual_stages > 1
// (else InputError); durations >= 0.
// Thread-safety: pure functions of their arguments; nothing is stored, and
// results own their data.
#pragma once

#include <string>
#include <vector>

#include "base/json_util.h"
#include "sim/schedule.h"

namespace hetplan {

struct StageCosts {
  std::string label;         // e.g. "stage 0: A100 x4 (dp 2, tp 2), layers [0, 5)"
  double forward_ms = 0;     // one micro-batch
  double backward_ms = 0;
  double accumulation_ms = 0;   // added to the backward of every micro-batch but the first
  double send_forward_ms = 0;   // activation p2p to the next stage (unused on the last)
  double send_backward_ms = 0;  // gradient p2p to the previous stage (unused on the first)
  double allreduce_ms = 0;      // data-parallel gradient all-reduce, after the stage's last backward
  double optimizer_ms = 0;
  // >= 1: how much slower the stage computes when it never idles (its GPUs
  // then run at power-limited clocks); PlanSimulator applies it to the
  // stage that sets the pace and marks it power_limited.
  double sustained_factor = 1;
  bool power_limited = false;
  double peak_flops = 0;        // sum of the stage's GPUs' peak FLOP/s (0: unknown, no MFU)
};

struct TimelineInput {
  std::vector<StageCosts> stages;
  int microbatches = 1;
  Schedule schedule = Schedule::k1F1B;
  int virtual_stages = 1;  // model chunks per stage (> 1: interleaved 1F1B)
  // virtual_stages > 1: the virtual stages' forward, backward, accumulation and send times, in model
  // order (the stages' own fields of these are then unused); their labels name the chunks.
  std::vector<StageCosts> chunks;
  double tokens = 0;       // tokens per iteration, for tokens/s
  double model_flops = 0;  // model FLOPs per iteration, for MFU
};

struct Span {
  std::string name;  // forward, backward, send, recv, allreduce, optimizer
  int stage = 0;
  int microbatch = -1;  // -1 for allreduce and optimizer
  int peer = -1;        // the other stage of a send or recv
  int chunk = 0;        // the model chunk of a forward, backward, send or recv (0 without interleaving)
  double start_ms = 0, end_ms = 0;
};

struct TimelineResult {
  double iteration_ms = 0;
  double bubble_fraction = 0;            // 1 - forward/backward busy time / (stages x iteration)
  std::vector<double> busy_ms;           // per stage: forward + backward + optimizer
  std::vector<int> peak_in_flight;       // per stage: most (micro-batch, chunk) pairs forwarded but not yet backwarded
  double tokens_per_s = 0;
  double mfu = -1;                       // -1 when the peak FLOP/s are unknown
  std::vector<Span> spans;
};

TimelineResult simulate_timeline(const TimelineInput& input);

// Chrome trace-event JSON (opens in Perfetto and chrome://tracing): one
// process per stage with compute and communication threads.
ordered_json chrome_trace(const TimelineResult& result, const std::vector<StageCosts>& stages);

}  // namespace hetplan
