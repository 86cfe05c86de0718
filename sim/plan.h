// The pieces of a heterogeneous training plan, in Metis's terms.
//
// An inter-stage plan fixes the node sequence (the order device types are
// laid out over ranks), the device groups (GPUs per pipeline stage, in rank
// order) and the number of micro-batches. An intra-stage plan adds a (dp, tp)
// Strategy per stage and a LayerPartition (layer_partition[i] is the first
// layer of stage i, the last entry is one past the last layer).
#pragma once

#include <string>
#include <vector>

namespace hetplan {

struct Strategy {
  int dp = 1;
  int tp = 1;
  bool operator==(const Strategy&) const = default;
};

struct InterStagePlan {
  int ns_idx = 0;                             // index into the node sequences
  const std::vector<int>* device_groups = nullptr;  // GPUs per stage, owned by the generator
  // The stage count the reference's generator reports. It normally equals
  // device_groups->size(), except right after the generator moves to the next
  // node sequence (see InterStagePlanGenerator); the Metis cost model then
  // only costs the first num_stage stages.
  int num_stage = 1;
  int batches = 1;  // number of micro-batches
  int gbs = 1;

  int num_stages() const { return static_cast<int>(device_groups->size()); }
};

// A complete, costed plan, as search results report it.
struct PlanResult {
  std::vector<std::string> node_sequence;
  std::vector<int> device_groups;
  std::vector<Strategy> strategies;
  int batches = 0;
  std::vector<int> layer_partition;
  int num_repartition = 0;
  double cost = 0;
};

}  // namespace hetplan
