#include "executor/zero_optimizer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace hetplan::executor {

struct ZeroOptimizer::Unit {
  std::vector<torch::Tensor> params;
  std::vector<int64_t> offsets;  // of each parameter in the flat buffer
  int64_t numel = 0, chunk = 0;  // padded size = chunk * group size
  int64_t shard_offset = 0;      // of this rank's chunk in master_ / grad_
  torch::Tensor flat;            // [chunk * n] 16-bit weights; ZeRO-3: storage freed while released
  bool present = true;
  profiler::CommGroup::Waiter gathering;  // ZeRO-3: an all-gather into flat, started and not yet waited for
  bool prefetched = false;                // that all-gather was started by prefetch()
  // fp32 gradients: ZeRO-2/3 of this micro-batch, while some are pending (transient); ZeRO-1 the step's
  // sum over micro-batches (a view of full_grads_).
  torch::Tensor bucket;
  std::vector<char> arrived;
  int arrived_count = 0;
  bool reduced = false;  // a reduce-scatter of this step has landed in (or is bound for) its chunk directly
  // ZeRO-1: this rank's fp32 master chunk and Adam on it (its gradient: this rank's chunk of the bucket,
  // where the reduce-scatter leaves it in place, so the fp32 gradients take no second buffer).
  torch::Tensor master;
  std::unique_ptr<profiler::FlatAdam> adam;
};

// A reduce-scatter left running: its waiter, its output, the bucket it reads (kept alive) and the unit;
// `add`: the output is a temporary to add into the unit's chunk of grad_ (else it is that chunk).
struct ZeroOptimizer::Pending {
  profiler::CommGroup::Waiter wait;
  torch::Tensor out, bucket;
  int unit;
  bool add;
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
  if (stage_ < 1 || stage_ > 3) throw std::invalid_argument("ZeroOptimizer: stage must be 1, 2 or 3");
  if (group_) {
    rank_ = group_->rank();
    size_ = group_->size();
  }
  if (const char* fault = std::getenv("HETPLAN_ZERO_FAULT")) {
    fault_skip_gather_wait_ = std::string(fault) == "skip_gather_wait";
    fault_skip_reduce_wait_ = std::string(fault) == "skip_reduce_wait";
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
  if (stage_ >= 2) {
    master_ = torch::empty({total_chunk}, f32);
    grad_ = torch::zeros({total_chunk}, f32);
  }
  if (stage_ == 1) {
    int64_t padded = 0;
    for (const auto& u : units_) padded += u->chunk * size_;
    full_grads_ = torch::zeros({padded}, f32);
    padded = 0;
    for (auto& u : units_) {
      u->bucket = full_grads_.narrow(0, padded, u->chunk * size_);
      padded += u->chunk * size_;
    }
  }
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
    if (stage_ == 1) {
      u.master = mine.to(torch::kFloat32).clone();
      u.adam = std::make_unique<profiler::FlatAdam>(u.master, lr);
    } else {
      master_.narrow(0, u.shard_offset, u.chunk).copy_(mine);
    }
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
  if (stage_ >= 2) adam_ = std::make_unique<profiler::FlatAdam>(master_, lr);
}

// A unit no reduce-scatter reached this step (no parameter of it got a gradient): its chunk is zero.
void ZeroOptimizer::settle(int ui) {
  Unit& u = *units_[ui];
  if (u.reduced) return;
  torch::NoGradGuard no_grad;
  grad_chunk(ui).zero_();
  u.reduced = true;
}

torch::Tensor ZeroOptimizer::grad_chunk(int ui) const {
  const Unit& u = *units_[ui];
  return stage_ == 1 ? u.bucket.narrow(0, rank_ * u.chunk, u.chunk) : grad_.narrow(0, u.shard_offset, u.chunk);
}

ZeroOptimizer::~ZeroOptimizer() {
  for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
}

// ZeRO-3: unit u's storage back, and the all-gather into it done (`wait`) or started (one outstanding per
// unit; Gloo's asynchronous form stages the chunks, so the synchronous one is used where nothing overlaps).
void ZeroOptimizer::start_gather(Unit& u, bool wait) {
  torch::NoGradGuard no_grad;
  allocate_storage(u.flat, static_cast<size_t>(u.flat.numel()) * u.flat.element_size());
  const torch::Tensor mine = shard_weights_.narrow(0, u.shard_offset, u.chunk);
  if (group_ && wait) {
    group_->all_gather_flat(u.flat, mine);
  } else if (group_) {
    u.gathering = group_->all_gather_flat_async(u.flat, mine);
  } else {
    u.flat.copy_(mine);
  }
  u.present = true;
}

// The unit's outstanding all-gather, waited for (on CUDA: the current stream waits; no host sync).
void ZeroOptimizer::finish_gather(Unit& u) {
  if (u.gathering) {
    if (!fault_skip_gather_wait_) u.gathering();
    u.gathering = nullptr;
    if (u.prefetched) ++prefetched_;
  }
  u.prefetched = false;
}

void ZeroOptimizer::gather(int ui) {
  Unit& u = *units_[ui];
  if (!u.present) start_gather(u, /*wait=*/true);
  finish_gather(u);
}

void ZeroOptimizer::prefetch(int ui) {
  Unit& u = *units_[ui];
  if (stage_ != 3 || !prefetch_ || u.present) return;
  start_gather(u, /*wait=*/false);
  u.prefetched = true;
}

void ZeroOptimizer::release(int ui) {
  Unit& u = *units_[ui];
  if (stage_ != 3 || !u.present) return;
  if (u.gathering) {  // prefetched and never used: the gather must end before its buffer goes
    if (!fault_skip_gather_wait_) u.gathering();
    u.gathering = nullptr;
  }
  u.prefetched = false;
  free_storage(u.flat);
  u.present = false;
}

void ZeroOptimizer::gather_all() {
  for (int u = 0; u < num_units(); ++u) gather(u);
}

void ZeroOptimizer::register_backward_gather(torch::Tensor& output, const std::vector<int>& units,
                                             const std::vector<int>& next) {
  if (stage_ != 3 || !output.requires_grad()) return;
  output.register_hook([this, units, next](torch::Tensor grad) {
    for (int u : units) gather(u);
    for (int u : next) prefetch(u);  // before this layer's backward is issued: it runs beside it
    return grad;
  });
}

void ZeroOptimizer::on_grad(int ui, int index) {
  Unit& u = *units_[ui];
  torch::Tensor& g = u.params[index].mutable_grad();
  if (!g.defined()) return;
  torch::NoGradGuard no_grad;
  torch::Tensor slot;
  if (stage_ == 1) {
    u.bucket.narrow(0, u.offsets[index], g.numel()).add_(g.reshape({-1}));  // in fp32, summed over micro-batches
  } else {
    // A fresh bucket each micro-batch (its last one may still be read by an overlapped reduce-scatter): the
    // first gradient of each parameter is copied in (converted to fp32), a second one added.
    if (!u.bucket.defined()) u.bucket = torch::empty({u.chunk * size_}, grad_.options());
    slot = u.bucket.narrow(0, u.offsets[index], g.numel());
    if (u.arrived[index]) slot.add_(g.reshape({-1}));
    else slot.copy_(g.reshape({-1}));
  }
  g = torch::Tensor();
  if (!u.arrived[index]) {
    u.arrived[index] = 1;
    ++u.arrived_count;
  }
  if (u.arrived_count == static_cast<int>(u.params.size()) && (stage_ != 1 || last_micro_batch_)) reduce_unit(ui);
}

void ZeroOptimizer::reduce_unit(int ui) {
  Unit& u = *units_[ui];
  torch::NoGradGuard no_grad;
  if (stage_ != 1) {
    // What no gradient was copied into (padding, parameters without one) is zero.
    if (u.numel < u.chunk * size_) u.bucket.narrow(0, u.numel, u.chunk * size_ - u.numel).zero_();
    for (std::size_t i = 0; i < u.params.size(); ++i)
      if (!u.arrived[i]) u.bucket.narrow(0, u.offsets[i], u.params[i].numel()).zero_();
  }
  torch::Tensor mine = grad_chunk(ui);
  // The step's first reduce-scatter of the unit goes straight into its chunk (zeroed by zero_grad; ZeRO-1:
  // in place, this rank's chunk of the bucket); later ones (ZeRO-2/3's further micro-batches) into a
  // temporary added to it.
  const bool add = u.reduced;
  u.reduced = true;
  if (group_) {
    torch::Tensor out = add ? torch::empty({u.chunk}, mine.options()) : mine;
    if (overlap_) {
      if (!pending_.empty()) ++overlapped_;
      pending_.push_back({group_->reduce_scatter_async(out, u.bucket), out, u.bucket, ui, add});
    } else {
      group_->reduce_scatter(out, u.bucket);
      if (add) mine.add_(out);
    }
  } else if (add) {
    mine.add_(u.bucket);
  } else if (stage_ != 1) {  // (ZeRO-1's chunk is the bucket itself)
    mine.copy_(u.bucket);
  }
  if (stage_ != 1) u.bucket = torch::Tensor();
  std::fill(u.arrived.begin(), u.arrived.end(), 0);
  u.arrived_count = 0;
  release(ui);  // ZeRO-3: the backward of this unit is done
}

void ZeroOptimizer::finish_backward() {
  for (int u = 0; u < num_units(); ++u) {
    Unit& unit = *units_[u];
    if (stage_ == 1) {
      // The last micro-batch reduces every unit once (also one some of whose parameters got no gradient).
      if (last_micro_batch_ && !unit.reduced) reduce_unit(u);
      std::fill(unit.arrived.begin(), unit.arrived.end(), 0);
      unit.arrived_count = 0;
      continue;
    }
    if (unit.bucket.defined()) reduce_unit(u);
    release(u);
  }
  wait_pending();
}

// In the order started: each result added into this rank's chunk of its unit (or already there).
void ZeroOptimizer::wait_pending() {
  torch::NoGradGuard no_grad;
  for (Pending& p : pending_) {
    if (fault_skip_reduce_wait_) continue;
    p.wait();
    if (!p.add) continue;
    grad_chunk(p.unit).add_(p.out);
  }
  pending_.clear();
}

// ZeRO-2/3 need not zero grad_: each unit's first reduce-scatter of a step overwrites its chunk, and
// settle() zeroes the chunks of units that got none.
void ZeroOptimizer::zero_grad() {
  if (full_grads_.defined()) full_grads_.zero_();
  for (auto& u : units_) {
    u->reduced = false;
    for (auto& p : u->params) p.mutable_grad() = torch::Tensor();
  }
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
  settle(ui);
  Unit& u = *units_[ui];
  torch::NoGradGuard no_grad;
  const torch::Tensor mine = grad_chunk(ui);
  torch::Tensor full = torch::empty({u.chunk * size_}, mine.options());
  if (group_) {
    group_->all_gather_flat(full, mine);
  } else {
    full.copy_(mine);
  }
  const int64_t i = index_in(u.params, param);
  return full.narrow(0, u.offsets[i], param.numel()).view(param.sizes()).clone();
}

void ZeroOptimizer::set_unit_gradient(int ui, const torch::Tensor& param, const torch::Tensor& full) {
  settle(ui);
  Unit& u = *units_[ui];
  torch::NoGradGuard no_grad;
  const int64_t i = index_in(u.params, param);
  const int64_t lo = std::max(u.offsets[i], rank_ * u.chunk);
  const int64_t hi = std::min(u.offsets[i] + param.numel(), (rank_ + 1) * u.chunk);
  if (hi <= lo) return;
  grad_chunk(ui).narrow(0, lo - rank_ * u.chunk, hi - lo)
      .copy_(full.reshape({-1}).narrow(0, lo - u.offsets[i], hi - lo));
}

void ZeroOptimizer::step() {
  for (int ui = 0; ui < num_units(); ++ui) settle(ui);
  if (adam_) adam_->step(grad_);
  torch::NoGradGuard no_grad;
  if (stage_ == 3) {
    shard_weights_.copy_(master_);  // rounded to the weights' dtype; the chunks lie alike in both
    return;
  }
  for (int ui = 0; ui < num_units(); ++ui) {
    Unit& u = *units_[ui];
    if (u.adam) u.adam->step(grad_chunk(ui));  // ZeRO-1: Adam per unit (elementwise: the same updates)
    const torch::Tensor master = stage_ == 1 ? u.master : master_.narrow(0, u.shard_offset, u.chunk);
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
  if (stage <= 1) return w + 4.0 + 12.0 / shards;
  return (stage >= 3 ? w / shards : w) + 16.0 / shards;
}

}  // namespace hetplan::executor
