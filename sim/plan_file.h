// PlanFile: one plan as `hetplan search --json` writes each entry of "top"
// (and "best"): the plan itself, plus the model, the global batch size and
// the cluster and profile paths it was searched with, so that `simulate` and
// `replay` can take it with no editing.
#pragma once

#include <string>

#include "base/json_util.h"
#include "sim/model_config.h"
#include "sim/plan.h"

namespace hetplan {

struct PlanFile {
  PlanResult plan;
  ModelConfig model;
  int gbs = 0;
  std::string hostfile, clusterfile, profile_dir;  // may be empty
  // The training setting `search --cost-model sim` costed the plan with
  // (--zero/--recompute auto); -1 and "" when the file records none.
  int zero_stage = -1;
  std::string recompute;
  // The pipeline schedule the default search costed the plan with ("gpipe"
  // or "1f1b"); "" when the file records none.
  std::string schedule;
};

ordered_json model_to_json(const ModelConfig& m);
ModelConfig model_from_json(const ordered_json& j, const std::string& file);

ordered_json plan_to_json(const PlanResult& p);
ordered_json plan_file_to_json(const PlanFile& f);

// Reads a plan entry, or a whole search result (then its "best"). Checks that
// the plan is consistent (stage counts, layer partition, dp * tp = group
// size). Throws InputError naming the file and key. A relative hostfile,
// clusterfile or profile_dir is taken next to the plan file where that path
// exists, else as written (relative to the working directory).
PlanFile read_plan_file(const std::string& path);
PlanFile plan_file_from_json(const ordered_json& j, const std::string& file);

}  // namespace hetplan
