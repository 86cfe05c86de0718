// PlanSearch: the default planner. It finds the plans with the lowest
// simulated iteration time (the number `hetplan simulate` reports) over a
// space every plan of which a practitioner can run as-is:
//
//  * node orders: the permutations of the device types (types sorted by
//    name, permutations in lexicographic order); ranks are handed out node by
//    node in that order (RankLayout), so ranks sit on real node boundaries;
//  * micro-batch counts m that divide the global batch (any gbs; every
//    sample is trained): the micro-batch is gbs / m samples, split over each
//    stage's data-parallel replicas as the simulator splits it;
//  * pipelines of p = 1 .. min(layers, GPUs) stages, each a contiguous range
//    of ranks of any size (of whole nodes only, under StageBoundaries::kNode
//    or kAuto on a large cluster), with every layer in exactly one non-empty
//    stage;
//  * per stage every (dp, tp) with dp * tp = size, tp <= the largest profiled
//    tp, every replica given at least one sample, and each tp group inside one
//    node (and so one GPU type) unless `allow_cross_node_tp` is set, in which
//    case the simulator charges its all-reduces to the inter-node link;
//  * optionally several training settings (ZeRO stage, recomputation): a
//    plan costs its fastest setting that fits memory.
// A plan is feasible when its profiles exist and every rank fits its own
// GPU's memory.
//
// The search is exact over that space: it returns the same best plans as
// exhaustive enumeration (tests/test_plan_search.cc checks this, on measured
// and analytic profiles, 1F1B and GPipe, with and without cross-node tp),
// because it only prunes a partial plan when a lower bound on every
// completion's iteration time is already above the K-th best cost found.
// Each bound is the length of a chain of dependencies of the timeline (a
// path of its task graph), so it never exceeds the longest one:
//  * a stage's own work: a stage must run all its forwards and backwards in
//    sequence after micro-batch 0 has crossed the stages before it, and its
//    gradients then pass back through them to stage 0's all-reduce and
//    optimizer step (or it runs its own all-reduce and step);
//  * micro-batch m - 1's path (end path): after micro-batch 0 reaches a
//    stage, the stage runs its ops up to m - 1's forward (under 1F1B all its
//    forwards and the backwards its warm-up leaves before it), m - 1 crosses
//    every later stage and comes back, and its backward runs down to stage
//    0's all-reduce;
//  * micro-batch 0's path (start path): the stage runs micro-batch 0's
//    forward, it crosses every later stage and comes back (no accumulation),
//    and the stage then runs every op from that backward on (all m backwards
//    and the forwards its warm-up left); under GPipe the round trip follows
//    the stage's last forward;
//  * the stages still to choose, by a dynamic program over (stages left,
//    first rank, first layer) per (node order, m) that takes the least over
//    every way to form them of the longest of those paths, on each stage's
//    estimates: its slowest replica's profile time (for a mixed-type stage
//    with the data load balancer's shares, which depend only on the
//    replicas' types, tp and the micro-batch; past a few hundred GPUs, a
//    whole-sample capacity bound instead: the least T by which replicas
//    that each finish floor(T / their least time per sample) samples cover
//    the micro-batch), its forward and backward each
//    bounded apart (measured, or the backward share), its gradient
//    accumulation (measured, else from bytes, the least over the settings),
//    and its p2p sends (exact); a stage whose ranks cannot hold its layers' model
//    states (PlanCostModel::state_bytes_lower_bound, the least over the
//    settings) is left out of the table, as no plan with it fits (and the
//    depth-first search tests the same bound before costing a stage). With
//    whole-node stages the table's positions are node starts. Where that
//    table would be too large (suffix_table_limit; hundreds of GPUs on any
//    rank), only its one-stage entries (the last stage) are built, and a
//    throughput bound stands in for the deeper ones:
//    some stage of the rest takes at least gbs x the rest's layers' least
//    GPU-ms per sample (each type's at least kappa times a reference type's)
//    over the rest's GPUs, weighted by 1 / kappa. A stage's layer counts
//    whose suffix bound is already above the threshold are skipped by
//    bisection (on that bound, or the last stage's entries' running minimum,
//    both non-increasing in the layers the stage takes).
//    With the per-rank tables, the search runs in phases: the table's
//    one-stage entries, the plans of
//    one and two stages (whose best is often close to the optimum), then
//    the deeper entries, which leave out every stage whose own compute is
//    already above the threshold (a plan with it cannot be kept, and the
//    entries still bound every plan made of the stages kept), then the
//    deeper plans. The phases overlap (one pass of every thread, no wait
//    between phases): a group's plans wait only for its own entries. Without
//    the tables, the plans are taken in order of pipeline depth, the threads
//    starting far apart in that order.
// The bounds only drop terms of the simulated time, so they never exceed it;
// the pruning threshold sits 1e-9 (relative) above the K-th best cost, so a
// bound summed in another order than the cost never prunes a tie.
// Stage costs are cached per worker (a stage's costs depend on its ranks,
// (dp, tp), layers, m, whether it is first or last, and its in-flight
// micro-batches, not on the stages around it): a fixed-size direct-mapped
// table, so the hot path still allocates nothing.
// The enumeration is streamed (depth first), so memory does not grow with
// the number of plans. Ties in cost are broken by a fixed order on plans,
// so results do not depend on the thread count (unless a time budget or a
// cancellation cut the search short).
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
  // Settings searched as dimensions; empty means the simulator's own setup.
  std::vector<TrainingSetup> setups;
  int top_k = 1;
  int threads = 0;  // 0: TBB's default
  // Where run() runs, if set: threads is then ignored (the arena's slots are the threads). A caller that
  // gets workers ready before the search (cli/heap.h) runs their tasks in the same arena, so that they
  // go to the search without moving from one arena to another. REQUIRES: outlives run().
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
  // Called on each TBB worker thread as it first joins a run(), before that thread takes any work
  // there, if set: where a process prepares per-thread resources (hetplan's main() has each worker's
  // malloc arena ask for huge pages). TBB keeps its workers, so a later run() calls it again on the
  // same threads: it must be idempotent per thread, and it must not change any value. Not called on
  // the thread calling run() (unless that thread is itself a TBB worker).
  std::function<void()> on_worker_start;
  // Called once by run(), on its thread, when the search's serial set-up ends and its parallel work
  // starts, if set: where a caller that keeps workers running until the search needs them (so that
  // none has gone to sleep: cli/heap.h) lets them go.
  std::function<void()> on_parallel_start;
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
