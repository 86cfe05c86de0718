#include "executor/zero_optimizer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

namespace hetplan::executor {

struct ZeroOptimizer::Unit {
  std::vector<torch::Tensor> params;
  std::vector<int64_t> offsets;  // of each parameter in the flat buffer
  int64_t numel = 0, chunk = 0;  // padded size = chunk * group size
  int64_t shard_offset = 0;      // of this rank's chunk in master_ / grad_
  torch::Tensor flat;            // [chunk * n] 16-bit weights; ZeRO-3: storage freed while released
  bool present = true;
  torch::Tensor bucket;          // fp32 gradients of this micro-batch, while some are pending
  std::vector<char> arrived;
  int arrived_count = 0;
};

// A reduce-scatter left running: its waiter, its output, the bucket it reads (kept alive) and the unit.
struct ZeroOptimizer::Pending {
  profiler::CommGroup::Waiter wait;
  torch::Tensor out, bucket;
  int unit;
};

namespace {

// Runs after autograd accumulated a parameter's gradient: hands it to the optimizer.
struct OnGrad : torch::autograd::FunctionPostHook {
  OnGrad(std::function<void()> f) : f_(std::move(f)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    f_();
    return outputs;
  }
  std::function<void()> f_;
};

// Frees or refills a tensor's storage in place: every view of it (the
// parameters, and autograd's saved references to them) sees the change.
void free_storage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  s->set_nbytes(static_cast<size_t>(0));
}

void allocate_storage(const torch::Tensor& t, size_t bytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(int stage, std::vector<std::vector<torch::Tensor>> units, double lr,
                             std::shared_ptr<profiler::CommGroup> group)
    : stage_(stage), group_(std::move(group)) {
  if (stage_ != 2 && stage_ != 3) throw std::invalid_argument("ZeroOptimizer: stage must be 2 or 3");
  if (group_) {
    rank_ = group_->rank();
    size_ = group_->size();
  }
  torch::NoGradGuard no_grad;
  int64_t total_chunk = 0;
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;
  for (auto& ps : units) {
    auto u = std::make_unique<Unit>();
    u->params = std::move(ps);
    for (const auto& p : u->params) {
      u->offsets.push_back(u->numel);
      u->numel += p.numel();
      device = p.device();
      dtype = p.scalar_type();
    }
    u->chunk = (u->numel + size_ - 1) / size_;
    u->shard_offset = total_chunk;
    total_chunk += u->chunk;
    u->arrived.assign(u->params.size(), 0);
    units_.push_back(std::move(u));
  }
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  master_ = torch::empty({total_chunk}, f32);
  grad_ = torch::zeros({total_chunk}, f32);
  if (stage_ == 3) shard_weights_ = torch::empty({total_chunk}, torch::TensorOptions().dtype(dtype).device(device));
  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    Unit& u = *units_[ui];
    u.flat = torch::zeros({u.chunk * size_}, torch::TensorOptions().dtype(dtype).device(device));
    for (std::size_t i = 0; i < u.params.size(); ++i) {
      torch::Tensor& p = u.params[i];
      torch::Tensor view = u.flat.narrow(0, u.offsets[i], p.numel()).view(p.sizes());
      view.copy_(p.detach());
      p.set_data(view);  // the same parameter, now living in the unit's buffer
    }
    const torch::Tensor mine = u.flat.narrow(0, rank_ * u.chunk, u.chunk);
    master_.narrow(0, u.shard_offset, u.chunk).copy_(mine);
    if (stage_ == 3) {
      shard_weights_.narrow(0, u.shard_offset, u.chunk).copy_(mine);
      release(static_cast<int>(ui));
    }
    for (std::size_t i = 0; i < u.params.size(); ++i) {
      if (!u.params[i].requires_grad()) continue;
      auto acc = torch::autograd::impl::grad_accumulator(u.params[i]);
      const int unit = static_cast<int>(ui), index = static_cast<int>(i);
      const uintptr_t key = acc->add_post_hook(std::make_unique<OnGrad>([this, unit, index] { on_grad(unit, index); }));
      hooks_.emplace_back(std::move(acc), key);
    }
  }
  adam_ = std::make_unique<profiler::FlatAdam>(master_, lr);
}

ZeroOptimizer::~ZeroOptimizer() {
  for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
}

void ZeroOptimizer::gather(int ui) {
  Unit& u = *units_[ui];
  if (u.present) return;
  torch::NoGradGuard no_grad;
  allocate_storage(u.flat, static_cast<size_t>(u.flat.numel()) * u.flat.element_size());
  const torch::Tensor mine = shard_weights_.narrow(0, u.shard_offset, u.chunk);
  if (group_) {
    group_->all_gather_flat(u.flat, mine);
  } else {
    u.flat.copy_(mine);
  }
  u.present = true;
}

void ZeroOptimizer::release(int ui) {
  Unit& u = *units_[ui];
  if (stage_ != 3 || !u.present) return;
  free_storage(u.flat);
  u.present = false;
}

void ZeroOptimizer::gather_all() {
  for (int u = 0; u < num_units(); ++u) gather(u);
}

void ZeroOptimizer::register_backward_gather(torch::Tensor& output, const std::vector<int>& units) {
  if (stage_ != 3 || !output.requires_grad()) return;
  output.register_hook([this, units](torch::Tensor grad) {
    for (int u : units) gather(u);
    return grad;
  });
}

void ZeroOptimizer::on_grad(int ui, int index) {
  Unit& u = *units_[ui];
  torch::Tensor& g = u.params[index].mutable_grad();
  if (!g.defined()) return;
  torch::NoGradGuard no_grad;
  if (!u.bucket.defined()) u.bucket = torch::zeros({u.chunk * size_}, grad_.options());
  u.bucket.narrow(0, u.offsets[index], g.numel()).add_(g.reshape({-1}));  // in fp32
  g = torch::Tensor();
  if (!u.arrived[index]) {
    u.arrived[index] = 1;
    ++u.arrived_count;
  }
  if (u.arrived_count == static_cast<int>(u.params.size())) reduce_unit(ui);
}

void ZeroOptimizer::reduce_unit(int ui) {
  Unit& u = *units_[ui];
  torch::NoGradGuard no_grad;
  torch::Tensor mine = grad_.narrow(0, u.shard_offset, u.chunk);
  if (group_ && overlap_) {
    torch::Tensor out = torch::empty({u.chunk}, grad_.options());
    if (!pending_.empty()) ++overlapped_;
    pending_.push_back({group_->reduce_scatter_async(out, u.bucket), out, u.bucket, ui});
  } else if (group_) {
    torch::Tensor out = torch::empty({u.chunk}, grad_.options());
    group_->reduce_scatter(out, u.bucket);
    mine.add_(out);
  } else {
    mine.add_(u.bucket);
  }
  u.bucket = torch::Tensor();
  std::fill(u.arrived.begin(), u.arrived.end(), 0);
  u.arrived_count = 0;
  release(ui);  // ZeRO-3: the backward of this unit is done
}

void ZeroOptimizer::finish_backward() {
  for (int u = 0; u < num_units(); ++u) {
    if (units_[u]->bucket.defined()) reduce_unit(u);
    release(u);
  }
  wait_pending();
}

// In the order started: each result added into this rank's chunk of its unit.
void ZeroOptimizer::wait_pending() {
  torch::NoGradGuard no_grad;
  for (Pending& p : pending_) {
    p.wait();
    const Unit& u = *units_[p.unit];
    grad_.narrow(0, u.shard_offset, u.chunk).add_(p.out);
  }
  pending_.clear();
}

void ZeroOptimizer::zero_grad() {
  grad_.zero_();
  for (auto& u : units_)
    for (auto& p : u->params) p.mutable_grad() = torch::Tensor();
}

int ZeroOptimizer::unit_of(const torch::Tensor& param) const {
  for (std::size_t u = 0; u < units_.size(); ++u)
    for (const auto& p : units_[u]->params)
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return static_cast<int>(u);
  return -1;
}

namespace {
int64_t index_in(const std::vector<torch::Tensor>& params, const torch::Tensor& param) {
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i].unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return static_cast<int64_t>(i);
  throw std::invalid_argument("ZeroOptimizer: parameter not in its unit");
}
}  // namespace

torch::Tensor ZeroOptimizer::full_gradient(int ui, const torch::Tensor& param) {
  Unit& u = *units_[ui];
  torch::NoGradGuard no_grad;
  torch::Tensor full = torch::empty({u.chunk * size_}, grad_.options());
  const torch::Tensor mine = grad_.narrow(0, u.shard_offset, u.chunk);
  if (group_) {
    group_->all_gather_flat(full, mine);
  } else {
    full.copy_(mine);
  }
  const int64_t i = index_in(u.params, param);
  return full.narrow(0, u.offsets[i], param.numel()).view(param.sizes()).clone();
}

void ZeroOptimizer::set_unit_gradient(int ui, const torch::Tensor& param, const torch::Tensor& full) {
  Unit& u = *units_[ui];
  torch::NoGradGuard no_grad;
  const int64_t i = index_in(u.params, param);
  const int64_t lo = std::max(u.offsets[i], rank_ * u.chunk);
  const int64_t hi = std::min(u.offsets[i] + param.numel(), (rank_ + 1) * u.chunk);
  if (hi <= lo) return;
  grad_.narrow(0, u.shard_offset + lo - rank_ * u.chunk, hi - lo)
      .copy_(full.reshape({-1}).narrow(0, lo - u.offsets[i], hi - lo));
}

void ZeroOptimizer::step() {
  adam_->step(grad_);
  torch::NoGradGuard no_grad;
  for (int ui = 0; ui < num_units(); ++ui) {
    Unit& u = *units_[ui];
    const torch::Tensor master = master_.narrow(0, u.shard_offset, u.chunk);
    if (stage_ == 3) {
      shard_weights_.narrow(0, u.shard_offset, u.chunk).copy_(master);  // rounded to the weights' dtype
      continue;
    }
    const torch::Tensor mine = master.to(u.flat.scalar_type());
    if (group_) {
      group_->all_gather_flat(u.flat, mine);
    } else {
      u.flat.copy_(mine);
    }
  }
}

double ZeroOptimizer::state_bytes_per_parameter(torch::Dtype param_dtype, int stage, int shards) {
  const double w = static_cast<double>(torch::elementSize(param_dtype));
  return (stage >= 3 ? w / shards : w) + 16.0 / shards;
}

}  // namespace hetplan::executor
