// Context parallelism's attention in replay (Megatron's cp; the story: sim/sequence_parallel.md, "Replay").
//
// A cp group of n ranks splits every sequence into 2n equal chunks of c tokens; rank r holds chunks r and
// 2n - 1 - r, in that order (context_parallel_positions, profiler/tensor_parallel.h). One block's attention
// over them is two autograd functions:
//
//   gather_kv_for_context_parallel  forward: one all-gather of this rank's K and V (stacked) into one
//       buffer, then one indexed copy puts the keys in global chunk order with the key/value heads expanded
//       to the query heads (grouped-query attention); backward: one sum over each group's expanded heads,
//       one indexed copy back into rank order, one reduce-scatter. No per-chunk slices, cats or zero fills.
//   context_parallel_attention      forward: per query chunk j, one causal attention over key chunks 0..j,
//       its K and V narrow() views of the gathered buffer (no copies), the diagonal chunk masked bottom-right
//       (query i of the chunk attends keys up to i + j c); keeps each chunk's output and log-sum-exp.
//       Backward: the kernel's backward per chunk; dK/dV of the longer prefix are copied into one buffer of
//       the whole sequence (zeros past it), the shorter prefix's added in place with narrow().add_.
//
// They are two functions, not one, so that selective recomputation (which checkpoints the core attention)
// recomputes the attention and not the K/V exchange, as Megatron keeps the exchange outside.
//
// Kernels: on CUDA in bf16/fp16 (head dim a multiple of 8, at most 256) and LibTorch >= 2.3, ATen's flash
// kernel (_scaled_dot_product_flash_attention and its _backward), whose causal mask is bottom-right aligned
// when there are fewer queries than keys (checked on H100: scripts/gpu_cp_attention_check.sh). Not cuDNN's
// attention: ATen builds its cuDNN graph with cudnn_frontend's set_causal_mask, the top-left aligned mask
// (query i attends keys j <= i), which is wrong for every chunk but the first. Elsewhere (the CPU tests,
// LibTorch 1.13): the same chunks with an explicit mask (masked_self_attention), the backward by running
// the chunk again under autograd: the same math, so the tests cover the buffers and the collectives.
//
// Thread-safety: none (a block runs on one thread). Lifetimes: the group and the chunk index passed by
// reference must outlive every autograd graph built with them (the TransformerBlock owns both).
#pragma once

#include <torch/torch.h>

#include "profiler/tensor_parallel.h"

namespace hetplan::profiler {

// Where the 2n chunks live, as index tensors on one device (built once per block, so that no small
// host-to-device copy stalls each call).
struct ContextParallelChunks {
  torch::Tensor chunk_of_slot;  // [n, 2] int64: the global chunk held by rank r in its half h (r, then 2n-1-r)
  torch::Tensor rank_of_chunk;  // [2n] int64: the rank holding global chunk j
  torch::Tensor half_of_chunk;  // [2n] int64: 0 for j < n, 1 past it
  static ContextParallelChunks build(const TensorParallelGroup& cp, torch::Device device);
  bool ready_on(torch::Device device) const { return chunk_of_slot.defined() && chunk_of_slot.device() == device; }
};

// Every cp rank's keys and values, [2, b, kv_heads * group, 2 n c, d] (0: K, 1: V) in global token order,
// each key/value head repeated `group` times in place (query head i reads expanded head i). k, v: this
// rank's [b, kv_heads, 2 c, d] (its two chunks). Backward: the gradients of k and v (summed over the
// group's ranks, this rank's chunks). REQUIRES: cp.size() > 1; `chunks` built for cp on k's device.
torch::Tensor gather_kv_for_context_parallel(const torch::Tensor& k, const torch::Tensor& v, int64_t group,
                                             const TensorParallelGroup& cp, const ContextParallelChunks& chunks);

// Causal attention of this rank's queries q [b, heads, 2 c, d] (its chunks r, 2n - 1 - r) over the
// gathered `kv` [2, b, heads, 2 n c, d] (gather_kv_for_context_parallel's output): [b, heads, 2 c, d].
torch::Tensor context_parallel_attention(const torch::Tensor& q, const torch::Tensor& kv, const TensorParallelGroup& cp);

}  // namespace hetplan::profiler
