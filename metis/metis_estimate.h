// MetisEstimate: what the Metis reference predicts for one given plan: its
// iteration cost and its memory demand, by the code `search --cost-model
// metis` runs, so that a plan chosen by any means (the default search, a
// validation suite, by hand) can be scored by the Metis formula next to the
// simulator.
//
//  * Time: MetisCostModel::cost (metis/metis_cost.h) on the plan's stages,
//    node sequence and micro-batches: CostTerms::total is the cost the Metis
//    search reports for that plan, bit for bit. One exception, of the
//    reference's making: right after a node-sequence change its generator
//    visits some device groups labelled as one stage and then costs only
//    their first stage (metis/inter_stage.h). A plan file does not carry
//    that label; the estimate costs every stage, as the search does when it
//    visits the same groups with their true count, and reports that visit's
//    cost separately (`label`: see below). The Metis search ranks plans by
//    both visits, so its best plan can be one costed on its first stage only.
//  * Memory: LayerLoadBalancer::stage_memory_demand (metis/layer_balancer.h),
//    in MB as Metis computes it, every quirk kept (5 x the profiled layer
//    memory of the stage's micro-batch at its tp, read from the cluster's
//    first rank's type; a mixed stage split as if it spanned the cluster).
//    Metis checks it against the stage's summed GPU memory; it is what one
//    rank of the stage would hold, and each rank of the stage is given it.
//
// Where the reference cannot cost the plan (a profile lookup fails: its
// KeyError) the estimate says so with the reason instead of a number; time
// and memory are looked up separately, so one may be known without the other.
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "base/json_util.h"
#include "metis/metis_cost.h"
#include "sim/plan_file.h"
#include "sim/profile.h"

namespace hetplan {

struct MetisRankMemory {
  int rank = 0;   // global rank, in the plan's node-sequence order (sim/rank_layout.h)
  int stage = 0;
  double memory_mb = 0;  // the stage's Metis memory demand
};

struct MetisEstimate {
  bool costed = false;   // false: `skipped` says why, `terms` is unset
  std::string skipped;   // the profile Metis looked for and why (the search's skip note)
  CostTerms terms;       // terms.total: the iteration cost in ms

  // The stage-count labels the reference's generator visits this plan's node
  // sequence, device groups and micro-batch count with (the search's
  // options): empty when the search never generates them (groups outside its
  // space). A label below the plan's stage count is the quirk above; then
  // `label_costed`/`label_terms`/`label_skipped` are that visit's cost, which
  // the search reports for the plan too.
  std::vector<int> visit_labels;
  int label = 0;  // the short label, 0 if none
  bool label_costed = false;
  CostTerms label_terms;
  std::string label_skipped;

  bool memory_known = false;  // false: `memory_skipped` says why
  std::string memory_skipped;
  std::vector<double> stage_memory_mb;    // Metis's demand per stage (MB)
  std::vector<double> stage_capacity_mb;  // what Metis checks it against: the stage's summed GPU memory
  std::vector<MetisRankMemory> ranks;     // every rank of the plan, stage by stage; empty if !memory_known
};

struct MetisEstimateOptions {
  // The search's --max_profiled_batch_size: a mixed stage's batch slice above
  // it is not costed. 0: the largest batch size of the profiles (the search's default).
  int max_profiled_batch_size = 0;
  // The search's --min_group_scale_variance and --max_permute_len (its
  // defaults): they choose the device groups the generator visits.
  double min_group_scale_variance = 1;
  int max_permute_len = 128;
};

// REQUIRES: `plan` as read_plan_file returns it (consistent strategies and
// partition); `profiles` loaded for plan.model.num_layers. Throws InputError
// for a plan the cluster or the profiles cannot hold (a node_sequence type the
// cluster or the profiles lack, device groups that do not add up to the
// cluster, batches that do not divide gbs), as `search` and `simulate` do.
// Pure: no state is kept; safe to call from several threads.
MetisEstimate metis_estimate(const Cluster& cluster, const ProfileSet& profiles, const PlanFile& plan,
                             const MetisEstimateOptions& options = {});

// `simulate --cost-model metis --json`: {"cost_model": "metis", "iteration_ms": total or null,
// "skipped" (when not costed), "terms": {...}, "ranks": [{"rank", "stage", "memory_mb"}],
// "stages": [{"stage", "memory_mb", "capacity_mb"}], "memory_skipped" (when memory is unknown),
// "search_visits": the labels, and "search_label": {"num_stage", "iteration_ms" or null, "terms" or
// "skipped"} when a visit's label is short.
ordered_json metis_estimate_to_json(const MetisEstimate& e);

}  // namespace hetplan
