// MixedPrecisionAdam: Adam as Megatron's mixed-precision optimizer runs it.
//
// The model's parameters may be bf16 (or fp16); the optimizer keeps, per
// parameter, an fp32 main gradient (micro-batch gradients are added into it
// in fp32, and it is what the data-parallel all-reduce sums), an fp32 master
// copy of the weights and Adam's two fp32 moments: 2 + 4 + 4 + 4 + 4 = 18
// bytes per bf16 parameter. step() runs Adam on the masters and copies them
// back into the parameters, rounded to the parameters' dtype. For fp32
// parameters the master is the parameter itself (16 bytes per parameter),
// so the update equals torch::optim::Adam on the parameters.
// Everything is flat, as Megatron's buffers: the parameters become views of
// one buffer (set_data; they stay the same leaves), main gradients and
// masters are views of one fp32 buffer each, so a step is one Adam over one
// tensor (FlatAdam: fused on CUDA) and one copy into the 16-bit weights.
//
// Use: after each micro-batch's backward, accumulate_grads(); then reduce
// main_grads() as needed; then step(); zero_grad() before the next step.
//
// ZeRO-1 (Megatron's distributed optimizer), with `shards` > 1: the main
// gradients are one flat fp32 buffer (flat_main_grads(); main_grads() are
// views into it), the parameters views of one flat 16-bit buffer, both
// padded to a multiple of `shards`, and this rank keeps fp32 masters and
// Adam moments only for its slice `shard`: 2 + 4 + 12 / shards bytes per
// bf16 parameter. step_sharded() reduce-scatters the main gradients over the
// data-parallel group (in place: this rank's slice of the buffer receives
// the sum), updates the slice, and all-gathers the updated 16-bit slices
// into the parameters' buffer (in place); no other buffer is allocated.
// Adam is elementwise, so the result equals the unsharded step's.
// Not thread-safe; the parameters must outlive it.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace hetplan::profiler {

// Adam over one flat fp32 tensor `param` (a leaf; e.g. sharded masters),
// given its gradient at each step. On CUDA with LibTorch >= 2 it runs one
// fused kernel (at::_fused_adam_, as torch.optim.Adam(fused=True)); elsewhere
// torch::optim::Adam, whose results it then equals bit for bit (also on CUDA
// if the fused kernel refuses its first step: it says so on stderr).
class FlatAdam {
 public:
  FlatAdam(torch::Tensor param, double lr);
  void step(const torch::Tensor& grad);  // REQUIRES: grad shaped like param, fp32
  bool fused() const { return fused_; }

 private:
  torch::Tensor param_, exp_avg_, exp_avg_sq_, step_;
  std::unique_ptr<torch::optim::Adam> adam_;
  double lr_;
  bool fused_ = false, adam_started_ = false;
};

class MixedPrecisionAdam {
 public:
  // `in_backward`: add each gradient into its main gradient as soon as
  // autograd has produced it (a post hook on the parameter's gradient
  // accumulator, as Megatron's), so that no parameter holds a .grad between
  // backwards; accumulate_grads() then finds nothing left to do.
  MixedPrecisionAdam(std::vector<torch::Tensor> params, double lr, int shard = 0, int shards = 1,
                     bool in_backward = false);
  // Adds each parameter's .grad (when defined) into its fp32 main gradient
  // and drops the .grad, so that the next backward allocates a fresh one.
  void accumulate_grads();
  // The fp32 main gradients, one per parameter in the constructor's order.
  std::vector<torch::Tensor>& main_grads() { return main_grads_; }
  // The main gradient of `param` (one of the parameters); undefined if none.
  torch::Tensor main_grad_of(const torch::Tensor& param) const;
  void zero_grad();
  void step();  // REQUIRES: shards == 1
  // REQUIRES: shards > 1. `reduce_scatter(out, in)` puts this shard's chunk
  // of the group's sum of the flat `in` into `out` (null: the main gradients
  // are summed already); `all_gather(out, in)` gathers every shard's `in`, in
  // shard order, into the flat `out`. Both may be called with `out` / `in`
  // aliasing this shard's chunk of the other (NCCL's in-place forms).
  using Collective = std::function<void(torch::Tensor& out, torch::Tensor& in)>;
  void step_sharded(const Collective& reduce_scatter, const Collective& all_gather);
  int shards() const { return shards_; }
  torch::Tensor& flat_main_grads() { return flat_; }  // main_grads() are views of it
  // The tensors Adam updates: fp32 masters (or the fp32 parameters themselves).
  const std::vector<torch::Tensor>& master_params() const { return masters_; }
  const std::vector<torch::Tensor>& params() const { return params_; }
  // Bytes per parameter this scheme holds: parameter + main gradient + masters + moments.
  // (ZeRO-1 over `shards` ranks: masters and moments divided by it.)
  static double state_bytes_per_parameter(torch::Dtype param_dtype, int shards = 1);

 private:
  void init(double lr);
  std::vector<torch::Tensor> params_, masters_, main_grads_;
  int shard_ = 0, shards_ = 1;
  int64_t shard_len_ = 0;
  torch::Tensor flat_;                   // fp32 main gradients, flat (main_grads_ are views)
  torch::Tensor flat_master_;            // the fp32 tensor Adam updates (unsharded: all masters, flat)
  torch::Tensor flat_params_;            // unsharded 16-bit parameters: the flat buffer they are views of
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive: they hold the hooks
  std::unique_ptr<FlatAdam> adam_;
};

// While alive, each parameter's gradient is freed as soon as autograd has
// accumulated it, so a backward leaves one transient gradient live at a
// time, as MixedPrecisionAdam's in_backward hooks (and Megatron's) do; for
// measuring that backward's memory without main gradients. Not copyable.
class GradientDropper {
 public:
  explicit GradientDropper(const std::vector<torch::Tensor>& params);
  ~GradientDropper();
  GradientDropper(const GradientDropper&) = delete;
  GradientDropper& operator=(const GradientDropper&) = delete;

 private:
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
};

}  // namespace hetplan::profiler
