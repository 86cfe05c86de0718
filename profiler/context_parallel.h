// Context parallelism's attention in replay: Megatron's ring attention (Transformer Engine's cp_comm_type
// "p2p"; the story: sim/sequence_parallel.md, "Replay").
//
// A cp group of n ranks splits every sequence into 2n equal chunks of c tokens; rank r holds chunks r and
// 2n - 1 - r, in that order (context_parallel_positions, profiler/tensor_parallel.h). The K and V of the
// group go round the ring: at step i (0 <= i < n) rank r holds those of rank src = r - i (mod n), the
// exchange for step i + 1 (one send to r + 1 and one receive from r - 1, TensorParallelGroup::ring_shift_async)
// running while step i's attention computes. Each step is one attention call whose mask every kernel has:
//   i = 0      causal over this rank's 2c x 2c tokens (its own two chunks: the square mask is exact);
//   src < r    all 2c queries over chunk src, the source's first c keys, unmasked;
//   src > r    the second chunk's c queries over all 2c keys of the source, unmasked;
// (with the load-balanced chunks every rank computes the same work). Each call returns its output and its
// rows' log-sum-exp; the partial outputs are merged in place by their log-sum-exp (the output scaled by
// exp(lse - lse'), lse' = logaddexp). The backward runs the ring again: per step the kernel's backward
// given the merged output and log-sum-exp (which makes each step's dQ, dK, dV exact parts of the whole),
// the K/V for the next step and the dK/dV accumulated so far for the current source travelling round the
// ring beside the compute; after n steps each rank holds its own dK/dV, summed over the group.
//
// Kernels: on CUDA in bf16/fp16, cuDNN's fused attention (ATen's _scaled_dot_product_cudnn_attention and its
// _backward, LibTorch >= 2.6, head dim a multiple of 8 and at most 128: what plain SDPA runs on H100/H200,
// hence what the profiles measured) else ATen's flash kernel (>= 2.3); HETPLAN_CP_ATTENTION=flash picks the
// flash kernel, =math the reference. Elsewhere (the CPU tests, LibTorch 1.13) the same steps in plain
// tensor math, forward and backward written out as the kernels compute them (scores, log-sum-exp, the
// backward from the merged output and log-sum-exp), so the tests cover the ring, the merge and the
// backward's use of the merged statistics.
//
// Selective recomputation (which checkpoints the core attention) runs the ring again in the backward, as
// Megatron's checkpointed Transformer Engine attention does.
//
// Thread-safety: none (a block runs on one thread). Lifetimes: the group passed by reference must outlive
// every autograd graph built with it (the TransformerBlock owns it).
#pragma once

#include <torch/torch.h>

#include "profiler/tensor_parallel.h"

namespace hetplan::profiler {

// Causal attention of this rank's queries q [b, heads, 2 c, d] (its chunks r, 2n - 1 - r) over the keys
// and values of every rank of the cp group, this rank's being k, v [b, kv_heads, 2 c, d] with
// heads = kv_heads x group (grouped-query attention: query head i reads key/value head i / group):
// [b, heads, 2 c, d]. Backward: the gradients of q, k and v (k's and v's summed over the group's ranks).
// REQUIRES: cp.size() > 1; every rank of the group calls it with equal shapes, in the same order.
torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t group,
                             const TensorParallelGroup& cp);

}  // namespace hetplan::profiler
