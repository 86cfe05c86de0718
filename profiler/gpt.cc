#include "profiler/gpt.h"

#include <cmath>
#include <limits>
#include <unordered_set>

#include "base/input_error.h"
#include "profiler/torch_version.h"

namespace hetplan::profiler {

namespace {

constexpr double kInitStd = 0.02;

uint64_t seed_for(const GPTConfig& c, int64_t layer, int64_t tensor) { return c.seed + 1000 * layer + tensor; }

// Causal attention of q [b, heads, s, d] over k, v [b, heads / group, s, d]:
// query head i attends with key/value head i / group.
torch::Tensor causal_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v, int64_t group) {
#if HETPLAN_TORCH_AT_LEAST(2, 5)
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, /*scale=*/{},
                                          /*enable_gqa=*/group > 1);
#else
  if (group > 1) {
    k = k.repeat_interleave(group, 1);
    v = v.repeat_interleave(group, 1);
  }
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
#endif
}

// Attention of q [b, heads, s_q, d] over k, v [b, heads / group, s_k, d] where mask [s_q, s_k] is true.
torch::Tensor masked_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v, int64_t group,
                               const torch::Tensor& mask) {
#if HETPLAN_TORCH_AT_LEAST(2, 5)
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, /*scale=*/{},
                                          /*enable_gqa=*/group > 1);
#else
  if (group > 1) {
    k = k.repeat_interleave(group, 1);
    v = v.repeat_interleave(group, 1);
  }
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false);
#else
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  att = att.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity()).softmax(-1);
  return torch::matmul(att, v);
#endif
#endif
}

// x [b, heads, s, d] rotated by position (Hugging Face's layout, rotate_half:
// the two halves of each head form the pairs), with `table` = {cos, sin}.
torch::Tensor rotary(const torch::Tensor& x, const RotaryTable& table) {
  const int64_t d = x.size(-1);
  const torch::Tensor rotated = torch::cat({-x.narrow(-1, d / 2, d / 2), x.narrow(-1, 0, d / 2)}, -1);
  return x * table.cos + rotated * table.sin;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Body = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor a, torch::Tensor b, torch::Tensor c,
                               const Body* body) {
    ctx->saved_data["body"] = reinterpret_cast<int64_t>(body);
    ctx->save_for_backward({a, b, c});
    return (*body)(a, b, c);  // gradients are off in a custom forward: nothing inside is kept
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto* body = reinterpret_cast<const Body*>(ctx->saved_data["body"].toInt());
    variable_list in = ctx->get_saved_variables();
    for (auto& t : in)
      if (t.defined()) t = t.detach().requires_grad_(true);
    torch::Tensor y;
    {
      torch::AutoGradMode enable(true);
      y = (*body)(in[0], in[1], in[2]);
    }
    torch::autograd::backward({y}, {grad[0]});
    variable_list out;
    for (auto& t : in) out.push_back(t.defined() ? t.grad() : torch::Tensor());
    out.push_back(torch::Tensor());
    return out;
  }
};

}  // namespace

torch::Tensor checkpoint(const Body& body, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
  // Autograd functions take defined tensors only: stand in `a` for a missing
  // input (body ignores it; its gradient stays undefined).
  return Checkpoint::apply(a, b.defined() ? b : a, c.defined() ? c : a, &body);
}

const RotaryTable& RotaryTable::get(int64_t s, int64_t d, double theta, const torch::Tensor& like) {
  if (cos.defined() && cos.size(0) == s && cos.size(1) == d && cos.scalar_type() == like.scalar_type() &&
      cos.device() == like.device())
    return *this;
  // cos and sin computed in fp32, then kept in x's dtype.
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(like.device());
  const torch::Tensor inv_freq = torch::pow(theta, torch::arange(0, d, 2, f32) / static_cast<double>(d)).reciprocal();
  const torch::Tensor freqs = torch::outer(torch::arange(s, f32), inv_freq);
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  cos = emb.cos().to(like.scalar_type());
  sin = emb.sin().to(like.scalar_type());
  return *this;
}

void GPTConfig::validate(int tp, const std::string& where, int cp) const {
  shape.validate(where);
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw InputError(where + ": " + what);
  };
  const std::string t = std::to_string(tp);
  need(seq_len > 0, "the sequence length must be positive");
  need(shape.num_heads % tp == 0, "tp " + t + " must divide the attention heads (" + std::to_string(shape.num_heads) + ")");
  need(shape.num_kv_heads % tp == 0,
       "tp " + t + " must divide the key/value heads (" + std::to_string(shape.num_kv_heads) + ")");
  need(shape.vocab_size % tp == 0, "tp " + t + " must divide the vocabulary (" + std::to_string(shape.vocab_size) + ")");
  need(shape.ffn_hidden_size % tp == 0,
       "tp " + t + " must divide the MLP hidden size (" + std::to_string(shape.ffn_hidden_size) + ")");
  need(!shape.learned_positions || seq_len <= shape.max_positions,
       "the sequence length " + std::to_string(seq_len) + " exceeds the learned positions (" +
           std::to_string(shape.max_positions) + ")");
  need(shape.learned_positions || shape.head_dim % 2 == 0, "rotary embeddings need an even head dimension");
  need(cp == 1 || (cp > 1 && seq_len % (2 * cp) == 0), "context parallelism " + std::to_string(cp) + " needs the sequence length (" +
                                               std::to_string(seq_len) + ") divisible by 2 x cp");
  need(!sequence_parallel || tp == 1 || (seq_len / cp) % tp == 0,
       "sequence parallelism needs each cp rank's tokens (" + std::to_string(seq_len / cp) + ") divisible by tp " + t);
}

NormImpl::NormImpl(NormKind kind, int64_t h, double eps, bool meta) : kind_(kind), eps_(eps) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(meta ? torch::kMeta : torch::kCPU);
  weight = register_parameter("weight", meta ? torch::empty({h}, opts) : torch::ones({h}, opts));
  if (kind == NormKind::kLayerNorm)
    bias = register_parameter("bias", meta ? torch::empty({h}, opts) : torch::zeros({h}, opts));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor w = sequence_parallel_param(weight, sp_group_);
  if (kind_ == NormKind::kLayerNorm)
    return torch::layer_norm(x, {x.size(-1)}, w, sequence_parallel_param(bias, sp_group_), eps_);
#if HETPLAN_TORCH_AT_LEAST(2, 4)
  return at::rms_norm(x, {x.size(-1)}, w, eps_);  // in fp32, the result in x's dtype
#else
  const torch::Tensor xf = x.to(torch::kFloat32);
  return w * (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps_)).to(x.scalar_type());
#endif
}

EmbeddingLayer::EmbeddingLayer(const GPTConfig& c, const TensorParallelGroup& g, const TensorParallelGroup& cp,
                               SequenceSplit split)
    : group_(g),
      cp_(cp),
      sp_grad_group_(c.sequence_parallel_grads_in_step ? TensorParallelGroup() : g),
      seq_len_(c.seq_len),
      sp_output_(c.sequence_parallel && g.size() > 1 && split.output) {
  const ModelShape& m = c.shape;
  wte_ = register_module("wte", VocabParallelEmbedding(m.vocab_size, m.hidden_size,
                                                       ParamInit{kInitStd, seed_for(c, 0, 0), c.meta}, g));
  if (m.learned_positions)
    wpe_ = register_parameter("wpe", init_shard({m.max_positions, m.hidden_size}, -1, g,
                                                ParamInit{kInitStd, seed_for(c, 0, 1), c.meta}));
  if (sp_output_) wte_->set_sequence_parallel();
}

torch::Tensor EmbeddingLayer::forward(const torch::Tensor& ids) {
  torch::Tensor x = wte_->forward(ids);  // [b, s / tp, h] under sequence parallelism
  if (!wpe_.defined()) return x;
  // The tokens' global positions: this cp rank's, then (sequence parallelism) this tp rank's shard of them.
  // (Copied to the device once: a copy from pageable host memory per micro-batch can stall the host.)
  if (cp_.size() > 1 && (!cp_positions_.defined() || cp_positions_.device() != wpe_.device()))
    cp_positions_ = context_parallel_positions(seq_len_, cp_).to(wpe_.device());
  torch::Tensor pos = cp_.size() > 1 ? wpe_.index_select(0, cp_positions_) : wpe_.narrow(0, 0, ids.size(1));
  if (!sp_output_) return x + pos;
  return x + group_.slice_dim(sequence_parallel_param(pos, sp_grad_group_), 0);
}

std::vector<torch::Tensor> EmbeddingLayer::sequence_parallel_params() const {
  if (sp_output_ && wpe_.defined()) return {wpe_};
  return {};
}

TransformerBlock::TransformerBlock(const GPTConfig& c, const TensorParallelGroup& g, int64_t index,
                                   const TensorParallelGroup& cp, SequenceSplit split)
    : shape_(c.shape),
      group_(g),
      cp_(cp),
      seq_len_(c.seq_len),
      sp_(c.sequence_parallel && g.size() > 1),
      split_(split),
      cp_exchange_(cp.size() > 1 && !test_disabled("cp-kv-exchange")),
      recompute_(c.recompute) {
  block_body_ = [this](const torch::Tensor& x, const torch::Tensor&, const torch::Tensor&) { return block(x); };
  const int64_t group = c.shape.num_heads / c.shape.num_kv_heads;
  // With the K/V exchange, the ring attention over the cp group (profiler/context_parallel.h).
  attention_body_ = [this, group](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    if (cp_exchange_) return ring_attention(q, k, v, group, cp_);
    return cp_mask_.defined() ? masked_attention(q, k, v, group, cp_mask_) : causal_attention(q, k, v, group);
  };
  const ModelShape& m = c.shape;
  const int64_t h = m.hidden_size, q = m.num_heads * m.head_dim, kv = m.num_kv_heads * m.head_dim;
  local_heads_ = m.num_heads / g.size();
  local_kv_heads_ = m.num_kv_heads / g.size();
  const double out_std = kInitStd / std::sqrt(2.0 * c.blocks());  // GPT-2's scaled residual init
  auto init = [&](int64_t tensor, double std) { return ParamInit{std, seed_for(c, index, tensor), c.meta}; };
  ln1_ = register_module("ln1", Norm(m.norm, h, m.norm_eps, c.meta));
  ln2_ = register_module("ln2", Norm(m.norm, h, m.norm_eps, c.meta));
  qkv_ = register_module("qkv", ColumnParallelLinear(h, q + 2 * kv, m.attention_bias, init(0, kInitStd), g, false));
  proj_ = register_module("proj", RowParallelLinear(q, h, m.attention_bias, init(1, out_std), g));
  if (m.mlp == MlpKind::kSwiGlu)
    gate_ = register_module("gate", ColumnParallelLinear(h, m.ffn_hidden_size, m.mlp_bias, init(4, kInitStd), g, false));
  fc1_ = register_module("fc1", ColumnParallelLinear(h, m.ffn_hidden_size, m.mlp_bias, init(2, kInitStd), g, false));
  fc2_ = register_module("fc2", RowParallelLinear(m.ffn_hidden_size, h, m.mlp_bias, init(3, out_std), g));
  if (sp_) {
    const bool in_backward = !c.sequence_parallel_grads_in_step;
    if (in_backward) {
      ln1_->set_sequence_parallel(g);
      ln2_->set_sequence_parallel(g);
    }
    for (auto* col : {&qkv_, &fc1_, &gate_})
      if (!col->is_empty()) (*col)->set_sequence_parallel();
    proj_->set_sequence_parallel(in_backward);
    fc2_->set_sequence_parallel(in_backward);
  }
}

std::vector<torch::Tensor> TransformerBlock::sequence_parallel_params() const {
  if (!sp_) return {};
  std::vector<torch::Tensor> out = ln1_->own_params();
  for (const torch::Tensor& p : ln2_->own_params()) out.push_back(p);
  for (const torch::Tensor& b : {proj_->bias, fc2_->bias})
    if (b.defined()) out.push_back(b);
  return out;
}

torch::Tensor TransformerBlock::forward(const torch::Tensor& x_in) {
  // Sequence parallelism: a whole input (the GPT's own) is split here, a whole output gathered (its
  // consumer, the next stage, holds the whole gradient: the backward slices it).
  const torch::Tensor x = sp_ && !split_.input ? scatter_to_sequence_parallel(x_in, group_) : x_in;
  torch::Tensor y = recompute_ == Recompute::kFull && torch::GradMode::is_enabled()
                        ? checkpoint(block_body_, x, torch::Tensor(), torch::Tensor())
                        : block(x);
  return sp_ && !split_.output ? gather_from_sequence_parallel(y, group_, /*reduce_scatter_grad=*/false) : y;
}

torch::Tensor TransformerBlock::block(const torch::Tensor& x) {
  const int64_t b = x.size(0), d = shape_.head_dim;
  const int64_t group = shape_.num_heads / shape_.num_kv_heads;
  // Sequence parallelism: the norm on this rank's shard, then the whole sequence for the linears.
  auto linear_input = [&](const torch::Tensor& normed) {
    return sp_ ? gather_from_sequence_parallel(normed, group_) : normed;
  };
  const torch::Tensor qkv_out = qkv_->forward(linear_input(ln1_->forward(x)));
  const int64_t s = qkv_out.size(1);  // this cp rank's tokens
  const torch::Tensor qkv = qkv_out.view({b, s, local_kv_heads_, group + 2, d});
  // One split, whose backward is one concatenation (three slices would cost a zero fill, a strided copy and
  // an add of the whole qkv gradient each).
  const std::vector<torch::Tensor> parts = qkv.split_with_sizes({group, 1, 1}, 3);
  torch::Tensor q = parts[0].reshape({b, s, local_heads_, d}).transpose(1, 2);  // [b, heads, s, d]
  torch::Tensor k = parts[1].squeeze(3).transpose(1, 2);                       // [b, kv, s, d]
  torch::Tensor v = parts[2].squeeze(3).transpose(1, 2);
  if (cp_.size() > 1 && !cp_positions_.defined()) {
    cp_positions_ = context_parallel_positions(seq_len_, cp_);
    // Under the test hook (no K/V exchange) the queries attend this rank's own keys, masked on their positions.
    if (!cp_exchange_) cp_mask_ = (cp_positions_.unsqueeze(1) >= cp_positions_.unsqueeze(0)).to(q.device());
    cp_positions_ = cp_positions_.to(q.device());
  }
  if (!shape_.learned_positions) {
    if (cp_.size() > 1) {
      // The table at this rank's positions, gathered once (the positions never change).
      if (!cp_rotary_.cos.defined() || cp_rotary_.cos.device() != q.device() ||
          cp_rotary_.cos.scalar_type() != q.scalar_type()) {
        const RotaryTable& table = rotary_.get(seq_len_, d, shape_.rope_theta, q);
        cp_rotary_ = {table.cos.index_select(0, cp_positions_), table.sin.index_select(0, cp_positions_)};
      }
      q = rotary(q, cp_rotary_);
      k = rotary(k, cp_rotary_);
    } else {
      const RotaryTable& table = rotary_.get(s, d, shape_.rope_theta, q);
      q = rotary(q, table);
      k = rotary(k, table);
    }
  }
  const bool selective = recompute_ == Recompute::kSelective && torch::GradMode::is_enabled();
  const torch::Tensor att = selective ? checkpoint(attention_body_, q, k, v) : attention_body_(q, k, v);
  const torch::Tensor y = att.transpose(1, 2).reshape({b, s, local_heads_ * d});
  const torch::Tensor h1 = x + proj_->forward(y);
  const torch::Tensor z = linear_input(ln2_->forward(h1));
  if (shape_.mlp == MlpKind::kSwiGlu) return h1 + fc2_->forward(torch::silu(gate_->forward(z)) * fc1_->forward(z));
  return h1 + fc2_->forward(torch::gelu(fc1_->forward(z), "tanh"));  // GPT-2's gelu_new
}

HeadLayer::HeadLayer(const GPTConfig& c, const TensorParallelGroup& g, torch::Tensor tied, SequenceSplit split)
    : group_(g), sp_(c.sequence_parallel && g.size() > 1), split_(split) {
  const ModelShape& m = c.shape;
  ln_f_ = register_module("ln_f", Norm(m.norm, m.hidden_size, m.norm_eps, c.meta));
  if (sp_ && !c.sequence_parallel_grads_in_step) ln_f_->set_sequence_parallel(g);
  if (tied.defined()) {
    lm_head_ = std::move(tied);  // the embedding's parameter, registered there
  } else {
    tied_copy_ = m.tied_embeddings;
    // A copy of the tied embedding starts from the embedding's seed.
    const uint64_t seed = tied_copy_ ? seed_for(c, 0, 0) : seed_for(c, c.num_layers() - 1, 0);
    lm_head_ = register_parameter(tied_copy_ ? "tied_wte" : "lm_head",
                                  init_shard({m.vocab_size, m.hidden_size}, 0, g, ParamInit{kInitStd, seed, c.meta}));
  }
}

std::vector<torch::Tensor> HeadLayer::sequence_parallel_params() const {
  return sp_ ? ln_f_->own_params() : std::vector<torch::Tensor>{};
}

torch::Tensor HeadLayer::forward(const torch::Tensor& x) {
  // Sequence parallelism: the final norm on the shard, then the whole sequence for the LM head.
  const torch::Tensor normed = sp_ ? gather_from_sequence_parallel(
                                         ln_f_->forward(split_.input ? x : scatter_to_sequence_parallel(x, group_)), group_)
                                   : copy_to_tensor_parallel(ln_f_->forward(x), group_);
  const torch::Tensor logits = torch::nn::functional::linear(normed, lm_head_);  // [b, s, V / tp]
  return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
                                      targets_.reshape({-1}), group_)
      .mean();
}

GPT::GPT(const GPTConfig& c, const TensorParallelGroup& g) : GPT(c, g, 0, c.num_layers()) {}

GPT::GPT(const GPTConfig& c, const TensorParallelGroup& g, int64_t first, int64_t last, const TensorParallelGroup& cp)
    : config_(c), group_(g), first_(first) {
  c.validate(g.size(), "model", cp.size());
  if (first < 0 || last > c.num_layers() || first > last) throw std::invalid_argument("GPT: bad layer range");
  for (int64_t i = first; i < last; ++i) {
    // Sequence parallelism: shards between this GPT's layers, whole at its ends.
    const SequenceSplit split{i > first, i + 1 < last};
    if (i == 0) {
      embedding_ = std::make_shared<EmbeddingLayer>(c, group_, cp, split);
      layers_.push_back(embedding_);
    } else if (i == c.num_layers() - 1) {
      const bool share = c.shape.tied_embeddings && embedding_ != nullptr;
      head_ = std::make_shared<HeadLayer>(c, group_, share ? embedding_->word_embeddings() : torch::Tensor(), split);
      layers_.push_back(head_);
    } else {
      layers_.push_back(std::make_shared<TransformerBlock>(c, group_, i, cp, split));
    }
  }
}

void GPT::to(torch::Device device, torch::Dtype dtype) {
  for (auto& l : layers_) l->to(device, dtype);
}

std::vector<torch::Tensor> GPT::parameters() const {
  std::vector<torch::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& l : layers_)
    for (const auto& p : l->parameters())
      if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

std::vector<torch::Tensor> GPT::sequence_parallel_params() const {
  std::vector<torch::Tensor> out;
  for (const auto& l : layers_)
    for (const torch::Tensor& p : l->sequence_parallel_params()) out.push_back(p);
  return out;
}

torch::Tensor GPT::tied_embedding_to_sync() const {
  if (!config_.shape.tied_embeddings || (embedding_ && head_)) return {};
  if (embedding_) return embedding_->word_embeddings();
  if (head_) return head_->tied_copy();
  return {};
}

torch::Tensor GPT::loss(const torch::Tensor& ids, const torch::Tensor& targets) {
  head_->set_targets(targets);
  torch::Tensor x = ids;
  for (auto& l : layers_) x = l->forward(x);
  return x;
}

torch::Tensor causal_self_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t group) {
  return causal_attention(q, k, v, group);
}

torch::Tensor masked_self_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t group, const torch::Tensor& mask) {
  return masked_attention(q, k, v, group, mask);
}

}  // namespace hetplan::profiler
