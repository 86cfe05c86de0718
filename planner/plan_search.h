// PlanSearch: the default planner. It returns the K plans with the lowest
// simulated iteration time (the number `hetplan simulate` reports) over a
// space every plan of which a practitioner can run as-is: node orders,
// micro-batch counts dividing the global batch, pipelines of contiguous rank
// ranges with every layer in one stage, per stage every (dp, tp) that gives
// each replica a sample (tp groups inside nodes unless allowed otherwise), and
// optionally several training settings; a plan is feasible when its profiles
// exist and every rank fits its GPU's memory. The search is exact over that
// space: the same best plans as exhaustive enumeration, ties broken by a fixed
// order, for any thread count (unless a time budget or a cancellation cuts it
// short). How: planner/plan_search.md.
//
// Thread-safety: run() is const and may be called from one thread at a time
// per PlanSearch (it uses TBB inside). REQUIRES: the cluster, profiles and
// simulator outlive the PlanSearch.
#pragma once

#include <tbb/task_arena.h>

#include <atomic>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "sim/cluster.h"
#include "sim/memory_model.h"
#include "sim/plan.h"
#include "sim/plan_simulator.h"
#include "sim/profile.h"

namespace hetplan {

// Where pipeline stages may start: on any rank, or only on node boundaries (every stage a run of whole
// nodes, as Megatron-LM's rank grid places them when dp x tp fills nodes). kAuto: whole nodes on
// clusters of more than kWholeNodeStagesAbove GPUs, where stages of parts of nodes multiply the space
// (768 GPUs: 64x more 3-stage pipelines) for plans no one would run; any rank below that.
enum class StageBoundaries { kAuto, kNode, kRank };
inline constexpr int kWholeNodeStagesAbove = 256;
// The resolved policy: true where stages are runs of whole nodes.
bool whole_node_stages(StageBoundaries b, int num_gpus);
// `--stage-boundaries`: "auto", "node" or "rank"; else throws InputError naming the flag.
StageBoundaries parse_stage_boundaries(const std::string& s);

struct PlanSearchOptions {
  int gbs = 128;
  StageBoundaries stage_boundaries = StageBoundaries::kAuto;
  int max_tp = 1 << 30;        // largest tp (default: every profiled tp)
  int max_micro_batch = 1 << 30;  // largest micro-batch (gbs / m) considered
  int max_stages = 1 << 30;    // largest pipeline depth considered
  bool allow_cross_node_tp = false;
  // Only plans Megatron-LM and DeepSpeed run as is (`--uniform`): every stage runs stage 0's (dp, tp),
  // each micro-batch splits evenly over dp, and a pipeline of several stages takes ZeRO stage 0 or 1
  // (DeepSpeed's pipeline engine); the exporters' own rules (planner/export_plan.h). GPU types per
  // stage and layer counts stay free.
  bool uniform = false;
  // Settings searched as dimensions; empty means the simulator's own setup.
  std::vector<TrainingSetup> setups;
  int top_k = 1;
  int threads = 0;  // 0: TBB's default
  // Where run() runs, if set: threads is then ignored (the arena's slots are the threads).
  // REQUIRES: outlives run().
  tbb::task_arena* arena = nullptr;
  // Off only for tests: no bound is used, every plan of the space is costed.
  bool exhaustive = false;
  // Only for tests: return the seed plans (planner/seed_plans.h) alone, marked cut short.
  bool seeds_only = false;
  // Seeded searches of more than this many GPUs first build every group's table for its bound (the
  // bounds pass, planner/plan_search.md). Tests lower it to run the pass on small clusters.
  int bounds_pass_above_gpus = kWholeNodeStagesAbove;
  // The largest suffix-bound table (in dynamic-program steps, 0.25 R^2 L^2 Q) the search builds per
  // (node order, m); above it, the throughput bound stands in. Tests lower it to exercise that bound.
  double suffix_table_limit = 4e9;
  // The largest table of mixed-type stages' replicas ((GPUs + 1)^2 (max tp + 1) entries) the stage
  // estimates keep; above it (hundreds of GPUs) a mixed stage's estimate is the whole-sample capacity
  // bound (planner/stage_estimator.h). Tests lower it to exercise that bound.
  double mixed_table_limit = 2e6;
  // The relative gap the result must be proven within: a partial plan is pruned once a bound shows it
  // cannot beat the K-th best plan found by more than a factor 1 + gap, and the search stops once every
  // plan left is so bounded. The best plan returned then costs at most (1 + gap) x the optimum. 0: exact
  // (the same plans as exhaustive enumeration). `hetplan search --gap` defaults to 0.01.
  double gap = 0;
  // The seed plans' (planner/seed_plans.h) share of the time, in seconds, before the search proper.
  double seed_time_s = 2;
  // Stop after this many seconds (0: no limit) and return the best plans
  // found so far, marked cut short.
  double time_budget_s = 0;
  // Set to true from anywhere (a SIGINT handler) to stop the same way.
  const std::atomic<bool>* cancel = nullptr;
  // Called about once a second with the progress so far, if set.
  std::function<void(const struct PlanSearchProgress&)> progress;
  // With several settings, search them in parts (planner/search_settings.h, setting_parts): the settings
  // without full recomputation jointly, then those with it, under bounds that add its recomputed forward,
  // the first part's plans setting the threshold of the second from the start. kAuto: in parts where
  // memory binds (settings_bind_memory), else every setting at once, each partial plan bounded by the
  // least over the settings. Exhaustive searches always take every setting at once.
  enum class SettingParts { kAuto, kAlways, kNever };
  SettingParts setting_parts = SettingParts::kAuto;
  // Plans found before this search in other parts of the space, as (cost, plan id): they set the
  // threshold from the start (a plan found again at a lower cost counts once). Set by the setting parts.
  std::vector<std::pair<double, unsigned long long>> incumbents;
};

struct PlanSearchProgress {
  long long units_done = 0, units_total = 0;  // (node order, m, p, first stage) work units; total 0: setting up
  long long enumerated = 0, pruned = 0, costed = 0;
  double elapsed_s = 0, eta_s = -1;  // -1: not known yet
  double best_ms = -1;         // the best plan's cost so far; -1: none yet
  double lower_bound_ms = 0;   // a lower bound on the optimum over the whole space (infinity: no plan left)
  double gap = -1;             // best_ms / lower_bound_ms - 1; -1: not known (no plan, or no bound yet)
};

struct SearchedPlan {
  PlanResult plan;     // cost = simulated iteration time (ms)
  int setup = 0;       // index into PlanSearchOptions::setups (0 without settings)
  int virtual_stages = 1;  // > 1: interleaved 1F1B with that many chunks per stage (search_virtual_stages)
};

struct PlanSearchResult {
  std::vector<SearchedPlan> top;  // cheapest first
  long long enumerated = 0;  // partial and complete plans the search visited
  long long pruned = 0;      // partial plans left out by a lower bound
  long long costed = 0;      // complete plans whose iteration time was computed
  long long infeasible = 0;  // stages left out: memory or a missing profile
  std::string first_infeasible_reason;
  bool cut_short = false;    // time budget or cancellation
  std::string cut_reason;
  double seconds = 0;
  // The proof: best_ms is the best plan's cost (-1: none); lower_bound_ms a lower bound on every plan of
  // the space (at most best_ms; infinity where the search finished without a plan: the space is empty);
  // gap = best_ms / lower_bound_ms - 1 (infinity where unknown). A search not cut short has gap <= the
  // gap asked for (0 for an exact search).
  double best_ms = -1, lower_bound_ms = 0, gap = std::numeric_limits<double>::infinity();
  double gap_asked = 0;
  bool proven = false;       // gap <= the gap asked for (with a plan), or the space proven empty
  bool space_empty = false;  // finished without a plan: no plan of the space fits
  double first_plan_s = -1;  // seconds to the first plan found (-1: none)
  long long seeds_costed = 0;
  double seed_seconds = 0;
};

// The settings `--zero` ("0".."3" or "auto") and `--recompute` ("none",
// "selective", "full" or "auto") ask for, each a copy of `base` with that
// ZeRO stage and recomputation; "auto" searches every value as a dimension.
// Throws InputError naming the flag.
std::vector<TrainingSetup> search_setups(const TrainingSetup& base, const std::string& zero,
                                         const std::string& recompute);
// "ZeRO-1, recompute selective".
std::string setup_label(const TrainingSetup& s);

// `--vp`: "1" (no interleaving), "N" (interleaved 1F1B, N chunks per stage), "auto" (1, 2, 3 and 4, each a
// value of the dimension). Throws InputError naming the flag.
std::vector<int> parse_virtual_stages(const std::string& s);

class PlanSearch;

// Virtual stages as a dimension: one PlanSearch per value v of `virtual_stages`, on a simulator of `base`
// (v = 1: base's schedule; v > 1: interleaved 1F1B with v chunks per stage, which also restricts the
// space to Megatron's: pp >= 2, micro-batches a multiple of pp, every stage at least v layers), each
// exact over its space (planner/stage_search.cc: the bounds an interleaved search keeps), their best
// plans merged cheapest first (ties: smaller v first), top_k of them; the counts add up. The time
// budget covers all the searches. REQUIRES: as PlanSearch.
PlanSearchResult search_virtual_stages(const Cluster& cluster, const ProfileSet& profiles, const ModelShape& shape,
                                       int sequence_length, const SimulationOptions& base,
                                       const PlanSearchOptions& options, const std::vector<int>& virtual_stages);

class PlanSearch {
 public:
  // Throws InputError for options that cannot be searched (gbs < 1, ...).
  PlanSearch(const Cluster& cluster, const ProfileSet& profiles, const PlanSimulator& simulator,
             PlanSearchOptions options);

  PlanSearchResult run() const;

 private:
  PlanSearchResult search() const;  // run()'s work, in opt_.arena or a task arena of opt_.threads threads
  // The settings one part at a time (`parts`: indices into opt_.setups): setting_parts
  // (PlanSearchOptions::setting_parts), or context_parallel_parts (`whole`: each part then searched as
  // search_all searches it, itself in setting parts where memory binds). planner/search_settings.cc.
  PlanSearchResult search_parts(const std::vector<std::vector<int>>& parts, bool whole) const;
  PlanSearchResult search_all() const;  // search_in_parts() or search(), as the options ask
  void finish_proof(const class SharedBound& shared, const class OpenBounds& open, const class SearchControl& control,
                    PlanSearchResult* result) const;

  const Cluster* cluster_;
  const ProfileSet* profiles_;
  const PlanSimulator* sim_;
  PlanSearchOptions opt_;
};

}  // namespace hetplan
