#include "profiler/tensor_parallel.h"

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_set>

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

void TensorParallelGroup::Collectives::reduce_scatter(torch::Tensor& out, torch::Tensor& in) {
  all_reduce(in);
  out.copy_(in.view({-1}).narrow(0, rank() * out.numel(), out.numel()).view_as(out));
}

void TensorParallelGroup::Collectives::all_gather_flat(torch::Tensor& out, const torch::Tensor& in) {
  torch::Tensor i = in.contiguous();
  std::vector<torch::Tensor> parts;
  const int64_t n = out.numel() / i.numel();  // the group's size
  for (int64_t r = 0; r < n; ++r) parts.push_back(torch::empty_like(i));
  all_gather(parts, i);
  out.view({-1}).copy_(torch::cat(parts).view({-1}));
}

std::function<void()> TensorParallelGroup::Collectives::ring_shift_async(torch::Tensor&, const torch::Tensor&) {
  return {};
}

std::function<void()> TensorParallelGroup::ring_shift_async(torch::Tensor& out, const torch::Tensor& in) const {
  if (size_ > 1) {
    if (std::function<void()> done = collectives_->ring_shift_async(out, in)) return done;
    torch::Tensor every = torch::empty({size_, in.numel()}, in.options());
    collectives_->all_gather_flat(every, in);
    out.view({-1}).copy_(every.select(0, (rank_ + size_ - 1) % size_));
  } else {
    out.view({-1}).copy_(in.reshape({-1}));
  }
  return [] {};
}

void TensorParallelGroup::all_gather_flat(torch::Tensor& out, const torch::Tensor& in) const {
  if (size_ == 1) {
    out.view({-1}).copy_(in.reshape({-1}));
    return;
  }
  collectives_->all_gather_flat(out, in);
}

void TensorParallelGroup::reduce_scatter_flat(torch::Tensor& out, torch::Tensor& in) const {
  if (size_ == 1) {
    out.view({-1}).copy_(in.view({-1}));
    return;
  }
  collectives_->reduce_scatter(out, in);
}

torch::Tensor TensorParallelGroup::all_gather_dim(const torch::Tensor& t, int64_t dim) const {
  if (size_ == 1) return t;
  torch::Tensor in = t.contiguous();
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < size_; ++r) parts.push_back(torch::empty_like(in));
  collectives_->all_gather(parts, in);
  return torch::cat(parts, dim);
}

torch::Tensor TensorParallelGroup::slice_dim(const torch::Tensor& t, int64_t dim) const {
  if (size_ == 1) return t;
  if (t.size(dim) % size_ != 0)
    throw std::invalid_argument("parallel group: dimension " + std::to_string(t.size(dim)) +
                                " does not divide by the group size " + std::to_string(size_));
  const int64_t w = t.size(dim) / size_;
  return t.narrow(dim, rank_ * w, w).clone(at::MemoryFormat::Contiguous);  // never a view of t
}

torch::Tensor TensorParallelGroup::reduce_scatter_dim(const torch::Tensor& t, int64_t dim) const {
  if (size_ == 1) return t;
  if (t.size(dim) % size_ != 0)
    throw std::invalid_argument("parallel group: dimension " + std::to_string(t.size(dim)) +
                                " does not divide by the group size " + std::to_string(size_));
  // `dim` first, so that each rank's slice is one contiguous chunk of the flat buffer.
  torch::Tensor in = t.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] /= size_;
  torch::Tensor out = torch::empty(shape, in.options());
  collectives_->reduce_scatter(out, in);
  return out.movedim(0, dim).contiguous();
}

bool test_disabled(const std::string& mechanism) {
  static const std::unordered_set<std::string> disabled = [] {
    std::unordered_set<std::string> out;
    if (const char* env = std::getenv("HETPLAN_TEST_DISABLE")) {
      std::stringstream list(env);
      for (std::string item; std::getline(list, item, ',');) out.insert(item);
    }
    return out;
  }();
  return disabled.count(mechanism) > 0;
}

torch::Tensor context_parallel_positions(int64_t seq, const TensorParallelGroup& cp) {
  const int64_t n = cp.size();
  if (seq % (2 * n) != 0)
    throw std::invalid_argument("context parallelism: the sequence length " + std::to_string(seq) +
                                " does not divide by 2 x cp (" + std::to_string(2 * n) + ")");
  if (n == 1) return torch::arange(seq, torch::kLong);
  const int64_t c = seq / (2 * n), r = cp.rank();
  return torch::cat({torch::arange(r * c, (r + 1) * c, torch::kLong),
                     torch::arange((2 * n - 1 - r) * c, (2 * n - r) * c, torch::kLong)});
}

torch::Tensor context_parallel_slice(const torch::Tensor& x, int64_t dim, const TensorParallelGroup& cp) {
  if (cp.size() == 1) return x;
  const int64_t n = cp.size(), seq = x.size(dim);
  if (seq % (2 * n) != 0)
    throw std::invalid_argument("context parallelism: the sequence length " + std::to_string(seq) +
                                " does not divide by 2 x cp (" + std::to_string(2 * n) + ")");
  // The two chunks' slices, joined on x's device: no index tensor copied from the host (a copy from
  // pageable host memory waits for the device's queue to drain, once per micro-batch).
  const int64_t c = seq / (2 * n), r = cp.rank();
  return torch::cat({x.narrow(dim, r * c, c), x.narrow(dim, (2 * n - 1 - r) * c, c)}, dim);
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

// Forward: this rank's slice along `dim`; backward: the all-gather of the slices' gradients.
struct ScatterDim : torch::autograd::Function<ScatterDim> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, int64_t dim, const TensorParallelGroup* g) {
    ctx->saved_data["g"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["dim"] = dim;
    return g->slice_dim(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto* g = reinterpret_cast<const TensorParallelGroup*>(ctx->saved_data["g"].toInt());
    return {g->all_gather_dim(grad[0], ctx->saved_data["dim"].toInt()), torch::Tensor(), torch::Tensor()};
  }
};

// Forward: every rank's x along `dim`; backward: reduce-scatter (partial gradients) or slice (whole ones).
struct AllGatherDim : torch::autograd::Function<AllGatherDim> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, int64_t dim, bool reduce_scatter_grad,
                               const TensorParallelGroup* g) {
    ctx->saved_data["g"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["rs"] = reduce_scatter_grad;
    return g->all_gather_dim(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto* g = reinterpret_cast<const TensorParallelGroup*>(ctx->saved_data["g"].toInt());
    const int64_t dim = ctx->saved_data["dim"].toInt();
    torch::Tensor d = ctx->saved_data["rs"].toBool() ? g->reduce_scatter_dim(grad[0], dim) : g->slice_dim(grad[0], dim);
    return {d, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Forward: this rank's slice along `dim` of the sum over the group; backward: all-gather.
// Under the test hook sp-reduce-scatter, the forward keeps this rank's slice of its own partial sum.
struct ReduceScatterDim : torch::autograd::Function<ReduceScatterDim> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, int64_t dim, const TensorParallelGroup* g) {
    ctx->saved_data["g"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["dim"] = dim;
    static const bool broken = test_disabled("sp-reduce-scatter");
    return broken ? g->slice_dim(x, dim) : g->reduce_scatter_dim(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto* g = reinterpret_cast<const TensorParallelGroup*>(ctx->saved_data["g"].toInt());
    return {g->all_gather_dim(grad[0], ctx->saved_data["dim"].toInt()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor scatter_to_sequence_parallel(const torch::Tensor& x, const TensorParallelGroup& g) {
  return g.size() == 1 ? x : ScatterDim::apply(x, 1, &g);
}
torch::Tensor gather_from_sequence_parallel(const torch::Tensor& x, const TensorParallelGroup& g,
                                            bool reduce_scatter_grad) {
  return g.size() == 1 ? x : AllGatherDim::apply(x, 1, reduce_scatter_grad, &g);
}
torch::Tensor reduce_scatter_to_sequence_parallel(const torch::Tensor& x, const TensorParallelGroup& g) {
  return g.size() == 1 ? x : ReduceScatterDim::apply(x, 1, &g);
}
torch::Tensor sequence_parallel_param(const torch::Tensor& p, const TensorParallelGroup& g) {
  static const bool broken = test_disabled("sp-param-allreduce");
  return broken ? p : copy_to_tensor_parallel(p, g);
}

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

torch::Tensor init_shard(const std::vector<int64_t>& full, int64_t dim, const TensorParallelGroup& g,
                         const ParamInit& init) {
  std::vector<int64_t> shape = full;
  int64_t begin = 0;
  if (dim >= 0) {
    if (full[dim] % g.size() != 0)
      throw std::invalid_argument("tensor parallelism: dimension " + std::to_string(full[dim]) +
                                  " does not divide by tp " + std::to_string(g.size()));
    shape[dim] = full[dim] / g.size();
    begin = g.rank() * shape[dim];
  }
  if (init.meta) return torch::empty(shape, torch::TensorOptions().dtype(torch::kFloat32).device(torch::kMeta));
  torch::Tensor t = init.std > 0 ? seeded_normal(full, init.std, init.seed) : torch::zeros(full, torch::kFloat32);
  return dim >= 0 ? t.narrow(dim, begin, shape[dim]).clone() : t;
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in, int64_t out, bool has_bias, const ParamInit& init,
                                                   const TensorParallelGroup& group, bool gather_output)
    : group_(group), gather_output_(gather_output) {
  weight = register_parameter("weight", init_shard({out, in}, 0, group, init));
  if (has_bias) bias = register_parameter("bias", init_shard({out}, 0, group, {0.0, 0, init.meta}));
}

// at::linear, not the C++ frontend's torch::nn::functional::linear: for a 3-D input the latter runs a matmul
// and then adds the bias in a separate broadcast kernel; at::linear folds a contiguous [b, s, in] input into
// one addmm, whose bias cuBLASLt adds in the GEMM's epilogue on CUDA (as PyTorch's nn.Linear does).
torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::linear(input_gathered_ ? x : copy_to_tensor_parallel(x, group_), weight, bias);
  return gather_output_ ? gather_from_tensor_parallel(y, group_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in, int64_t out, bool has_bias, const ParamInit& init,
                                             const TensorParallelGroup& group)
    : group_(group) {
  weight = register_parameter("weight", init_shard({out, in}, 1, group, init));
  if (has_bias) bias = register_parameter("bias", init_shard({out}, -1, group, {0.0, 0, init.meta}));
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  // One rank: nothing to reduce, so the bias goes into the GEMM's epilogue (see ColumnParallelLinear).
  if (group_.size() == 1) return torch::linear(x, weight, bias);
  if (sequence_parallel_) {
    torch::Tensor y = reduce_scatter_to_sequence_parallel(torch::matmul(x, weight.t()), group_);
    if (!bias.defined()) return y;
    return y + (sum_bias_grad_ ? sequence_parallel_param(bias, group_) : bias);
  }
  torch::Tensor y = reduce_from_tensor_parallel(torch::matmul(x, weight.t()), group_);
  return bias.defined() ? y + bias : y;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab, int64_t hidden, const ParamInit& init,
                                                       const TensorParallelGroup& group)
    : group_(group) {
  weight = register_parameter("weight", init_shard({vocab, hidden}, 0, group, init));
  vocab_start_ = group.rank() * weight.size(0);
  vocab_end_ = vocab_start_ + weight.size(0);
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  if (group_.size() == 1) return torch::embedding(weight, ids);
  const torch::Tensor outside = (ids < vocab_start_) | (ids >= vocab_end_);
  const torch::Tensor local = (ids - vocab_start_).masked_fill(outside, 0);
  torch::Tensor y = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return sequence_parallel_ ? reduce_scatter_to_sequence_parallel(y, group_) : reduce_from_tensor_parallel(y, group_);
}

namespace {

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor logits, torch::Tensor targets,
                               const TensorParallelGroup* g) {
    torch::NoGradGuard no_grad;
    const int64_t width = logits.size(-1), start = g->rank() * width;
    // The global maximum of each row, from every rank's N maxima.
    const torch::Tensor row_max = g->all_gather_last_dim(logits.amax(-1, true)).amax(-1, true);
    torch::Tensor e = (logits - row_max).exp_();
    const torch::Tensor inside = (targets >= start) & (targets < start + width);
    const torch::Tensor local = (targets - start).masked_fill(~inside, 0).unsqueeze(-1);
    torch::Tensor target_logit = (logits.gather(-1, local).squeeze(-1) - row_max.squeeze(-1)).masked_fill(~inside, 0.0);
    torch::Tensor sum_exp = e.sum(-1);
    g->all_reduce(target_logit);
    g->all_reduce(sum_exp);
    e.div_(sum_exp.unsqueeze(-1));  // softmax over the whole vocabulary, this rank's slice
    ctx->save_for_backward({e, local, inside});
    return sum_exp.log() - target_logit;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const variable_list saved = ctx->get_saved_variables();
    torch::Tensor d = saved[0].clone();  // d loss / d logits = softmax - one_hot(target)
    d.scatter_add_(-1, saved[1], -saved[2].to(d.scalar_type()).unsqueeze(-1));
    d.mul_(grad[0].unsqueeze(-1));
    return {d, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                          const TensorParallelGroup& g) {
  // One rank holds the whole vocabulary: ATen's cross-entropy (fused log-softmax and NLL, forward and backward;
  // what PyTorch users run) in place of the split one's eight elementwise and reduction kernels.
  if (g.size() == 1)
    return at::cross_entropy_loss(logits, targets, /*weight=*/{}, at::Reduction::None, /*ignore_index=*/-100,
                                  /*label_smoothing=*/0.0);
  return VocabParallelCrossEntropy::apply(logits, targets, &g);
}

}  // namespace hetplan::profiler
