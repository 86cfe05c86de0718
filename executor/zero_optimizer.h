// ZeroOptimizer: ZeRO-1, ZeRO-2 and ZeRO-3 for one rank of a stage's data-parallel
// group, on top of the mixed-precision scheme of profiler/mixed_precision.h
// (16-bit weights; fp32 main gradients, master weights and Adam moments).
//
// Parameters are grouped into units (a pipeline stage's layers; a tied
// embedding is a unit of its own so that both pipeline ends shard it alike).
// Each unit is one flat buffer, padded to a multiple of the group size n;
// rank r owns chunk r of every unit. This rank keeps, for its chunks only, the
// fp32 main gradient, fp32 master weights and Adam's two moments:
//   ZeRO-1 (Megatron's distributed optimizer, --overlap-grad-reduce): full
//           16-bit weights and full fp32 main gradients (one flat buffer,
//           summed over the step's micro-batches) + 12 / n bytes per
//           parameter. In the last micro-batch's backward (begin_backward(true))
//           each unit's summed gradient is reduce-scattered into this rank's
//           chunk as soon as the unit's gradients are complete. step() as ZeRO-2.
//   ZeRO-2 (Megatron's distributed optimizer with sharded gradients,
//           DeepSpeed stage 2): full 16-bit weights + 16 / n bytes per
//           parameter. The gradients of a unit are reduce-scattered over the
//           group as soon as the backward of a micro-batch has produced them
//           all (a transient fp32 bucket of the unit), and the result added
//           into this rank's fp32 gradient chunk. step() updates the chunk
//           and all-gathers the updated 16-bit weights of each unit.
//   ZeRO-3 (FSDP's FULL_SHARD): as ZeRO-2, and the 16-bit weights too are
//           kept as this rank's chunks only (2 / n bytes). A unit's weights are
//           all-gathered just before its forward and freed right after it;
//           gathered again just before its backward (a hook on the layer's
//           output gradient) and freed once its gradients are reduce-scattered.
//           With set_prefetch(true) (Megatron's --overlap-param-gather, FSDP's
//           forward and backward prefetch) the caller starts the next layer's
//           gathers (prefetch()) before the current layer computes, so that
//           they run on NCCL's stream beside that compute; gather() then only
//           makes the compute stream wait for them.
// With set_overlap(true) (DeepSpeed's overlap_comm, Megatron's
// --overlap-grad-reduce) a unit's reduce-scatter is left running while the
// backward goes on and waited for at the micro-batch's end.
//
// Adam is elementwise, so the updates equal unsharded Adam on the summed
// gradients up to the order of floating-point additions.
//
// The parameters keep their identity (autograd leaves, module members): they
// become views of their unit's flat buffer (set_data), and ZeRO-3 frees and
// refills that buffer's storage in place, as FSDP does. On CUDA, collectives
// are issued on the calling thread's current stream's order (c10d NCCL) and
// waited for without host syncs. REQUIRES: every rank
// of the group builds the same units in the same order and runs the same
// forward and backward sequence (collectives are issued from autograd hooks).
// Not thread-safe; the parameters and the group must outlive it.
//
// Test hook (fault injection, read once at construction): HETPLAN_ZERO_FAULT=skip_gather_wait uses
// gathered weights without waiting for their all-gather, =skip_reduce_wait drops the overlapped
// reduce-scatters' results without waiting for them; tests show that replay then no longer trains like
// one process.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "profiler/distributed.h"
#include "profiler/mixed_precision.h"

namespace hetplan::executor {

class ZeroOptimizer {
 public:
  // `units`: each unit's parameters (every parameter in exactly one unit).
  // `group`: the data-parallel group (null: a group of one rank).
  // `stage`: 1, 2 or 3.
  ZeroOptimizer(int stage, std::vector<std::vector<torch::Tensor>> units, double lr,
                std::shared_ptr<profiler::CommGroup> group);
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  int stage() const { return stage_; }
  int num_units() const { return static_cast<int>(units_.size()); }

  // ZeRO-3: make unit u's full weights present (no-op if they are, and for
  // ZeRO-1/2), and free them again. Forward: gather, (prefetch the next
  // layer's units,) run, release. Backward: register_backward_gather(output,
  // units, next) on the layer's output.
  void gather(int u);
  void release(int u);
  void gather_all();
  // ZeRO-3 with set_prefetch(true): starts unit u's all-gather and returns (no-op if it is present or
  // being gathered); gather(u) waits for it. Call it before issuing the compute it should overlap.
  void prefetch(int u);
  // Gathers `units` when the gradient of `output` arrives (before the
  // backward of the layer that produced it), and then prefetches `next`
  // (the layer before's units). No-op for ZeRO-1/2.
  void register_backward_gather(torch::Tensor& output, const std::vector<int>& units,
                                const std::vector<int>& next = {});

  // Before each micro-batch's backward: whether it is the step's last (ZeRO-1 reduces only in that one).
  void begin_backward(bool last_micro_batch) { last_micro_batch_ = last_micro_batch; }
  // After each micro-batch's backward: reduce-scatters what a unit's hooks
  // left pending (a unit some of whose parameters got no gradient), in unit
  // order, waits for the overlapped ones, and (ZeRO-3) frees units still gathered.
  void finish_backward();
  // Overlapped reduction (DeepSpeed's overlap_comm, Megatron's --overlap-grad-reduce): a unit's
  // reduce-scatter is started when its gradients are complete and left running while the backward goes
  // on; finish_backward() waits for them in order and adds each into this rank's chunk (the same sums,
  // in the same order, as without it). Off by default.
  void set_overlap(bool on) { overlap_ = on; }
  // ZeRO-3's prefetch (see prefetch()). Off by default: prefetch() does nothing.
  void set_prefetch(bool on) { prefetch_ = on; }
  // Reduce-scatters started while another was still running (the backward computed in between).
  long long overlapped_collectives() const { return overlapped_; }
  // ZeRO-3: gathers that gather() found started by prefetch().
  long long prefetched_gathers() const { return prefetched_; }
  void zero_grad();
  // The full fp32 gradient of unit u summed over the group, as a tensor
  // shaped like its parameter `param` (one of the unit's parameters); for
  // syncing a tied embedding between pipeline stages: change it, then
  // set_unit_gradient() puts this rank's chunk back.
  torch::Tensor full_gradient(int u, const torch::Tensor& param);
  void set_unit_gradient(int u, const torch::Tensor& param, const torch::Tensor& full);
  int unit_of(const torch::Tensor& param) const;  // -1 if none
  // Adam on this rank's chunks, then the updated 16-bit weights: all-gathered
  // (ZeRO-1/2) or kept as chunks until the next gather (ZeRO-3).
  void step();

  // Bytes per parameter held persistently (weights + fp32 gradient + master + moments).
  static double state_bytes_per_parameter(torch::Dtype param_dtype, int stage, int shards);

 private:
  struct Unit;
  void on_grad(int u, int index);
  void reduce_unit(int u);
  torch::Tensor grad_chunk(int u) const;  // this rank's fp32 gradient chunk of unit u
  void settle(int u);
  void start_gather(Unit& u, bool wait);
  void finish_gather(Unit& u);
  void wait_pending();
  struct Pending;
  std::vector<Pending> pending_;
  bool overlap_ = false, prefetch_ = false, last_micro_batch_ = true;
  bool fault_skip_gather_wait_ = false, fault_skip_reduce_wait_ = false;
  long long overlapped_ = 0, prefetched_ = 0;
  torch::Tensor full_grads_;         // ZeRO-1: fp32 main gradients of all units, flat (the units' buckets are views)
  int stage_;
  std::shared_ptr<profiler::CommGroup> group_;
  int rank_ = 0, size_ = 1;
  std::vector<std::unique_ptr<Unit>> units_;
  torch::Tensor master_, grad_;      // ZeRO-2/3: fp32, this rank's chunks of all units, concatenated
  torch::Tensor shard_weights_;      // ZeRO-3: the 16-bit chunks
  std::unique_ptr<profiler::FlatAdam> adam_;  // ZeRO-2/3: on master_ (ZeRO-1: one per unit)
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
};

}  // namespace hetplan::executor
