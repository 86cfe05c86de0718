#include "profiler/mixed_precision.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <iostream>

namespace hetplan::profiler {

namespace {

// Runs after autograd accumulated a parameter's gradient: moves it into the main gradient.
struct MoveIntoMainGrad : torch::autograd::FunctionPostHook {
  MoveIntoMainGrad(torch::Tensor param, torch::Tensor main) : param_(std::move(param)), main_(std::move(main)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    torch::NoGradGuard no_grad;
    torch::Tensor& g = param_.mutable_grad();
    if (g.defined()) {
      main_.add_(g);
      g = torch::Tensor();
    }
    return outputs;
  }
  torch::Tensor param_, main_;
};

struct DropGrad : torch::autograd::FunctionPostHook {
  explicit DropGrad(torch::Tensor param) : param_(std::move(param)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    param_.mutable_grad() = torch::Tensor();
    return outputs;
  }
  torch::Tensor param_;
};

}  // namespace

GradientDropper::GradientDropper(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) {
    if (!p.requires_grad()) continue;
    auto acc = torch::autograd::impl::grad_accumulator(p);
    const uintptr_t key = acc->add_post_hook(std::make_unique<DropGrad>(p));
    hooks_.emplace_back(std::move(acc), key);
  }
}

GradientDropper::~GradientDropper() {
  for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
}

MixedPrecisionAdam::MixedPrecisionAdam(std::vector<torch::Tensor> params, double lr, int shard, int shards,
                                       bool in_backward)
    : params_(std::move(params)), shard_(shard), shards_(shards) {
  init(lr);
  if (!in_backward) return;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad()) continue;
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[i]));
    accumulators_.back()->add_post_hook(std::make_unique<MoveIntoMainGrad>(params_[i], main_grads_[i]));
  }
}

void MixedPrecisionAdam::init(double lr) {
  torch::NoGradGuard no_grad;
  const int shards = shards_, shard = shard_;
  const torch::Device device = params_.empty() ? torch::Device(torch::kCPU) : params_[0].device();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  if (shards > 1) {
    shard_len_ = (n + shards - 1) / shards;
    flat_ = torch::zeros({shard_len_ * shards}, f32);
    flat_params_ = torch::zeros({shard_len_ * shards}, params_[0].options().requires_grad(false));
    int64_t offset = 0;
    for (auto& p : params_) {
      main_grads_.push_back(flat_.narrow(0, offset, p.numel()).view(p.sizes()));
      torch::Tensor view = flat_params_.narrow(0, offset, p.numel()).view(p.sizes());
      view.copy_(p.detach());
      p.set_data(view);
      offset += p.numel();
    }
    masters_.push_back(flat_params_.narrow(0, shard * shard_len_, shard_len_).to(torch::kFloat32).clone());
    flat_master_ = masters_.back();
    adam_ = std::make_unique<FlatAdam>(flat_master_, lr);
    return;
  }
  if (params_.empty()) return;
  // One flat buffer of the parameters' dtype; the parameters become views of it.
  flat_params_ = torch::empty({n}, params_[0].options().requires_grad(false));
  flat_ = torch::zeros({n}, f32);
  int64_t offset = 0;
  for (auto& p : params_) {
    torch::Tensor view = flat_params_.narrow(0, offset, p.numel()).view(p.sizes());
    view.copy_(p.detach());
    p.set_data(view);
    main_grads_.push_back(flat_.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  flat_master_ = flat_params_.scalar_type() == torch::kFloat32 ? flat_params_ : flat_params_.to(torch::kFloat32);
  offset = 0;
  for (auto& p : params_) {
    masters_.push_back(flat_master_.scalar_type() == p.scalar_type() && flat_master_.is_same(flat_params_)
                           ? p
                           : flat_master_.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  adam_ = std::make_unique<FlatAdam>(flat_master_, lr);
}

void MixedPrecisionAdam::accumulate_grads() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& g = params_[i].mutable_grad();
    if (!g.defined()) continue;
    main_grads_[i].add_(g);  // in fp32, whatever the gradient's dtype
    g = torch::Tensor();
  }
}

torch::Tensor MixedPrecisionAdam::main_grad_of(const torch::Tensor& param) const {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return main_grads_[i];
  return {};
}

void MixedPrecisionAdam::zero_grad() {
  if (flat_.defined()) flat_.zero_();  // one kernel: main_grads_ are views of it
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

void MixedPrecisionAdam::step_sharded(const Collective& reduce_scatter, const Collective& all_gather) {
  torch::NoGradGuard no_grad;
  torch::Tensor grad = flat_.narrow(0, shard_ * shard_len_, shard_len_);
  if (reduce_scatter) reduce_scatter(grad, flat_);
  adam_->step(grad);
  torch::Tensor mine = flat_params_.narrow(0, shard_ * shard_len_, shard_len_);
  mine.copy_(flat_master_);  // rounded to the parameters' dtype
  // In place on a GPU (NCCL reads this rank's chunk of the output); a copy elsewhere.
  torch::Tensor in = mine.is_cuda() ? mine : mine.clone();
  all_gather(flat_params_, in);
}

void MixedPrecisionAdam::step() {
  if (!adam_) return;
  adam_->step(flat_);
  torch::NoGradGuard no_grad;
  if (!flat_master_.is_same(flat_params_)) flat_params_.copy_(flat_master_);  // rounded to the parameters' dtype
}

FlatAdam::FlatAdam(torch::Tensor param, double lr) : param_(std::move(param)), lr_(lr) {
  if (!param_.requires_grad()) param_.requires_grad_(true);
#if TORCH_VERSION_MAJOR >= 2
  fused_ = param_.is_cuda();
#endif
  if (fused_) {
    exp_avg_ = torch::zeros_like(param_.detach());
    exp_avg_sq_ = torch::zeros_like(param_.detach());
    step_ = torch::zeros({}, param_.options().dtype(torch::kFloat32).requires_grad(false));
  } else {
    adam_ = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{param_}, torch::optim::AdamOptions(lr));
  }
}

void FlatAdam::step(const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
#if TORCH_VERSION_MAJOR >= 2
  if (fused_) {
    // torch.optim.Adam(fused=True): the step count is advanced outside the kernel.
    const bool first = !adam_started_;
    adam_started_ = true;
    try {
      step_.add_(1);
      const torch::optim::AdamOptions o(lr_);
      torch::Tensor p = param_.detach();
      at::_fused_adam_({p}, {grad}, {exp_avg_}, {exp_avg_sq_}, {}, {step_}, lr_, std::get<0>(o.betas()),
                       std::get<1>(o.betas()), o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false);
      return;
    } catch (const c10::Error& e) {
      if (!first) throw;
      // This LibTorch cannot run the fused kernel here: torch::optim::Adam from
      // the first step on (nothing was updated yet), and say so once.
      std::cerr << "FlatAdam: fused Adam unavailable (" << std::string(e.what()).substr(0, 200)
                << "); using torch::optim::Adam\n";
      fused_ = false;
      exp_avg_ = exp_avg_sq_ = step_ = torch::Tensor();
      adam_ = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{param_}, torch::optim::AdamOptions(lr_));
    }
  }
#endif
  param_.mutable_grad() = grad;
  adam_->step();
  param_.mutable_grad() = torch::Tensor();
}

double MixedPrecisionAdam::state_bytes_per_parameter(torch::Dtype param_dtype, int shards) {
  const double param = static_cast<double>(torch::elementSize(param_dtype));
  if (shards > 1) return param + 4 /* main gradient */ + 12.0 / shards /* master + moments */;
  return param + 4 /* main gradient */ + (param_dtype == torch::kFloat32 ? 0 : 4) /* master */ + 8 /* moments */;
}

}  // namespace hetplan::profiler
