// MetisSearch: the whole Metis search over a heterogeneous cluster, in
// parallel, with results identical to the Python reference.
//
// Inter-stage plans are enumerated up front (cheap) and walked in parallel
// with TBB; each worker keeps its own scratch space. Results are merged by
// (cost, enumeration order), so ties keep the plan the reference would list
// first and nothing depends on the thread count.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "metis/inter_stage.h"
#include "sim/cluster.h"
#include "base/input_error.h"
#include "sim/model_config.h"
#include "sim/plan.h"
#include "sim/profile.h"
#include "sim/rank_layout.h"

namespace hetplan {

struct SearchOptions {
  ModelConfig model;
  int gbs = 128;
  int max_profiled_tp = 4;
  int max_profiled_bs = 4;
  double min_group_scale_variance = 1;
  int max_permute_len = 4;
  bool use_strat = false;
  int top_k = 1;
  int threads = 0;  // 0: TBB's default
  // Off (the reference): a layer partition that drops layers (the layer
  // balancer's majority vote can leave a layer to no stage) is costed on the
  // layers it keeps. On: such candidates are not costed.
  bool reject_dropped_layers = false;
  // Called about once a second with (inter-stage plans done, total), if set.
  std::function<void(long long, long long)> progress;
};

struct SearchResult {
  long long count = 0;                // the reference's search-step count
  long long inter_stage_plans = 0;
  long long candidates = 0;           // plans that fit memory (costed or skipped)
  long long skipped = 0;              // candidates the cost model could not cost
  long long dropped_layers = 0;       // candidates whose partition misses layers
  std::string first_skip_reason;      // for the earliest skipped candidate
  std::vector<PlanResult> top;        // cheapest first
  double seconds = 0;
};


// The inter-stage generator's settings of a Metis search over `cluster`
// (every device of every type, the search's gbs, layers, variance and
// permutation limit): what MetisSearch walks, and what metis_estimate
// replays to find the labels a plan is visited with.
InterStageOptions metis_inter_stage_options(const Cluster& cluster, int gbs, int num_layers, double variance,
                                            int max_permute_len);

class MetisSearch {
 public:
  // Validates that every device type of the cluster has profiles and that
  // the model matches them. Throws InputError.
  MetisSearch(const Cluster& cluster, const ProfileSet& profiles, SearchOptions options);

  // Throws InputError where a plan needs a profile the set lacks (the first such plan in the reference's
  // order, where the reference stops); any other exception it meets is a bug and propagates unchanged.
  SearchResult run() const;

  const Cluster& cluster() const { return *cluster_; }
  const std::vector<int>& profile_type() const { return profile_type_; }

 private:
  const Cluster* cluster_;
  const ProfileSet* profiles_;
  SearchOptions opt_;
  std::vector<int> profile_type_;  // cluster type index -> profile type index
};

}  // namespace hetplan
