// Layer load balancing: which layers each pipeline stage runs.
//
// LayerComputeBalancer splits the layers in proportion to each stage's share
// of compute, on a grid of 7 "hallucinated" sub-layers per layer: a greedy
// forward pass over all stages but the last, a backward pass that fills the
// last stage, a pass that places leftovers on the stage with most spare
// capacity, a majority vote back to whole layers (a layer no stage holds 4 of
// 7 sub-layers of is dropped, as in the reference), and up to four single-
// layer moves toward the most loaded stage's neighbour.
//
// LayerLoadBalancer wraps it with Metis's memory check: if a stage's memory
// demand (5 x its profiled layer memory) exceeds its capacity, compute shares
// are shifted away from short stages and the split is retried, three times
// at most.
//
// Both keep their scratch space between calls: one instance per thread.
#pragma once

#include <stdexcept>
#include <vector>

#include "sim/plan.h"
#include "sim/profile.h"

namespace hetplan {

class LayerComputeBalancer {
 public:
  // `norm_layer_duration`: each layer's share of the model's compute.
  explicit LayerComputeBalancer(const std::vector<double>& norm_layer_duration, int hallucination = 7);

  // Writes num_stages + 1 entries to `partition`. `stage_capacity` is each
  // stage's share of compute (need not sum to 1).
  void run(const double* stage_capacity, int num_stages, int* partition);

  int num_layers() const { return num_layers_; }

 private:
  void assign(int sub_layer, int stage);
  int proper_stage(int sub_layer) const;

  int num_layers_, hallucination_, num_sub_;
  std::vector<double> demand_, sub_demand_;
  SliceSums demand_sums_;
  // Scratch.
  std::vector<double> capa_, committed_capa_, bak_;
  std::vector<int> owner_, count_, min_sub_, max_sub_, real_owner_, real_count_, committed_count_;
};

// What partition_layer returns (the reference's five-tuple).
struct LayerPartitionResult {
  bool ok = false;                   // false: the reference's None partition
  int num_repartition = -1;          // the attempt that fit (1..3), -1 if none
  std::vector<int> layer_partition;  // num_stages + 1 entries when ok
  std::vector<double> memory_state;  // capacity - demand per stage when ok
  std::vector<double> failed_memory_stage;  // the first attempt's state if it did not fit
  int new_partition_count = 0;       // failed attempts, counted as search steps
};

// A (type, tp, bs) profile the memory check needed and did not find. The
// reference crashes with a KeyError there; the search reports it.
struct MissingProfileError : std::runtime_error {
  MissingProfileError(int type, int tp, int bs, const std::string& what)
      : std::runtime_error(what), type(type), tp(tp), bs(bs) {}
  int type, tp, bs;
};

class LayerLoadBalancer {
 public:
  // `rank_types`: the profile type of every rank of the cluster, in the plan's
  // node-sequence order.
  LayerLoadBalancer(const ProfileSet& profiles, const std::vector<double>& norm_layer_duration);

  void partition_layer(const InterStagePlan& plan, const std::vector<int>& rank_types, const Strategy* strategies,
                       const double* compute_share, const double* memory_capacity, LayerPartitionResult* out);

  // Metis's memory demand of each stage for a given partition (MB).
  void stage_memory_demand(const InterStagePlan& plan, const std::vector<int>& rank_types, const Strategy* strategies,
                           const int* layer_partition, double* demand) const;

  // Metis's _adj_compute_performance. Returns false for its None.
  static bool adjust_compute_share(const double* share, const double* capacity, const double* demand, int n,
                                   double* adjusted);

 private:
  const ProfileSet* profiles_;
  LayerComputeBalancer compute_;
  std::vector<double> share_, demand_, usage_, adjusted_;
  std::vector<int> partition_;
};

}  // namespace hetplan
