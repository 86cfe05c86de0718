// Sequence parallelism (Megatron's --sequence-parallel, with tp) and context
// parallelism (--context-parallel-size, ring attention over a cp group): the
// costs they change, as pure functions the cost path (sim/plan_cost.cc)
// calls. The memory side (activations split by tp between the blocks, and by
// cp everywhere) is sim/memory_model's, given the setup. The story is in
// sim/sequence_parallel.md.
//
// Sequence parallelism: each block's two tensor-parallel all-reduces of the
// forward (and two of the backward) become an all-gather before the column-
// parallel GEMMs and a reduce-scatter after the row-parallel ones. On a ring a
// reduce-scatter plus an all-gather move exactly an all-reduce's bytes in the
// same steps, but NCCL runs them as two calls, each with its own latency and
// at a lower bus bandwidth than the all-reduce's (measured: sim/network.h,
// intra_node_gather_seconds), so each all-reduce replaced costs
// all-gather + reduce-scatter - all-reduce more (sp_collective_extra_s).
//
// Context parallelism over cp ranks (Megatron's rank order: tp fastest, then
// cp, then dp; a stage's dp counts dp x cp ranks): each cp group takes one
// data-parallel replica's share of the micro-batch, every rank 1/cp of each
// sequence (load-balanced causal chunks), so each rank computes 1/cp of the
// replica's FLOPs. Each block's attention exchanges K and V around the ring in
// cp - 1 steps, each overlapped with one step's attention compute; the
// backward sends K, V and their gradients. Gradients are reduced over all
// dp x cp ranks, as Megatron's distributed optimizer does.
//
// Plain functions; thread-safe; no allocation.
#pragma once

#include "sim/model_shape.h"

namespace hetplan {

// What a rank of a context-parallel group costs from the profiles, for a group's share of `share` samples
// (PlanCostModel's slowest replica; the search's estimates). A rank runs every layer on share x s / cp tokens
// and computes 1/cp of its group's causal attention (share x s^2 / cp scores): where cp divides the share,
// the work of share / cp whole sequences, which their own profile measured with the host's issue time at
// that size (the rank's layers keep their op count: at small shares the host, not 1/cp of the share's GPU
// time, paces them), so `samples` = share / cp and `divisor` 1; another share takes 1/cp of the share's
// profile (`samples` = share, `divisor` = cp). cp 1: the share itself. REQUIRES: cp >= 1.
struct CpRankWork {
  int samples = 0;  // the profile's micro-batch
  int divisor = 1;  // a rank's time is that profile's time / divisor
};
inline CpRankWork cp_rank_work(int share, int cp) {
  if (cp > 1 && share % cp == 0) return {share / cp, 1};
  return {share, cp};
}

// Sequence parallelism over a profile that ran the tensor-parallel all-reduces (every profile: `hetplan
// profile` never splits the sequence, and analytic profiles price the collectives as all-reduces): what the
// stage's forward and backward add per micro-batch when each all-reduce of the activations becomes an
// all-gather and a reduce-scatter of the same buffer. `all_reduce_s`: one all-reduce of the activations;
// `gather_s`: one all-gather or reduce-scatter of them (Network::intra_node_gather_seconds). As Megatron
// and replay run them: a block's forward and its backward each replace 2 all-reduces by 2 all-gathers and
// 2 reduce-scatters; the embedding's forward reduce-scatters instead of all-reducing, and its backward
// all-gathers (nothing before); the head's forward all-gathers (nothing before), its backward
// reduce-scatters instead of all-reducing. Seconds; negative where a reduce-scatter alone is cheaper.
struct SpCollectiveExtra {
  double forward_s = 0, backward_s = 0;
};
SpCollectiveExtra sp_collective_extra_s(double all_reduce_s, double gather_s, int blocks, bool embedding, bool head);

// Bytes each rank sends per ring step of one block's forward attention: K and V of its chunk
// (samples x seq / cp tokens x num_kv_heads x head_dim / tp, bf16).
double cp_kv_step_bytes(const ModelShape& m, long long seq, int cp, int tp, double samples);

// The share of a block's forward FLOPs that is attention (scores and weighted sum) at sequence `seq`.
double attention_flop_share(const ModelShape& m, long long seq);

// Bytes the slowest rank of a cp ring streams through memory per block beyond the attention kernels and
// the exchange: Megatron's ring (Transformer Engine) merges each of the cp - 1 steps after the local one
// into the running result by log-sum-exp (reads the result and the step's partial output, writes the
// result: 3 passes), and in the backward adds each step's dQ into the rank's dQ and its dK/dV into those
// travelling round the ring (3 passes each). With load-balanced chunks, rank r's steps cover 2 c query
// rows and c keys for each of the r sources before it and c rows and 2 c keys for the others; rank
// cp - 1 (every step 2 c rows, c keys) moves the most over its forward and backward (as much as rank 0
// without grouped-query heads). O = samples x seq / cp x num_heads x head_dim / tp
// x 2 bytes (the rank's output or dQ), KV = cp_kv_step_bytes: forward 3 (cp - 1) O, backward
// 3 (cp - 1) (O + KV / 2). Zero at cp 1.
struct RingMergeBytes {
  double forward = 0, backward = 0;
};
RingMergeBytes ring_merge_bytes(const ModelShape& m, long long seq, int cp, int tp, double samples);

// Bytes a cp ring copies per block besides the merge and the attention kernels, for the rank that moves the
// most (rank cp - 1, whose steps all cover its 2 c query rows): the forward packs the rank's K and V into
// one send buffer (reads both, writes the buffer: 2 KV; Transformer Engine concatenates k and v into its
// p2p buffer, replay stacks them) and the backward packs the first step's dK and dV likewise (2 KV). Each of
// the cp - 1 backward steps after the first runs again the passes a fused attention backward makes once
// per call, which the profiled whole-sequence attention made once: the dot(dO, O) prologue over the step's
// rows (reads dO and O: 2 O) and the conversion of its fp32 dQ accumulator to 16 bits (reads 4 bytes and
// writes 2 per element: 3 O). With O and KV as for ring_merge_bytes: forward 2 KV, backward
// 2 KV + 5 (cp - 1) O. Zero at cp 1.
RingMergeBytes ring_copy_bytes(const ModelShape& m, long long seq, int cp, int tp, double samples);

// The compute stretch of one block's ring: the attention steps that hide an exchange run beside NCCL's
// kernel, which shares the SMs, so each runs slower by `slowdown` for as long as the exchange beside it
// runs (sim/dp_overlap.h's overlap_slowdown_s: (slowdown - 1) x min(window, comm); the caller passes the
// profiles' measured stretch beside a 16-bit all-gather, the same pure copy traffic). Forward: cp - 1 steps,
// each step_comm_s beside attention_s / cp. Backward (ring_backward_exposed_s's windows,
// W = 2 attention_s / cp): s beside step 0's W, 2 s beside each of the cp - 2 middle steps', s beside
// step cp - 1's; the last dK/dV send has no compute beside it. 0 at cp 1 or slowdown <= 1.
// REQUIRES: cp >= 1.
double ring_forward_stretch_s(int cp, double step_comm_s, double attention_s, double slowdown);
double ring_backward_stretch_s(int cp, double step_comm_s, double attention_s, double slowdown);

// Exposed time of one block's forward ring exchange: cp - 1 steps of `step_comm_s` each against 1/cp of
// the rank's attention time `attention_s` each: (cp - 1) x max(0, step_comm - attention / cp).
// REQUIRES: cp >= 1.
double ring_exposed_s(int cp, double step_comm_s, double attention_s);

// Exposed time of one block's backward ring (Transformer Engine's): each of the cp steps computes the
// backward of 1/cp of the attention (W = 2 attention_s / cp: twice the forward's FLOPs) while the link
// carries the next step's K/V (steps 0 .. cp - 2) and the dK/dV the step before accumulated (steps
// 1 .. cp - 1); after the last step the dK/dV go home with nothing left to hide them:
// max(0, s - W) [step 0] + (cp - 2) max(0, 2 s - W) + max(0, s - W) [step cp - 1] + s, s = step_comm_s
// (one step's K/V bytes; dK/dV are as many). 0 at cp 1. REQUIRES: cp >= 1.
double ring_backward_exposed_s(int cp, double step_comm_s, double attention_s);

}  // namespace hetplan
