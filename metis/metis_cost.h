// MetisCostModel: the heterogeneous cost estimator of Metis, term for term.
//
// cost = ((batches - 1) * max stage time + sum of stage times)
//      + fb_sync of the last stage * batches
//      + max per-stage optimizer time + max per-stage dp all-reduce time
//      + pp activation transfers + batch generation * batches
//
// It reproduces the reference bit for bit, including its quirks: bandwidths
// are Metis's (see RankLayout), only the first plan.num_stage stages are
// costed, and a plan whose lookups fail is skipped (the reference raises a
// KeyError that its search loop catches).
#pragma once

#include <string>
#include <vector>

#include "sim/model_config.h"
#include "sim/plan.h"
#include "sim/profile.h"
#include "sim/rank_layout.h"

namespace hetplan {

struct CostTerms {
  double execution = 0;         // ((batches - 1) * max_l) + sum(lens)
  double fb_sync = 0;           // last stage's fb_sync * batches
  double parameter_update = 0;  // max over stages
  double dp = 0;                // max over stages
  double pp = 0;                // sum over stage boundaries
  double batch_generate = 0;
  double total = 0;
};

// Why a plan could not be costed: the reference's KeyError.
struct SkippedPlan {
  int type = -1, tp = 0, bs = 0;  // the (profile type, tp, bs) not found
  std::string reason;
};

class MetisCostModel {
 public:
  // `profile_type[t]` is the ProfileSet type index of cluster type t.
  MetisCostModel(const ProfileSet& profiles, const ModelConfig& model, std::vector<int> profile_type,
                 int max_profiled_batch_size);

  // Returns false (and fills `skipped` if given) where the reference skips the plan.
  bool cost(const InterStagePlan& plan, const RankLayout& layout, const Strategy* strategies,
            const int* layer_partition, CostTerms* out, SkippedPlan* skipped = nullptr) const;

  // Activation bytes Metis sends after layer `layer` (a count of elements, as it uses it).
  double activation_size(int layer, int mbs, int tp) const;
  // Metis's parameter bytes of layers [start, end) at tensor-parallel degree tp.
  double stage_parameters(int tp, int start, int end) const;

 private:
  const ProfileSet* profiles_;
  ModelConfig model_;
  std::vector<int> profile_type_;
  int max_profiled_batch_size_;
  double input_params_, output_params_, transformer_params_;
};

}  // namespace hetplan
