// LayerWork: the work one Metis layer (embedding, transformer block, head)
// does in a forward+backward pass, split into the kernel classes that convert
// differently between GPUs: its GEMMs (shapes, FLOP-bound), its fused causal
// attention (FLOPs), its tensor-parallel all-reduces (bytes over the link)
// and its memory-bound elementwise traffic (HBM bytes).
//
// It promises one count, from ModelShape (the one FLOP count): the profiler
// times exactly these GEMMs alone (profiler/kernel_classes.h); the analytic
// profiles and the profile transfer (sim/layer_time_model.h) price them. The
// GEMMs' FLOPs over a block sum to ModelShape's linear FLOPs times the passes;
// attention to ModelShape::attention_forward_flops_per_token times the passes.
//
// REQUIRES: tp divides the sharded dimensions (heads, kv heads, ffn, vocab
// for the head: the caller checks the model as the profiler does).
// Thread-safety: pure functions. Allocates nothing.
#pragma once

#include <string>

#include "sim/memory_model.h"
#include "sim/model_shape.h"

namespace hetplan {

enum class LayerKind { kEmbedding, kBlock, kHead };
// Metis layer index -> kind (0 embedding, last head, blocks between).
inline LayerKind layer_kind(int metis_layer, int metis_layers) {
  return metis_layer == 0 ? LayerKind::kEmbedding
                          : (metis_layer + 1 == metis_layers ? LayerKind::kHead : LayerKind::kBlock);
}

// One GEMM per rank: (m x k) times (k x n), run `passes` times (forward, input
// gradient, weight gradient, and the forward again under full recomputation).
struct GemmDims {
  long long m = 0, k = 0, n = 0;
  int passes = 3;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) * passes; }
};

struct LayerGemms {
  GemmDims items[6];
  int count = 0;
  void push_back(const GemmDims& g) { items[count++] = g; }
  const GemmDims* begin() const { return items; }
  const GemmDims* end() const { return items + count; }
  double flops() const {
    double f = 0;
    for (const auto& g : *this) f += g.flops();
    return f;
  }
};

// The layer's GEMMs for `tokens` tokens (micro-batch x sequence) on one of tp
// ranks, as the LibTorch model runs them: one column-parallel QKV, the
// row-parallel attention output, the MLP's column-parallel gate and up (one
// for GELU) and row-parallel down; the head's vocabulary-parallel projection;
// none for the embedding.
LayerGemms layer_gemms(const ModelShape& s, LayerKind kind, long long tokens, int tp, Recompute recompute);

// Forward+backward FLOPs of the layer's causal attention per rank: the
// forward ModelShape counts (no causal discount), 2 more for the backward,
// 1 more under full or selective recomputation. 0 outside blocks.
double layer_attention_flops(const ModelShape& s, LayerKind kind, long long bs, long long seq, int tp,
                             Recompute recompute);

// How a block's attention runs. kFused: one kernel (flash attention, PyTorch SDPA) keeps the scores on chip,
// priced by its FLOPs (layer_attention_flops). kMaterialized: the b x (a/tp) x s x s score tensor goes
// through HBM between separate kernels, as Megatron-LM did before flash attention (2021-22: a batched
// Q K^T GEMM, its fused scale-mask-softmax, PyTorch's dropout, a batched GEMM with V) and as eager
// Hugging Face attention does; priced by ScoreTraffic.
enum class AttentionKernels { kFused, kMaterialized };

// How a layer's kernels run beyond its shape: its attention, and Megatron's sequence parallelism (with
// tp: the norms, dropouts and residual adds between the tensor-parallel regions run on s/tp tokens per
// rank instead of on every token on every rank; Korthikanti et al. 2022, Sec. 4.2.2).
//
// Two kernel options of Megatron-LM's linear layers, each on by default as today's Megatron-LM runs them
// (sim/layer_kernels.md says when each appeared and which published runs had it):
//  - async_tp_backward (`--no-async-tensor-model-parallel-allreduce` turns it off): a column-parallel linear
//    (a block's QKV and the MLP's first GEMM(s), the head's logits GEMM) starts its input gradient's
//    tensor-parallel all-reduce (under sequence parallelism: its reduce-scatter) asynchronously and computes
//    its weight-gradient GEMM meanwhile, so that collective leaves the critical path up to that GEMM's time.
//  - gradient_accumulation_fusion (`--no-gradient-accumulation-fusion`): the weight-gradient GEMM accumulates
//    into the main gradient (beta = 1) instead of writing a gradient that a separate pass adds to it, so the
//    GEMM weights' per-micro-batch accumulation pass disappears (biases and norms keep theirs).
//
// Where each micro-batch's weight gradients accumulate (MainGrads), which sets the accumulation pass's bytes per
// parameter (main_grad_accumulation_bytes; the GEMM weights' pass is gone under gradient accumulation fusion):
//  - k16Bit: a 16-bit main gradient (Megatron-LM in fp16 without --accumulate-allreduce-grads-in-fp32,
//    `main_grad.add_(grad)`): read two values, write one, 3 x 2 bytes.
//  - kFp32: an fp32 main gradient that the 16-bit gradient is added into (Megatron-LM with
//    --accumulate-allreduce-grads-in-fp32, which bf16 forces): read 2 + 4 bytes, write 4.
//  - kFp32Cast: an fp32 copy that receives a cast of the gradient (DeepSpeed's BF16_Optimizer,
//    `hp_grad.add_(lp.grad.to(fp32))`, deepspeed/runtime/bf16_optimizer.py since 2022-02): the cast reads 2 bytes
//    and writes an fp32 temporary (4), the add reads it and the main gradient (4 + 4) and writes 4: 18 bytes.
enum class MainGrads { k16Bit, kFp32, kFp32Cast };
struct LayerKernels {
  AttentionKernels attention = AttentionKernels::kFused;
  bool sequence_parallel = false;
  bool async_tp_backward = true;
  bool gradient_accumulation_fusion = true;
  MainGrads main_grads = MainGrads::k16Bit;
};

// Bytes per parameter that accumulating one micro-batch's `bytes_per_value`-byte gradient into `g` main gradients
// moves (see MainGrads): 3 x bytes_per_value, bytes_per_value + 8, bytes_per_value + 16.
double main_grad_accumulation_bytes(MainGrads g, double bytes_per_value);
// "16bit", "fp32", "fp32-cast"; parse_main_grads throws InputError naming `where` for any other name.
const char* to_string(MainGrads g);
MainGrads parse_main_grads(const std::string& name, const std::string& where);

// The GEMM weights' parameters of the layer on one of tp ranks (sum of k x n over layer_gemms): what gradient
// accumulation fusion accumulates inside the weight-gradient GEMMs.
double layer_gemm_weight_params(const ModelShape& s, LayerKind kind, int tp);

// Indices into layer_gemms(...) of the column-parallel GEMMs whose input gradient is all-reduced over tp in the
// backward (Megatron's f operator): a block's QKV and its MLP's first GEMM(s) (gate and up, one input), the
// head's logits GEMM. `groups` receives, per all-reduced input, the first and one-past-last GEMM index that
// share it; returns the number of groups (at most 2).
int column_parallel_input_groups(const ModelShape& s, LayerKind kind, int groups[2][2]);

// The materialised attention's work per rank in a forward+backward pass (with the forward again under full
// or selective recomputation: Megatron's selective recomputation is exactly this core attention), over the
// `scores` = b x (heads/tp) x s x s elements of 16-bit values (the whole square: the causal mask is applied
// by the softmax, not skipped by the GEMMs).
//  - Batched GEMMs that write or read the score tensor, each 2 x head_dim FLOPs and one 16-bit value of
//    HBM traffic per score: forward Q K^T (writes) and P V (reads); backward dP = dO V^T (writes),
//    dV = P^T dO, dQ = dS K and dK = dS^T Q (read).
//  - Streaming kernels over it, bytes per score: forward softmax (read, write: 2 values), dropout (read,
//    write, a 1-byte mask); backward dropout (read, mask, write), softmax (read the gradient and the saved
//    probabilities, write).
// Zero outside blocks.
struct ScoreTraffic {
  double scores = 0;                  // score elements per pass
  int gemm_passes = 0;                // batched GEMMs over the scores: 6, 8 recomputed
  double gemm_flops_per_score = 0;    // 2 x head_dim
  double gemm_bytes_per_score = 0;    // one 16-bit value
  double stream_bytes_per_score = 0;  // softmax and dropout, all passes together
  double gemm_flops() const { return scores * gemm_passes * gemm_flops_per_score; }
  double stream_bytes() const { return scores * stream_bytes_per_score; }
};
ScoreTraffic layer_score_traffic(const ModelShape& s, LayerKind kind, long long bs, long long seq, int tp,
                                 Recompute recompute, double bytes_per_value);

// Tensor-parallel all-reduces of the layer's activations per pass (Megatron,
// no sequence parallelism): a block 2 forward + 2 backward, the embedding 1,
// the head 1; each of tokens x hidden values. 0 when tp == 1.
int layer_allreduces(LayerKind kind, int tp);

// HBM bytes the layer's memory-bound (non-GEMM, non-attention) kernels move
// in a forward+backward pass, per rank, at `bytes_per_value` (2 for bf16)
// (a block's norms, residual adds and dropouts on 1/tp of the tokens under
// `sequence_parallel`; without it every tp rank runs them on all tokens):
// norms, activation functions, residual adds, RoPE, dropout, the embedding
// gather and its scatter-add, the head's cross-entropy. A counted estimate
// (each kernel reads its inputs and writes its outputs once; backward twice
// the forward's traffic, except the cross-entropy, whose passes over the
// logits are itemised); measured profiles time this class instead.
double layer_elementwise_bytes(const ModelShape& s, LayerKind kind, long long tokens, int tp, Recompute recompute,
                               double bytes_per_value, bool sequence_parallel = false);

// Kernels the layer launches per forward+backward pass (the launch floor's
// count), an estimate from its structure: a block's norms, projections,
// attention, activation and adds with their backward kernels.
int layer_kernel_count(const ModelShape& s, LayerKind kind, Recompute recompute);

}  // namespace hetplan
