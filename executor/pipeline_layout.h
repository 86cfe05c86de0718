// PipelineLayout: where every rank sits in a plan, which samples each data-
// parallel replica handles, and which rank pairs move activations and
// gradients between neighbouring stages. Pure bookkeeping, no tensors.
//
// Stage s owns ranks [begin_s, begin_s + dp_s * tp_s), laid out by its
// StageGrid (sim/parallel_layout.h, Megatron's order: replica d's tp ranks
// are adjacent, so that tp stays within a node). The process groups a rank
// joins (its tp and dp groups, the tied-embedding group) are named and
// seated here from that grid, so every rank derives the same groups.
// Each micro-batch (gbs / batches
// samples) is split over a stage's replicas by the data load balancer when
// the stage mixes device types, evenly otherwise, so neighbouring stages can
// split it differently. Activations are re-sharded explicitly: a receiver
// rank (replica d, tp index t) gets each overlapping sample range from the
// sender replica's tp rank t mod tp_sender; gradients go back the same way
// with the roles swapped.
//
// Context parallelism (the plan's context_parallel cp > 1, carved from every
// stage's dp, Megatron's order: StageGrid::cp_group): the cp ranks of one
// Megatron replica (replicas d with equal d / cp) take the same samples, each
// its part of every sequence, so a stage's micro-batch splits over dp / cp
// replicas (evenly: the data load balancer is not used under cp). Between
// stages, activations stay split by cp: a receiver of cp index c gets them
// from senders of cp index c only.
//
// Interleaved 1F1B (the plan's virtual_stages v > 1): stage s's layers split
// into v chunks (chunk_layers, sim/schedule.h), and the model runs them in
// virtual-stage order, so chunk c of the last stage feeds chunk c + 1 of the
// first: those activations (and their gradients back) move as between
// neighbouring stages (wrap_forward_transfers / wrap_backward_transfers).
// Like Megatron, it needs pp >= 2 and a micro-batch count that is a multiple
// of pp.
//
// Thread-safety: immutable after construction. It keeps no pointers to the
// plan or the profiles it was built from.
#pragma once

#include <string>
#include <vector>

#include "sim/parallel_layout.h"
#include "sim/plan_file.h"
#include "sim/profile.h"

namespace hetplan::executor {

struct SampleRange {
  int begin = 0, end = 0;  // within a micro-batch
  int size() const { return end - begin; }
};

// A stage: its rank grid (first rank, dp, tp), its layers and each replica's samples.
struct StageLayout : StageGrid {
  int index = 0;
  int first_layer = 0, last_layer = 0;  // layers [first, last) in the plan's numbering
  // Per model chunk (one without interleaving): the model layers [first, second) it runs.
  std::vector<std::pair<int, int>> chunk_layers;
  std::vector<SampleRange> replica_samples;
};

// A rank's seat in one process group: every member names the group alike,
// and `position` is the rank's place in it (-1: the rank joins no such group).
struct GroupSeat {
  std::string name;
  int position = -1, size = 0;
  bool member() const { return position >= 0; }
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
  int virtual_stages() const { return virtual_stages_; }
  int context_parallel() const { return context_parallel_; }
  const StageLayout& stage(int s) const { return stages_[s]; }
  const StageLayout& stage_of(int rank) const;
  int replica_of(int rank) const;
  int tp_index_of(int rank) const;

  // The groups `rank` joins (none where the group would be the rank alone):
  // its replica's tp group "tp.<stage>.<replica>", seated by tp index; its tp
  // index's dp group "dp.<stage>.<tp index>", seated by replica.
  GroupSeat tp_seat(int rank) const;
  GroupSeat dp_seat(int rank) const;
  // Context parallelism: `rank`'s cp group "cp.<stage>.<Megatron replica>.<tp index>", seated by cp index
  // (none when cp = 1). Its dp group above spans dp x cp, over which gradients are summed.
  GroupSeat cp_seat(int rank) const;
  // Tied embeddings split over the first and the last stage (two or more
  // stages): the group that sums their gradients. Megatron's pairs
  // "emb.<replica>.<tp index>" (the first stage's rank at 0) when both stages
  // have the same (dp, tp); otherwise one group "emb" of all their ranks (the
  // first stage's, then the last's), which sums full-size gradients
  // (embedding_group_full()).
  GroupSeat embedding_seat(int rank) const;
  bool embedding_group_full() const;

  // Activations from stage s to s + 1, and gradients from s + 1 back to s.
  const std::vector<Transfer>& forward_transfers(int s) const { return forward_[s]; }
  const std::vector<Transfer>& backward_transfers(int s) const { return backward_[s]; }
  // Interleaved: activations from the last stage to the first (chunk c to c + 1), gradients back.
  const std::vector<Transfer>& wrap_forward_transfers() const { return wrap_forward_; }
  const std::vector<Transfer>& wrap_backward_transfers() const { return wrap_backward_; }

 private:
  int world_ = 0, micro_batch_ = 0, batches_ = 0, virtual_stages_ = 1, context_parallel_ = 1;
  std::vector<StageLayout> stages_;
  std::vector<std::vector<Transfer>> forward_, backward_;
  std::vector<Transfer> wrap_forward_, wrap_backward_;
};

}  // namespace hetplan::executor
