// Megatron-style tensor parallelism for LibTorch.
//
// A TensorParallelGroup is the set of ranks that split each layer's weights
// (tp ranks; a null process group means tp = 1). ColumnParallelLinear splits
// its output features, RowParallelLinear its input features, and
// VocabParallelEmbedding its vocabulary. The communication follows Megatron:
//   copy_to_tensor_parallel     forward identity,  backward all-reduce
//   reduce_from_tensor_parallel forward all-reduce, backward identity
//   gather_from_tensor_parallel forward all-gather (last dim), backward slice
// and, for Megatron's sequence parallelism (--sequence-parallel: activations
// between the blocks split along the sequence, dim 1 of [batch, seq, hidden]):
//   scatter_to_sequence_parallel        forward slice,          backward all-gather
//   gather_from_sequence_parallel       forward all-gather,     backward reduce-scatter (or slice)
//   reduce_scatter_to_sequence_parallel forward reduce-scatter, backward all-gather
//   sequence_parallel_param             forward identity,       backward all-reduce
// (the last wraps a replicated parameter used on a sequence shard, a norm's
// weight or a row-parallel bias: its gradient is summed over the group). A
// context-parallel (cp) group is a TensorParallelGroup too (a group of ranks
// with these collectives); its attention is profiler/context_parallel.h.
// Every module builds the full weight from a seeded generator and keeps its
// shard, so a tp = N model holds exactly the slices of the tp = 1 model.
#pragma once

#include <torch/torch.h>

#include <functional>
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
    // `in` holds size() equal chunks of out.numel() elements; `out` gets this rank's chunk of their sum.
    // `in` may be clobbered. Default: all-reduce `in`, copy the chunk (CommGroup runs a reduce-scatter).
    virtual void reduce_scatter(torch::Tensor& out, torch::Tensor& in);
    // `out` (size() x in.numel() elements, contiguous) gets every rank's `in`, in rank order.
    // Default: all_gather into temporaries, then one copy (CommGroup runs one flat all-gather).
    virtual void all_gather_flat(torch::Tensor& out, const torch::Tensor& in);
    // One step of a ring (context parallelism's K/V ring, profiler/context_parallel.h), started and left
    // running: `in` goes to the next rank of the group (rank + 1 mod size), `out` (in's shape, contiguous)
    // gets the previous rank's `in`. Returns the function that completes it (NCCL: makes the then-current
    // stream wait for it, no host sync; the send and receive run on NCCL's stream after the work issued so
    // far on the calling thread's stream, beside what is issued next), or an empty function where these
    // collectives have no ring step (the default): TensorParallelGroup::ring_shift_async all-gathers then.
    virtual std::function<void()> ring_shift_async(torch::Tensor& out, const torch::Tensor& in);
    virtual int rank() const = 0;
  };
  TensorParallelGroup(int rank, int size, std::shared_ptr<Collectives> c)
      : rank_(rank), size_(size), collectives_(std::move(c)) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  void all_reduce(torch::Tensor& t) const;
  torch::Tensor all_gather_last_dim(const torch::Tensor& t) const;
  // Every rank's `t` concatenated along `dim`, in rank order.
  torch::Tensor all_gather_dim(const torch::Tensor& t, int64_t dim) const;
  // This rank's slice along `dim` (size() equal slices) of the sum of every rank's `t`.
  // REQUIRES: t.size(dim) divisible by size().
  torch::Tensor reduce_scatter_dim(const torch::Tensor& t, int64_t dim) const;
  // One collective each, on flat buffers: `out` (contiguous, size() x in.numel() elements) gets every
  // rank's `in` in rank order; `out` (contiguous) gets this rank's chunk of the sum of every rank's `in`
  // (contiguous, size() equal chunks; clobbered). A group of one copies.
  void all_gather_flat(torch::Tensor& out, const torch::Tensor& in) const;
  void reduce_scatter_flat(torch::Tensor& out, torch::Tensor& in) const;
  // One ring step (Collectives::ring_shift_async): `out` (contiguous, in's shape) gets the previous rank's
  // `in`, once the returned function has run; until then neither may be read, changed or freed. Without a
  // ring step in the collectives: one all-gather into a temporary, done before returning. A group of one
  // copies `in`.
  std::function<void()> ring_shift_async(torch::Tensor& out, const torch::Tensor& in) const;
  // This rank's slice along `dim`, no communication.
  torch::Tensor slice_dim(const torch::Tensor& t, int64_t dim) const;

 private:
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Collectives> collectives_;
};

torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& g);
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& g);
torch::Tensor gather_from_tensor_parallel(const torch::Tensor& x, const TensorParallelGroup& g);
// Sequence parallelism (see the top); the sequence is dim 1. `reduce_scatter_grad`: the consumer is
// tensor-parallel (each rank holds a partial gradient, which the backward sums and splits); false: the
// consumer is replicated (every rank holds the whole gradient, which the backward slices).
torch::Tensor scatter_to_sequence_parallel(const torch::Tensor& x, const TensorParallelGroup& g);
torch::Tensor gather_from_sequence_parallel(const torch::Tensor& x, const TensorParallelGroup& g,
                                            bool reduce_scatter_grad = true);
torch::Tensor reduce_scatter_to_sequence_parallel(const torch::Tensor& x, const TensorParallelGroup& g);
torch::Tensor sequence_parallel_param(const torch::Tensor& p, const TensorParallelGroup& g);

// Megatron's load-balanced causal split of a sequence of `seq` tokens over a cp group of size cp: 2 cp
// equal chunks, rank r holding chunks r and 2 cp - 1 - r (so every rank has as much of the causal
// triangle). The global positions of this rank's tokens, in its order [2 seq / (2 cp)] (int64, CPU);
// all of 0..seq-1 when cp = 1. REQUIRES: seq divisible by 2 cp.
torch::Tensor context_parallel_positions(int64_t seq, const TensorParallelGroup& cp);
// x's tokens of this rank along `dim` (its two chunks, in the order above); x when cp = 1.
torch::Tensor context_parallel_slice(const torch::Tensor& x, int64_t dim, const TensorParallelGroup& cp);

// Test hook: true when the comma-separated list in HETPLAN_TEST_DISABLE names `mechanism`
// ("sp-reduce-scatter", "sp-param-allreduce", "cp-kv-exchange"); the equivalence tests show that
// training then differs from one process. Read once per process.
bool test_disabled(const std::string& mechanism);

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
  // Sequence parallelism: x arrives already all-gathered along the sequence (gather_from_sequence_parallel,
  // whose backward reduce-scatters the input gradient), so no copy_to_tensor_parallel (all-reduce) here.
  void set_sequence_parallel() { input_gathered_ = true; }
  torch::Tensor weight, bias;  // bias undefined when there is none

 private:
  TensorParallelGroup group_;
  bool gather_output_;
  bool input_gathered_ = false;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T (+ b) with W's input features split over the group; x arrives
// split, partial products are all-reduced, then the (replicated) bias added
// (a group of one: the bias fused into the GEMM, as at::linear does).
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, bool bias, const ParamInit& init, const TensorParallelGroup& group);
  torch::Tensor forward(const torch::Tensor& x);
  // Sequence parallelism: the partial products are reduce-scattered along the sequence (dim 1) instead of
  // all-reduced, and the bias, added on the shard, has its gradient summed over the group in the backward
  // (`sum_bias_grad`) or left partial for the caller to sum once per step.
  void set_sequence_parallel(bool sum_bias_grad = true) {
    sequence_parallel_ = true;
    sum_bias_grad_ = sum_bias_grad;
  }
  torch::Tensor weight, bias;

 private:
  TensorParallelGroup group_;
  bool sequence_parallel_ = false, sum_bias_grad_ = true;
};
TORCH_MODULE(RowParallelLinear);

// Token embedding with the vocabulary split over the group: each rank looks
// up the ids in its range, zeros the rest, and the group all-reduces.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t hidden, const ParamInit& init, const TensorParallelGroup& group);
  torch::Tensor forward(const torch::Tensor& ids);
  // Sequence parallelism: the partial lookups are reduce-scattered along the sequence instead of all-reduced.
  void set_sequence_parallel() { sequence_parallel_ = true; }
  torch::Tensor weight;

 private:
  TensorParallelGroup group_;
  int64_t vocab_start_, vocab_end_;
  bool sequence_parallel_ = false;
};
TORCH_MODULE(VocabParallelEmbedding);

// Megatron's vocab-parallel cross-entropy: `logits` [N, V / tp] are this
// rank's vocabulary slice (rank r holds ids [r V/tp, (r+1) V/tp)), `targets`
// [N] global ids. The group all-gathers the per-row maxima (N values per
// rank) and all-reduces the sum of exponentials and the target logit, so no
// rank ever holds the full logits. Returns the per-row loss [N] (fp32 when
// the logits are), the same on every rank; the backward is local. A group
// of one runs ATen's fused cross-entropy instead (the same values).
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                          const TensorParallelGroup& g);

}  // namespace hetplan::profiler
