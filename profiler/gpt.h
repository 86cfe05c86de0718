// A GPT in LibTorch, laid out the way Metis counts layers:
//   layer 0        token + position embedding
//   layers 1..L-2  transformer blocks: pre-LayerNorm causal self-attention
//                  (column-parallel QKV, row-parallel proj) and a 4h GELU MLP
//                  (column-parallel fc1, row-parallel fc2)
//   layer L-1      final LayerNorm, LM head over the vocabulary, cross-entropy
// Short and explicit on purpose (nanoGPT), with Megatron's tensor parallelism.
// Weights come from a seed, so every tp degree builds slices of one model.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "profiler/tensor_parallel.h"

namespace hetplan::profiler {

struct GPTConfig {
  int64_t num_layers = 10;  // Metis layers: embedding + blocks + head
  int64_t hidden_size = 4096;
  int64_t num_heads = 32;
  int64_t seq_len = 1024;
  int64_t vocab_size = 51200;
  uint64_t seed = 1234;
  int64_t blocks() const { return num_layers - 2; }
};

// One Metis layer: a module mapping its input to its output. The head maps
// hidden states to the scalar loss against the targets set on it.
class GPTLayer : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

class EmbeddingLayer : public GPTLayer {
 public:
  EmbeddingLayer(const GPTConfig& c, const TensorParallelGroup& g);
  torch::Tensor forward(const torch::Tensor& ids) override;

 private:
  VocabParallelEmbedding wte_{nullptr};
  torch::Tensor wpe_;
};

class TransformerBlock : public GPTLayer {
 public:
  TransformerBlock(const GPTConfig& c, const TensorParallelGroup& g, int64_t index);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  int64_t local_heads_, head_dim_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  ColumnParallelLinear qkv_{nullptr}, fc1_{nullptr};
  RowParallelLinear proj_{nullptr}, fc2_{nullptr};
};

class HeadLayer : public GPTLayer {
 public:
  HeadLayer(const GPTConfig& c, const TensorParallelGroup& g);
  torch::Tensor forward(const torch::Tensor& x) override;  // mean cross-entropy
  void set_targets(torch::Tensor t) { targets_ = std::move(t); }

 private:
  torch::nn::LayerNorm ln_f_{nullptr};
  ColumnParallelLinear lm_head_{nullptr};
  torch::Tensor targets_;
};

class GPT {
 public:
  // Checks that heads, 4h and the vocabulary divide by the tp degree.
  GPT(const GPTConfig& c, const TensorParallelGroup& g);
  // Only layers [first, last) of the model (a pipeline stage); the same
  // weights as the whole model's layers of those numbers.
  GPT(const GPTConfig& c, const TensorParallelGroup& g, int64_t first, int64_t last);
  int64_t first_layer() const { return first_; }
  bool has_head() const { return head_ != nullptr; }
  const GPTConfig& config() const { return config_; }
  std::vector<std::shared_ptr<GPTLayer>>& layers() { return layers_; }
  HeadLayer& head() { return *head_; }
  void to(torch::Device device, torch::Dtype dtype);
  std::vector<torch::Tensor> parameters() const;
  // Whole-model loss for token ids and targets [batch, seq].
  torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& targets);

 private:
  GPTConfig config_;
  TensorParallelGroup group_;
  int64_t first_ = 0;
  std::vector<std::shared_ptr<GPTLayer>> layers_;
  std::shared_ptr<HeadLayer> head_;
};

// Parameter count of each Metis layer at tp = 1.
std::vector<int64_t> gpt_parameters_per_layer(const GPTConfig& c);

}  // namespace hetplan::profiler
