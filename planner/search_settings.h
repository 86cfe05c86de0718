// The search's training-setting dimensions beyond ZeRO and recomputation
// (planner/plan_search.h's search_setups): overlapped data-parallel
// communication and context parallelism as dimensions, and the label of the
// sequence-parallel, context-parallel and overlap parts of a setting.
//
// Overlap keeps the search exact: with it a stage's data-parallel collectives
// leave a non-negative exposed tail (sim/dp_overlap.h), which the search's
// lower bounds leave out as they leave out the collectives themselves.
// Context parallelism (cp, Megatron's --context-parallel-size) is a setting
// too, but its sizes are searched apart (context_parallel_parts): a cp rank
// computes 1/cp of its cp group's larger share of the micro-batch, which can
// cost less than a replica's own share, so each size's search prices its
// stages with its own cp (planner/stage_estimator.h; planner/plan_search.md,
// "Context parallelism").
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/memory_model.h"
#include "sim/plan.h"
#include "sim/plan_simulator.h"
#include "sim/profile.h"

namespace hetplan {

// `overlap`: "off" (setups unchanged), "on" (every setup overlaps its gradient reduction and, with ZeRO,
// its weight gather) or "auto" (each setup both ways, off first). Throws InputError naming --overlap.
std::vector<TrainingSetup> with_overlap_dimension(const std::vector<TrainingSetup>& setups,
                                                  const std::string& overlap);

// `--cp`: "1" (none: today's space), "N" (every plan at context-parallel size N) or "auto" (1, 2, 4, ... up to
// `gpus`, each a value of the dimension); every size N > 1 must split `sequence_length` into 2 N chunks
// (Megatron's load balance of the causal mask). Throws InputError naming --cp.
std::vector<int> parse_context_parallel(const std::string& cp, int sequence_length, int gpus);

// Every setup at each context-parallel size of `cps` in turn (size-major): cps {1} leaves them unchanged.
std::vector<TrainingSetup> with_context_parallel_dimension(const std::vector<TrainingSetup>& setups,
                                                           const std::vector<int>& cps);

// The parts PlanSearch searches apart: indices into `setups` by context-parallel size, smallest size first
// (one part where all share one size). Each part's search divides its stages' profile times by its own cp
// (planner/stage_estimator.h), which a joint search could not; its best plans are merged as the setting
// parts' are (a plan at its fastest setting, cp included).
std::vector<std::vector<int>> context_parallel_parts(const std::vector<TrainingSetup>& setups);

// ", sequence parallel", ", cp N", ", overlapped communication" for what the setting turns on ("" for none).
std::string parallel_setup_suffix(const TrainingSetup& s);

// The parts PlanSearch searches the settings in, one after the other (PlanSearchOptions::setting_parts):
// indices into `setups`, the settings without full recomputation first (searched jointly: ZeRO and
// selective recomputation barely move the joint search's bounds), then those with it (whose plans the
// joint bounds, priced without the recomputed forward, cannot prune). Parts are never empty.
std::vector<std::vector<int>> setting_parts(const std::vector<TrainingSetup>& setups);

// Whether memory binds the settings' plans (PlanSearchOptions::SettingParts::kAuto then searches them in
// parts): no node can hold the model states of every layer (the least over `setups`, dp 1) at its largest
// tp, so pipelining, ZeRO and recomputation decide which plans fit, and the joint search, whose bounds
// price no recomputed forward, cannot prune the many plans only full recomputation lets fit (Llama-3.1-70B
// on 64 H100: no plan costed in 120 s). Where a node can, the joint search's one enumeration for every
// setting costs less than two searches.
bool settings_bind_memory(const Cluster& cluster, const ProfileSet& profiles, const PlanSimulator& sim,
                          const std::vector<TrainingSetup>& setups);

// A plan's place in the search's fixed order of plans (planner/stage_search.h, PlanKey::order): its node
// order's index, micro-batches, stages, then (GPUs, dp, layers) per stage.
std::vector<int> plan_key_order(const PlanResult& plan, const Cluster& cluster);

}  // namespace hetplan
