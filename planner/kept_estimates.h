// KeptEstimates: the stage estimates (planner/stage_estimator.h) that the
// groups of one search share: the slicings up to the largest micro-batch and,
// where the per-rank suffix tables are built, the estimates of homogeneous
// stages and of mixed stages' replica lists, each within one memory budget.
// Thread-safety: every member from any number of threads at once.
// REQUIRES: the profiles and cluster outlive it; it is not moved.
#pragma once

#include <cstddef>
#include <optional>

#include "planner/search_space.h"
#include "planner/stage_estimator.h"

namespace hetplan {

class KeptEstimates {
 public:
  // `keep_homogeneous`: keep the estimates of homogeneous stages (the per-rank tables are built).
  KeptEstimates(const ProfileSet& profiles, const Cluster& cluster, const SearchSpace& space, int max_profiled_bs,
                bool keep_homogeneous)
      : slices_(profiles, cluster, space.max_tp, space.max_share(), max_profiled_bs, space.cp),
        mixed_lists_(budget_),
        layers_(space.layers) {
    if (keep_homogeneous) homogeneous_.emplace(space.device_types, space.max_tp, space.gbs, space.layers, budget_);
  }
  KeptEstimates(const KeptEstimates&) = delete;
  KeptEstimates& operator=(const KeptEstimates&) = delete;

  // True where estimates are kept (the per-rank suffix tables are built).
  bool kept() const { return homogeneous_.has_value(); }
  const stage_estimates::ShareSlices& slices() const { return slices_; }
  stage_estimates::MixedLists& mixed_lists() { return mixed_lists_; }

  // The estimates kept for stage [r, r + s) of node order `o` at (s / tp, tp) with micro-batch b, at
  // [span_index(layers, l, e)], where its tp groups stay inside nodes and the per-rank tables are built;
  // else nullptr (callers compute their own).
  const stage_estimates::StageEstimate* get(const NodeOrder& o, const stage_estimates::StageEstimator& est, int r,
                                            int s, int tp, int b, bool homogeneous, bool inside) {
    if (!homogeneous_ || !inside) return nullptr;
    return homogeneous ? homogeneous_->get(est, o.layout->type_of(r), r, s, tp, b)
                       : mixed_lists_.estimates(est.mixed_entry(r, s, tp), est, r, s, tp, layers_);
  }

 private:
  stage_estimates::EstimateBudget budget_{std::size_t{256} << 20};
  const stage_estimates::ShareSlices slices_;
  stage_estimates::MixedLists mixed_lists_;
  int layers_;
  std::optional<stage_estimates::HomogeneousEstimates> homogeneous_;
};

}  // namespace hetplan
