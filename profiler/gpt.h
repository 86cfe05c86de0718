// The LibTorch model of a ModelShape (sim/model_shape.h, the one model
// definition), laid out the way Metis counts layers:
//   layer 0        token (+ learned position) embedding, vocab-parallel
//   layers 1..L    transformer blocks: pre-norm causal self-attention with
//                  grouped-query heads (one column-parallel QKV, row-parallel
//                  output projection; RoPE for Llama) and the MLP (GPT-2:
//                  fc -> tanh-GELU -> proj; Llama: down(silu(gate) * up))
//   layer L+1      final norm, LM head over this rank's vocabulary slice and
//                  Megatron's vocab-parallel cross-entropy (no rank gathers
//                  the full logits)
// LayerNorm or RMSNorm, biases, tied or untied embeddings as the shape says.
// Short and explicit on purpose (nanoGPT), with Megatron's tensor parallelism.
// Weights come from a seed, so every tp degree builds slices of one model,
// and every pipeline stage the same weights as the whole model's layers.
//
// Sequence parallelism (GPTConfig::sequence_parallel, with tp > 1, Megatron's
// --sequence-parallel): between the layers of a GPT the activations are split
// along the sequence over the tp group ([b, s / tp, h] on tp index t: tokens
// [t s / tp, (t + 1) s / tp)); each norm runs on its shard, each block
// all-gathers the norm's output before its column-parallel linears and
// reduce-scatters after its row-parallel ones; the embedding reduce-scatters
// its lookups; the head all-gathers after the final norm. The norms'
// weights, the row-parallel biases and the learned positions are used on a
// shard, so their gradients are summed over tp in the backward
// (sequence_parallel_param) or, with sequence_parallel_grads_in_step, by the
// caller once per step (sequence_parallel_params()). A GPT's own input and output (a pipeline
// stage's, exchanged with its neighbours) stay whole: its first layer
// scatters, its last all-gathers.
//
// Context parallelism (a cp group given to the GPT, cp >= 2): every input is
// this cp rank's part of each sequence (context_parallel_positions: chunks r
// and 2 cp - 1 - r of 2 cp), positions (learned or rotary) are the tokens'
// global ones, and each attention is Megatron's ring attention over the cp
// group (K/V sent round the ring beside the per-step attention, partial
// outputs merged by log-sum-exp; cuDNN or flash on CUDA;
// profiler/context_parallel.h). The head's loss is the mean over this rank's tokens.
//
// It promises: summing numel() over the tp ranks for sharded tensors and
// once for replicated ones gives ModelShape::parameter_count() (tests check
// it). With tied embeddings, a GPT holding both the embedding and the head
// shares one tensor; a stage holding the head alone keeps a copy of the
// embedding (same initial values), whose gradients the pipeline must sum
// with the embedding's (Megatron's embedding group).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "profiler/context_parallel.h"
#include "profiler/tensor_parallel.h"
#include "sim/memory_model.h"
#include "sim/model_shape.h"

namespace hetplan::profiler {

struct GPTConfig {
  ModelShape shape;  // default: a GPT-2 shape
  int64_t seq_len = 1024;
  uint64_t seed = 1234;
  bool meta = false;  // parameters on the meta device: shapes only (parameter counting)
  // Activation recomputation (Megatron's): kFull keeps only each block's
  // input and runs the block's forward again in its backward; kSelective
  // does that for the core attention (scores, softmax, weighted values) only.
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;  // with tp > 1 (see above)
  // Sequence parallelism: where the gradients of the parameters used on a sequence shard
  // (GPT::sequence_parallel_params()) are summed over tp. false: in every backward (each use's
  // backward all-reduces); true: not by the model -- the caller sums them once per step, after the
  // last micro-batch (Megatron's finalize_model_grads), as replay's gradient sync does.
  bool sequence_parallel_grads_in_step = false;
  int64_t num_layers() const { return shape.metis_num_layers(); }  // embedding + blocks + head
  int64_t blocks() const { return shape.num_layers; }
  // Checks what a model of this config on `tp` ranks needs (heads, key/value
  // heads, ffn and vocabulary divisible by tp; positions cover seq_len;
  // with cp > 1 seq_len divisible by 2 cp; with sequence parallelism each cp
  // rank's tokens divisible by tp). Throws InputError naming `where`.
  void validate(int tp, const std::string& where, int cp = 1) const;
};

// Causal attention of q [b, heads, s, d] over k, v [b, heads / group, s, d]
// (query head i attends with key/value head i / group), as the blocks run it:
// fused (scaled_dot_product_attention) where LibTorch has it. The profiler
// times it alone for the attention kernel class.
torch::Tensor causal_self_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t group);
// The same with an explicit mask [s_q, s_k] (true: attend), for context parallelism's global positions.
// REQUIRES: every row of `mask` attends to at least one key.
torch::Tensor masked_self_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t group, const torch::Tensor& mask);

// Where a layer's input and output are split along the sequence over tp (sequence parallelism): the
// layers inside a GPT pass shards to each other; the GPT's own input and output are whole.
struct SequenceSplit {
  bool input = false, output = false;
};

// One Metis layer: a module mapping its input to its output. The head maps
// hidden states to the scalar loss against the targets set on it.
class GPTLayer : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // Sequence parallelism: the parameters this layer uses on a sequence shard (norm weights and biases,
  // row-parallel biases, learned positions), whose gradients are partial per tp rank; empty without it.
  virtual std::vector<torch::Tensor> sequence_parallel_params() const { return {}; }
};

// LayerNorm (weight, bias) or RMSNorm (weight; computed in fp32 as Hugging Face does).
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(NormKind kind, int64_t h, double eps, bool meta);
  torch::Tensor forward(const torch::Tensor& x);
  // Sequence parallelism: x is a sequence shard, so weight and bias gradients are summed over `g` in the
  // backward (a group of size 1: left partial, for the caller to sum).
  void set_sequence_parallel(const TensorParallelGroup& g) { sp_group_ = g; }
  std::vector<torch::Tensor> own_params() const { return bias.defined() ? std::vector{weight, bias} : std::vector{weight}; }
  torch::Tensor weight, bias;

 private:
  NormKind kind_;
  double eps_;
  TensorParallelGroup sp_group_;  // size 1 without sequence parallelism
};
TORCH_MODULE(Norm);

class EmbeddingLayer : public GPTLayer {
 public:
  // `ids` of forward: this cp rank's tokens of each sequence (all of them without cp).
  EmbeddingLayer(const GPTConfig& c, const TensorParallelGroup& g, const TensorParallelGroup& cp = {},
                 SequenceSplit split = {});
  torch::Tensor forward(const torch::Tensor& ids) override;
  torch::Tensor word_embeddings() const { return wte_->weight; }
  std::vector<torch::Tensor> sequence_parallel_params() const override;

 private:
  VocabParallelEmbedding wte_{nullptr};
  torch::Tensor wpe_;  // undefined without learned positions
  TensorParallelGroup group_, cp_;
  TensorParallelGroup sp_grad_group_;  // group_ where the backward sums the positions' gradients, else size 1
  int64_t seq_len_;
  bool sp_output_ = false;
  torch::Tensor cp_positions_;  // cp > 1: this rank's token positions, on wpe_'s device (lazily, once)
};

// The cos and sin tables of rotary position embeddings for one sequence
// length, head dimension, dtype and device, built on first use and again only
// when one of those changes. Not thread-safe (a block runs on one thread).
struct RotaryTable {
  torch::Tensor cos, sin;  // [s, d]
  const RotaryTable& get(int64_t s, int64_t d, double theta, const torch::Tensor& like);
};

class TransformerBlock : public GPTLayer {
 public:
  TransformerBlock(const GPTConfig& c, const TensorParallelGroup& g, int64_t index,
                   const TensorParallelGroup& cp = {}, SequenceSplit split = {});
  torch::Tensor forward(const torch::Tensor& x) override;
  std::vector<torch::Tensor> sequence_parallel_params() const override;

 private:
  ModelShape shape_;
  TensorParallelGroup group_, cp_;
  int64_t seq_len_;
  bool sp_ = false;  // sequence parallelism
  SequenceSplit split_;
  bool cp_exchange_ = false;  // cp > 1 and the K/V exchange not disabled (test hook cp-kv-exchange)
  torch::Tensor cp_positions_, cp_mask_;  // cp > 1: this rank's query positions; the test hook's mask (lazily)
  RotaryTable cp_rotary_;                 // cp > 1, RoPE: the rotary table at this rank's positions (lazily)
  int64_t local_heads_, local_kv_heads_;
  Norm ln1_{nullptr}, ln2_{nullptr};
  // QKV rows are laid out by key/value group ([kv][q x heads/kv, k, v][head_dim])
  // so that a contiguous chunk of rows is a whole set of groups, as in Megatron.
  ColumnParallelLinear qkv_{nullptr}, fc1_{nullptr}, gate_{nullptr};  // gate: SwiGLU only
  RowParallelLinear proj_{nullptr}, fc2_{nullptr};
  Recompute recompute_;
  RotaryTable rotary_;  // RoPE shapes only
  using Body = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;
  Body block_body_, attention_body_;  // what recomputation runs again (hold `this`: the block is never moved)
  torch::Tensor block(const torch::Tensor& x);
};

// Runs body(a, b, c) keeping only its inputs; the backward runs it again with
// gradients on and back-propagates through it (parameters inside `body` get
// their gradients there). `body` must outlive the backward and compute the
// same function each time (no randomness). Undefined b, c are allowed.
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&,
                                                           const torch::Tensor&)>& body,
                         const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c);

class HeadLayer : public GPTLayer {
 public:
  // `tied`: the embedding's weight to use as the LM head (tied embeddings,
  // embedding in the same GPT); undefined: the head holds its own weight
  // (untied, or a copy of the tied embedding).
  // The targets: this cp rank's tokens of each sequence, like the embedding's ids.
  HeadLayer(const GPTConfig& c, const TensorParallelGroup& g, torch::Tensor tied, SequenceSplit split = {});
  torch::Tensor forward(const torch::Tensor& x) override;  // mean cross-entropy (fp32)
  std::vector<torch::Tensor> sequence_parallel_params() const override;
  void set_targets(torch::Tensor t) { targets_ = std::move(t); }
  // The head's own copy of the tied embedding (undefined otherwise).
  torch::Tensor tied_copy() const { return tied_copy_ ? lm_head_ : torch::Tensor(); }

 private:
  TensorParallelGroup group_;
  bool sp_ = false;
  SequenceSplit split_;
  Norm ln_f_{nullptr};
  torch::Tensor lm_head_;  // [vocab / tp, hidden]
  bool tied_copy_ = false;
  torch::Tensor targets_;
};

class GPT {
 public:
  // Throws InputError when the config does not fit the tp degree.
  GPT(const GPTConfig& c, const TensorParallelGroup& g);
  // Only layers [first, last) of the model (a pipeline stage); the same
  // weights as the whole model's layers of those numbers. `cp`: the context-
  // parallel group (size 1: none); it must outlive nothing (layers copy it).
  GPT(const GPTConfig& c, const TensorParallelGroup& g, int64_t first, int64_t last,
      const TensorParallelGroup& cp = {});
  int64_t first_layer() const { return first_; }
  bool has_head() const { return head_ != nullptr; }
  const GPTConfig& config() const { return config_; }
  std::vector<std::shared_ptr<GPTLayer>>& layers() { return layers_; }
  HeadLayer& head() { return *head_; }
  void to(torch::Device device, torch::Dtype dtype);
  // Every parameter once (a tied embedding shared by embedding and head once).
  std::vector<torch::Tensor> parameters() const;
  // The tensor whose gradient must be summed with the other end's: the
  // embedding (stage with the embedding but not the head) or the head's copy
  // (stage with the head but not the embedding), when the embeddings are
  // tied; undefined otherwise.
  torch::Tensor tied_embedding_to_sync() const;
  // Sequence parallelism: every layer's sequence_parallel_params(). With
  // GPTConfig::sequence_parallel_grads_in_step, the caller must sum their gradients over tp.
  std::vector<torch::Tensor> sequence_parallel_params() const;
  // Whole-model loss for token ids and targets [batch, seq].
  torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& targets);

 private:
  GPTConfig config_;
  TensorParallelGroup group_;
  int64_t first_ = 0;
  std::vector<std::shared_ptr<GPTLayer>> layers_;
  std::shared_ptr<EmbeddingLayer> embedding_;
  std::shared_ptr<HeadLayer> head_;
};

}  // namespace hetplan::profiler
