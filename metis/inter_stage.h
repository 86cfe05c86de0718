// InterStagePlanGenerator: the outer loop of the Metis search.
//
// For each node sequence, for each stage count, for each device group of that
// count, for each number of micro-batches that divides gbs (largest first),
// it yields one InterStagePlan. The order, and the stage-count label, match
// the reference exactly:
//
//  * Node sequences are the permutations of the device types sorted by name,
//    in lexicographic order. (The reference iterates a Python set, whose
//    order changes with PYTHONHASHSEED; this is our fix.)
//  * Reference quirk kept: on moving to the next node sequence the reference
//    sets its stage count to 1 but loads the device groups of the next
//    non-empty stage count (2 or more). Those groups are visited twice, first
//    labelled num_stage = 1 and then with their true count, and the
//    single-stage groups are never visited for that sequence. The label
//    matters: the Metis cost model only costs num_stage stages.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "metis/device_groups.h"
#include "sim/plan.h"

namespace hetplan {

struct InterStageOptions {
  int num_device_types = 1;
  int num_devices = 1;
  int gbs = 1;
  int num_layers = 1;
  double variance = 1;
  int max_permute_len = 4;
};

class InterStagePlanGenerator {
 public:
  explicit InterStagePlanGenerator(const InterStageOptions& options);

  // Node sequence k as a list of type indices (into the sorted type names).
  const std::vector<std::vector<int>>& node_sequences() const { return node_sequences_; }

  // Every inter-stage plan, in the reference's order. Plans point into
  // device-group lists this generator owns.
  std::vector<InterStagePlan> all();

 private:
  const std::vector<DeviceGroups>& groups_for(int stages);
  // The reference's _find_next_stage_device_groups: the next stage count
  // after `from` whose groups are non-empty, or the first past the limit.
  int next_stage_count(int from, const std::vector<DeviceGroups>** groups);

  InterStageOptions opt_;
  int max_stages_;
  std::vector<std::vector<int>> node_sequences_;
  std::map<int, std::unique_ptr<std::vector<DeviceGroups>>> cache_;
};

}  // namespace hetplan
