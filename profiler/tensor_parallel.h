// Megatron-style tensor parallelism for LibTorch.
//
// A TensorParallelGroup is the set of ranks that split each layer's weights
// (tp ranks; a null process group means tp = 1). ColumnParallelLinear splits
// its output features, RowParallelLinear its input features, and
// VocabParallelEmbedding its vocabulary. The communication follows Megatron:
//   copy_to_tensor_parallel     forward identity,  backward all-reduce
//   reduce_from_tensor_parallel forward all-reduce, backward identity
//   gather_from_tensor_parallel forward all-gather (last dim), backward slice
// Every module builds the full weight from a seeded generator and keeps its
// shard, so a tp = N model holds exactly the slices of the tp = 1 model.
#pragma once

#include <torch/torch.h>

#include <memory>

namespace c10d {
class Backend;
class ProcessGroup;
}  // namespace c10d

namespace hetplan::profiler {

class TensorParallelGroup {
 public:
  TensorParallelGroup() = default;  // tp = 1
  // `all_reduce` and `all_gather` run the collective in place / into `out`.
  struct Collectives {
    virtual ~Collectives() = default;
    virtual void all_reduce(torch::Tensor& t) = 0;
    virtual void all_gather(std::vector<torch::Tensor>& out, torch::Tensor& in) = 0;
  };
  TensorParallelGroup(int rank, int size, std::shared_ptr<Collectives> c)
      : rank_(rank), size_(size), collectives_(std::move(c)) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  void all_reduce(torch::Tensor& t) const;
  torch::Tensor all_gather_last_dim(const torch::Tensor& t) const;

 private:
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Collectives> collectives_;
};

torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& g);
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& g);
torch::Tensor gather_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& g);

// Deterministic full-size initial weights: the same on every rank.
torch::Tensor seeded_normal(std::vector<int64_t> shape, double std, uint64_t seed);

// How a parameter starts: normal(0, std) from `seed` (std 0: zeros), or, when
// `meta`, no values at all (meta tensors: shapes only, for counting).
struct ParamInit {
  double std = 0.02;
  uint64_t seed = 0;
  bool meta = false;
};

// This rank's slice along `dim` of the full tensor `full` that `init`
// describes (the whole tensor when `dim` < 0: replicated).
torch::Tensor init_shard(const std::vector<int64_t>& full, int64_t dim, const TensorParallelGroup& g,
                         const ParamInit& init);

// y = x W^T (+ b) with W [out, in] split over the group by output rows. The
// output stays split (the next RowParallelLinear consumes it) unless
// gather_output. A rank's rows are a contiguous chunk of W's rows.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(int64_t in, int64_t out, bool bias, const ParamInit& init,
                           const TensorParallelGroup& group, bool gather_output);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;  // bias undefined when there is none

 private:
  TensorParallelGroup group_;
  bool gather_output_;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T (+ b) with W's input features split over the group; x arrives
// split, partial products are all-reduced, then the (replicated) bias added.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, bool bias, const ParamInit& init, const TensorParallelGroup& group);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;

 private:
  TensorParallelGroup group_;
};
TORCH_MODULE(RowParallelLinear);

// Token embedding with the vocabulary split over the group: each rank looks
// up the ids in its range, zeros the rest, and the group all-reduces.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t hidden, const ParamInit& init, const TensorParallelGroup& group);
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;

 private:
  TensorParallelGroup group_;
  int64_t vocab_start_, vocab_end_;
};
TORCH_MODULE(VocabParallelEmbedding);

// Megatron's vocab-parallel cross-entropy: `logits` [N, V / tp] are this
// rank's vocabulary slice (rank r holds ids [r V/tp, (r+1) V/tp)), `targets`
// [N] global ids. The group all-gathers the per-row maxima (N values per
// rank) and all-reduces the sum of exponentials and the target logit, so no
// rank ever holds the full logits. Returns the per-row loss [N] (fp32 when
// the logits are), the same on every rank; the backward is local.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                          const TensorParallelGroup& g);

}  // namespace hetplan::profiler
