// PipelineLayout: where every rank sits in a plan, which samples each data-
// parallel replica handles, and which rank pairs move activations and
// gradients between neighbouring stages. Pure bookkeeping, no tensors.
//
// Stage s owns ranks [begin_s, begin_s + dp_s * tp_s). Replica d of a stage
// is the tp ranks begin + d * tp + t (tensor-parallel ranks adjacent, as in
// Megatron, so that tp stays within a node). Each micro-batch (gbs / batches
// samples) is split over a stage's replicas by the data load balancer when
// the stage mixes device types, evenly otherwise, so neighbouring stages can
// split it differently. Activations are re-sharded explicitly: a receiver
// rank (replica d, tp index t) gets each overlapping sample range from the
// sender replica's tp rank t mod tp_sender; gradients go back the same way
// with the roles swapped.
#pragma once

#include <string>
#include <vector>

#include "sim/plan_file.h"
#include "sim/profile.h"

namespace hetplan::executor {

struct SampleRange {
  int begin = 0, end = 0;  // within a micro-batch
  int size() const { return end - begin; }
};

struct StageLayout {
  int index = 0;
  int begin = 0;  // first rank
  int dp = 1, tp = 1;
  int first_layer = 0, last_layer = 0;  // layers [first, last)
  std::vector<SampleRange> replica_samples;
  int rank(int replica, int t) const { return begin + replica * tp + t; }
  int size() const { return dp * tp; }
};

struct Transfer {
  int src = 0, dst = 0;
  SampleRange samples;
};

class PipelineLayout {
 public:
  // `rank_types`: the profile type of each rank (for the data load
  // balancer); empty, or `profiles` null, means an even split. Throws
  // InputError for a plan that cannot be executed.
  PipelineLayout(const PlanFile& plan, const std::vector<int>& rank_types, const ProfileSet* profiles);

  int world() const { return world_; }
  int num_stages() const { return static_cast<int>(stages_.size()); }
  int micro_batch() const { return micro_batch_; }
  int batches() const { return batches_; }
  const StageLayout& stage(int s) const { return stages_[s]; }
  const StageLayout& stage_of(int rank) const;
  int replica_of(int rank) const;
  int tp_index_of(int rank) const;

  // Activations from stage s to s + 1, and gradients from s + 1 back to s.
  const std::vector<Transfer>& forward_transfers(int s) const { return forward_[s]; }
  const std::vector<Transfer>& backward_transfers(int s) const { return backward_[s]; }

 private:
  int world_ = 0, micro_batch_ = 0, batches_ = 0;
  std::vector<StageLayout> stages_;
  std::vector<std::vector<Transfer>> forward_, backward_;
};

}  // namespace hetplan::executor
