#include "profiler/gpt.h"

#include <torch/version.h>

#include <cmath>
#include <stdexcept>

namespace hetplan::profiler {

namespace {

constexpr double kInitStd = 0.02;

uint64_t seed_for(const GPTConfig& c, int64_t layer, int64_t tensor) { return c.seed + 1000 * layer + tensor; }

torch::nn::LayerNorm layer_norm(int64_t h) { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({h})); }

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
#else
  // LibTorch 1.13 has no fused attention: softmax(QK^T / sqrt(d) + causal mask) V.
  const int64_t s = q.size(-2);
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const torch::Tensor mask = torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  att = att.masked_fill(mask, -std::numeric_limits<float>::infinity()).softmax(-1);
  return torch::matmul(att, v);
#endif
}

}  // namespace

EmbeddingLayer::EmbeddingLayer(const GPTConfig& c, const TensorParallelGroup& g) {
  wte_ = register_module("wte", VocabParallelEmbedding(seeded_normal({c.vocab_size, c.hidden_size}, kInitStd,
                                                                     seed_for(c, 0, 0)),
                                                       g));
  wpe_ = register_parameter("wpe", seeded_normal({c.seq_len, c.hidden_size}, kInitStd, seed_for(c, 0, 1)));
}

torch::Tensor EmbeddingLayer::forward(const torch::Tensor& ids) {
  return wte_->forward(ids) + wpe_.narrow(0, 0, ids.size(1));
}

TransformerBlock::TransformerBlock(const GPTConfig& c, const TensorParallelGroup& g, int64_t index) {
  const int64_t h = c.hidden_size;
  local_heads_ = c.num_heads / g.size();
  head_dim_ = h / c.num_heads;
  const double out_std = kInitStd / std::sqrt(2.0 * c.blocks());  // GPT-2's scaled residual init
  ln1_ = register_module("ln1", layer_norm(h));
  ln2_ = register_module("ln2", layer_norm(h));
  // QKV rows are laid out head by head ([heads][q,k,v][head_dim]) so that a
  // contiguous chunk of rows is a whole set of heads, as in Megatron.
  qkv_ = register_module("qkv", ColumnParallelLinear(seeded_normal({3 * h, h}, kInitStd, seed_for(c, index, 0)),
                                                     torch::zeros({3 * h}), g, false));
  proj_ = register_module("proj", RowParallelLinear(seeded_normal({h, h}, out_std, seed_for(c, index, 1)),
                                                    torch::zeros({h}), g));
  fc1_ = register_module("fc1", ColumnParallelLinear(seeded_normal({4 * h, h}, kInitStd, seed_for(c, index, 2)),
                                                     torch::zeros({4 * h}), g, false));
  fc2_ = register_module("fc2", RowParallelLinear(seeded_normal({h, 4 * h}, out_std, seed_for(c, index, 3)),
                                                  torch::zeros({h}), g));
}

torch::Tensor TransformerBlock::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), s = x.size(1);
  const torch::Tensor qkv = qkv_->forward(ln1_->forward(x)).view({b, s, local_heads_, 3, head_dim_});
  const torch::Tensor q = qkv.select(3, 0).transpose(1, 2);  // [b, heads, s, d]
  const torch::Tensor k = qkv.select(3, 1).transpose(1, 2);
  const torch::Tensor v = qkv.select(3, 2).transpose(1, 2);
  const torch::Tensor y = causal_attention(q, k, v).transpose(1, 2).reshape({b, s, local_heads_ * head_dim_});
  const torch::Tensor h1 = x + proj_->forward(y);
  return h1 + fc2_->forward(torch::gelu(fc1_->forward(ln2_->forward(h1))));
}

HeadLayer::HeadLayer(const GPTConfig& c, const TensorParallelGroup& g) {
  ln_f_ = register_module("ln_f", layer_norm(c.hidden_size));
  lm_head_ = register_module(
      "lm_head", ColumnParallelLinear(seeded_normal({c.vocab_size, c.hidden_size}, kInitStd,
                                                    seed_for(c, c.num_layers - 1, 0)),
                                      torch::zeros({c.vocab_size}), g, /*gather_output=*/true));
}

torch::Tensor HeadLayer::forward(const torch::Tensor& x) {
  const torch::Tensor logits = lm_head_->forward(ln_f_->forward(x));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
                                              targets_.reshape({-1}));
}

GPT::GPT(const GPTConfig& c, const TensorParallelGroup& g) : GPT(c, g, 0, c.num_layers) {}

GPT::GPT(const GPTConfig& c, const TensorParallelGroup& g, int64_t first, int64_t last)
    : config_(c), group_(g), first_(first) {
  const int tp = g.size();
  if (c.num_layers < 3) throw std::invalid_argument("GPT: --num-layers must be at least 3 (embedding, a block, head)");
  if (c.hidden_size % c.num_heads != 0) throw std::invalid_argument("GPT: --hidden-size must divide by --heads");
  if (c.num_heads % tp != 0 || c.vocab_size % tp != 0)
    throw std::invalid_argument("GPT: --heads and --vocab-size must divide by tp=" + std::to_string(tp));
  if (first < 0 || last > c.num_layers || first > last) throw std::invalid_argument("GPT: bad layer range");
  for (int64_t i = first; i < last; ++i) {
    if (i == 0) {
      layers_.push_back(std::make_shared<EmbeddingLayer>(c, group_));
    } else if (i == c.num_layers - 1) {
      head_ = std::make_shared<HeadLayer>(c, group_);
      layers_.push_back(head_);
    } else {
      layers_.push_back(std::make_shared<TransformerBlock>(c, group_, i));
    }
  }
}

void GPT::to(torch::Device device, torch::Dtype dtype) {
  for (auto& l : layers_) l->to(device, dtype);
}

std::vector<torch::Tensor> GPT::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& l : layers_)
    for (const auto& p : l->parameters()) out.push_back(p);
  return out;
}

torch::Tensor GPT::loss(const torch::Tensor& ids, const torch::Tensor& targets) {
  head_->set_targets(targets);
  torch::Tensor x = ids;
  for (auto& l : layers_) x = l->forward(x);
  return x;
}

std::vector<int64_t> gpt_parameters_per_layer(const GPTConfig& c) {
  const int64_t h = c.hidden_size;
  std::vector<int64_t> out;
  out.push_back(c.vocab_size * h + c.seq_len * h);
  for (int64_t i = 0; i < c.blocks(); ++i) out.push_back(12 * h * h + 13 * h);
  out.push_back(2 * h + c.vocab_size * h + c.vocab_size);
  return out;
}

}  // namespace hetplan::profiler
