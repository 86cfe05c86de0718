// JSON and text forms of search results: the `--json` file, the plan file
// that replay and simulate read, and the reference's one-line summary.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "planner/objective.h"
#include "planner/plan_search.h"
#include "metis/metis_search.h"
#include "base/json_util.h"
#include "sim/plan_file.h"

namespace hetplan {

// The `--json` document. Each plan entry carries `context`'s model, gbs and
// paths, so that any entry is a plan file (sim/plan_file.h) on its own.
// `settings`, when not empty, holds each top plan's (zero_stage, recompute).
ordered_json search_result_to_json(const SearchResult& result, double average_ms, int trials,
                                   const PlanFile& context,
                                   const std::vector<std::pair<int, std::string>>& settings = {});

// The default search's `--json` document: the same shape (best, top, each a
// plan file), plus the search's counts, whether it was cut short, each
// plan's training setting, and `ranks`: for every global rank its host,
// local GPU, device type, stage, dp index and tp index (sim/parallel_layout.h).
ordered_json plan_search_result_to_json(const PlanSearchResult& result, const Cluster& cluster,
                                        const std::vector<TrainingSetup>& setups, const PlanFile& context,
                                        const std::string& schedule);

// The cost objective's `--json` document (search --objective cost, --deadline-ms): best and top, cheapest
// per iteration first, each a plan file of its sub-cluster (searched_plan_json) with its price
// (usd_per_iteration, usd_per_hour, gpus_used, sub_cluster); the GPUs' prices; the counts as
// plan_search_result_to_json's; `deadline_ms` where > 0. `subset_hostfiles[s]`: the hostfile written for
// sub-cluster s, which its plans name; "" where they name the context's (the whole cluster).
// REQUIRES: subset_hostfiles.size() == r.subsets.size().
ordered_json objective_search_result_to_json(const ObjectiveSearchResult& r, const Cluster& cluster,
                                             const std::vector<TrainingSetup>& setups, const PlanFile& context,
                                             const std::string& schedule, double deadline_ms,
                                             const std::vector<std::string>& subset_hostfiles);

// Where each rank of `plan` runs, as plan_search_result_to_json lists it.
ordered_json rank_placement_json(const Cluster& cluster, const PlanResult& plan);

// One plan of the default search as a plan file (its setup, schedule, ranks), with "exporters": the exporters
// that take it as is (planner/export_plan.h accepting_exporters), and "exporters_refused": why the others do not.
ordered_json searched_plan_json(const SearchedPlan& plan, const Cluster& cluster, const std::vector<TrainingSetup>& setups,
                                const PlanFile& context, const std::string& schedule);

// "1, <cost>, (A100, V100), [32], [(1, 32)], 1, [0, 10]" as the reference prints it.
std::string reference_plan_line(int rank, const PlanResult& plan);

}  // namespace hetplan
