// JSON and text forms of search results: the `--json` file, the plan file
// that replay and simulate read, and the reference's one-line summary.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "planner/search.h"
#include "sim/json_util.h"
#include "sim/plan_file.h"

namespace hetplan {

// The `--json` document. Each plan entry carries `context`'s model, gbs and
// paths, so that any entry is a plan file (sim/plan_file.h) on its own.
// `settings`, when not empty, holds each top plan's (zero_stage, recompute).
ordered_json search_result_to_json(const SearchResult& result, double average_ms, int trials,
                                   const PlanFile& context,
                                   const std::vector<std::pair<int, std::string>>& settings = {});

// "1, <cost>, (A100, V100), [32], [(1, 32)], 1, [0, 10]" as the reference prints it.
std::string reference_plan_line(int rank, const PlanResult& plan);

}  // namespace hetplan
