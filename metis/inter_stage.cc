#include "metis/inter_stage.h"

#include <algorithm>
#include <numeric>

namespace hetplan {

InterStagePlanGenerator::InterStagePlanGenerator(const InterStageOptions& options)
    : opt_(options), max_stages_(std::min(options.num_devices, options.num_layers)) {
  std::vector<int> types(options.num_device_types);
  std::iota(types.begin(), types.end(), 0);
  do {
    node_sequences_.push_back(types);
  } while (std::next_permutation(types.begin(), types.end()));
}

const std::vector<DeviceGroups>& InterStagePlanGenerator::groups_for(int stages) {
  auto& slot = cache_[stages];
  if (!slot)
    slot = std::make_unique<std::vector<DeviceGroups>>(
        device_groups_for_stages(stages, opt_.num_devices, opt_.variance, opt_.max_permute_len));
  return *slot;
}

int InterStagePlanGenerator::next_stage_count(int from, const std::vector<DeviceGroups>** groups) {
  int stages = from + 1;
  while (true) {
    *groups = &groups_for(stages);
    if (!(*groups)->empty() || stages > max_stages_) break;
    ++stages;
  }
  return stages;
}

std::vector<InterStagePlan> InterStagePlanGenerator::all() {
  std::vector<InterStagePlan> plans;
  const int gbs = opt_.gbs;
  const int num_ns = static_cast<int>(node_sequences_.size());

  int ns_idx = 0, num_stage = 1, dg_idx = 0, batches = gbs + 1;
  const std::vector<DeviceGroups>* groups = &groups_for(1);
  while (true) {
    // Next number of micro-batches that divides gbs, counting down.
    int b = batches - 1;
    while (b >= 1 && gbs % b != 0) --b;
    batches = b;
    if (batches == 0) {
      ++dg_idx;
      batches = gbs;
    }
    if (dg_idx >= static_cast<int>(groups->size())) {
      num_stage = next_stage_count(num_stage, &groups);
      batches = gbs;
      dg_idx = 0;
    }
    if (num_stage > max_stages_) {
      ++ns_idx;
      num_stage = 1;                     // the label is reset ...
      next_stage_count(1, &groups);      // ... but the groups are those of 2+ stages
      batches = gbs;
      dg_idx = 0;
    }
    if (ns_idx >= num_ns) break;
    if (groups->empty()) {
      // The reference indexes an empty list here and crashes (e.g. a GPU
      // count that is not a power of two has no single-stage group). We skip
      // to the next stage count instead.
      batches = 1;
      dg_idx = 0;
      continue;
    }
    InterStagePlan p;
    p.ns_idx = ns_idx;
    p.device_groups = &(*groups)[dg_idx];
    p.num_stage = num_stage;
    p.batches = batches;
    p.gbs = gbs;
    plans.push_back(p);
  }
  return plans;
}

}  // namespace hetplan
