#include "profiler/tensor_parallel.h"

namespace hetplan::profiler {

void TensorParallelGroup::all_reduce(torch::Tensor& t) const {
  if (size_ > 1) collectives_->all_reduce(t);
}

torch::Tensor TensorParallelGroup::all_gather_last_dim(const torch::Tensor& t) const {
  if (size_ == 1) return t;
  torch::Tensor in = t.contiguous();
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < size_; ++r) parts.push_back(torch::empty_like(in));
  collectives_->all_gather(parts, in);
  return torch::cat(parts, -1);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CopyToTensorParallel : torch::autograd::Function<CopyToTensorParallel> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, const TensorParallelGroup* g) {
    ctx->saved_data["g"] = reinterpret_cast<int64_t>(g);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto* g = reinterpret_cast<const TensorParallelGroup*>(ctx->saved_data["g"].toInt());
    torch::Tensor out = grad[0].contiguous().clone();
    g->all_reduce(out);
    return {out, torch::Tensor()};
  }
};

struct ReduceFromTensorParallel : torch::autograd::Function<ReduceFromTensorParallel> {
  static torch::Tensor forward(AutogradContext*, torch::Tensor x, const TensorParallelGroup* g) {
    torch::Tensor out = x.contiguous().clone();
    g->all_reduce(out);
    return out;
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], torch::Tensor()}; }
};

struct GatherFromTensorParallel : torch::autograd::Function<GatherFromTensorParallel> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, const TensorParallelGroup* g) {
    ctx->saved_data["g"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["width"] = x.size(-1);
    return g->all_gather_last_dim(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto* g = reinterpret_cast<const TensorParallelGroup*>(ctx->saved_data["g"].toInt());
    const int64_t w = ctx->saved_data["width"].toInt();
    return {grad[0].narrow(-1, g->rank() * w, w).contiguous(), torch::Tensor()};
  }
};

}  // namespace

// The group objects live in the modules, which outlive every graph built
// from them, so the autograd nodes may hold a raw pointer.
torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& g) {
  return g.size() == 1 ? x : CopyToTensorParallel::apply(x, &g);
}
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& g) {
  return g.size() == 1 ? x : ReduceFromTensorParallel::apply(x, &g);
}
torch::Tensor gather_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& g) {
  return g.size() == 1 ? x : GatherFromTensorParallel::apply(x, &g);
}

torch::Tensor seeded_normal(std::vector<int64_t> shape, double std, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::normal(0.0, std, shape, gen, torch::kFloat32);
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::Tensor& full_weight, const torch::Tensor& full_bias,
                                                   const TensorParallelGroup& group, bool gather_output)
    : group_(group), gather_output_(gather_output) {
  const int64_t rows = full_weight.size(0) / group.size();
  weight = register_parameter("weight", full_weight.narrow(0, group.rank() * rows, rows).clone());
  bias = register_parameter("bias", full_bias.narrow(0, group.rank() * rows, rows).clone());
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::nn::functional::linear(copy_to_tensor_parallel(x, group_), weight, bias);
  return gather_output_ ? gather_from_tensor_parallel(y, group_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::Tensor& full_weight, const torch::Tensor& full_bias,
                                             const TensorParallelGroup& group)
    : group_(group) {
  const int64_t cols = full_weight.size(1) / group.size();
  weight = register_parameter("weight", full_weight.narrow(1, group.rank() * cols, cols).clone());
  bias = register_parameter("bias", full_bias.clone());
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  return reduce_from_tensor_parallel(torch::matmul(x, weight.t()), group_) + bias;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::Tensor& full_weight,
                                                       const TensorParallelGroup& group)
    : group_(group) {
  const int64_t rows = full_weight.size(0) / group.size();
  vocab_start_ = group.rank() * rows;
  vocab_end_ = vocab_start_ + rows;
  weight = register_parameter("weight", full_weight.narrow(0, vocab_start_, rows).clone());
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  if (group_.size() == 1) return torch::embedding(weight, ids);
  const torch::Tensor outside = (ids < vocab_start_) | (ids >= vocab_end_);
  const torch::Tensor local = (ids - vocab_start_).masked_fill(outside, 0);
  torch::Tensor y = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_tensor_parallel(y, group_);
}

}  // namespace hetplan::profiler
