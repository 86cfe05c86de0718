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
#include <string>
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
  // The largest suffix-bound table (in dynamic-program steps, 0.25 R^2 L^2 Q) the search builds per
  // (node order, m); above it, the throughput bound stands in. Tests lower it to exercise that bound.
  double suffix_table_limit = 4e9;
  // The largest table of mixed-type stages' replicas ((GPUs + 1)^2 (max tp + 1) entries) the stage
  // estimates keep; above it (hundreds of GPUs) a mixed stage's estimate is the whole-sample capacity
  // bound (planner/stage_estimator.h). Tests lower it to exercise that bound.
  double mixed_table_limit = 2e6;
  // Stop after this many seconds (0: no limit) and return the best plans
  // found so far, marked cut short.
  double time_budget_s = 0;
  // Set to true from anywhere (a SIGINT handler) to stop the same way.
  const std::atomic<bool>* cancel = nullptr;
  // Called about once a second with the progress so far, if set.
  std::function<void(const struct PlanSearchProgress&)> progress;
};

struct PlanSearchProgress {
  long long units_done = 0, units_total = 0;  // (node order, m, p, first stage) work units; total 0: setting up
  long long enumerated = 0, pruned = 0, costed = 0;
  double elapsed_s = 0, eta_s = -1;  // -1: not known yet
  double best_ms = -1;
};

struct SearchedPlan {
  PlanResult plan;     // cost = simulated iteration time (ms)
  int setup = 0;       // index into PlanSearchOptions::setups (0 without settings)
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
};

// The settings `--zero` ("0".."3" or "auto") and `--recompute` ("none",
// "selective", "full" or "auto") ask for, each a copy of `base` with that
// ZeRO stage and recomputation; "auto" searches every value as a dimension.
// Throws InputError naming the flag.
std::vector<TrainingSetup> search_setups(const TrainingSetup& base, const std::string& zero,
                                         const std::string& recompute);
// "ZeRO-1, recompute selective".
std::string setup_label(const TrainingSetup& s);

class PlanSearch {
 public:
  // Throws InputError for options that cannot be searched (gbs < 1, ...).
  PlanSearch(const Cluster& cluster, const ProfileSet& profiles, const PlanSimulator& simulator,
             PlanSearchOptions options);

  PlanSearchResult run() const;

 private:
  PlanSearchResult search() const;  // run()'s work, in opt_.arena or a task arena of opt_.threads threads

  const Cluster* cluster_;
  const ProfileSet* profiles_;
  const PlanSimulator* sim_;
  PlanSearchOptions opt_;
};

}  // namespace hetplan
