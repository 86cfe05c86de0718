// The driver of the default search (planner/plan_search.md): options, the parts of the search, threads,
// progress, and the merge of the workers' best plans.
#include "planner/plan_search.h"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "planner/kept_estimates.h"
#include "base/periodic.h"
#include "sim/profile.h"  // unknown_device_type
#include "planner/search_control.h"
#include "planner/search_phases.h"
#include "planner/search_space.h"
#include "planner/shared_bound.h"
#include "planner/stage_search.h"
#include "planner/suffix_bound.h"
#include "base/thread_limit.h"
#include "base/input_error.h"

namespace hetplan {

namespace {

// The set-up's progress report (units_total 0), about once a second from a side thread, until the
// search's units start: the set-up's tables grow with layers^2 x tp (seconds at thousands of layers).
std::function<void()> setup_reporter(const PlanSearchOptions& options, const SearchControl& control) {
  if (!options.progress) return {};
  return [&options, &control] {
    PlanSearchProgress pr;  // units_total 0: still setting up
    pr.elapsed_s = control.elapsed_s();
    options.progress(pr);
  };
}

// The progress report, about once a second from a side thread (nothing where no one asked for it).
std::function<void()> progress_reporter(const PlanSearchOptions& options, const SearchControl& control,
                                        const SharedBound& shared, long long units_total) {
  if (!options.progress) return {};
  return [&options, &control, &shared, units_total] {
    PlanSearchProgress pr;
    pr.units_done = control.units_done();
    pr.units_total = units_total;
    pr.enumerated = control.enumerated();
    pr.pruned = control.pruned();
    pr.costed = control.costed();
    pr.elapsed_s = control.elapsed_s();
    if (pr.units_done > 0)
      pr.eta_s = pr.elapsed_s * static_cast<double>(pr.units_total - pr.units_done) / pr.units_done;
    const double thr = shared.threshold();
    pr.best_ms = std::isfinite(thr) ? thr : -1;
    options.progress(pr);
  };
}

// The workers' counts, first infeasibility and best plans, merged; the stop's reason.
PlanSearchResult merge_workers(tbb::enumerable_thread_specific<Worker>& workers, const SearchControl& control,
                               const PlanSearchOptions& options) {
  PlanSearchResult result;
  TopPlans top(options.top_k);
  long long first_unit = -1;
  for (Worker& w : workers) {
    result.enumerated += w.counters.own.enumerated;
    result.pruned += w.counters.own.pruned;
    result.costed += w.counters.own.costed;
    result.infeasible += w.counters.own.infeasible;
    if (w.first_infeasible_unit >= 0 && (first_unit < 0 || w.first_infeasible_unit < first_unit)) {
      first_unit = w.first_infeasible_unit;
      result.first_infeasible_reason = w.first_infeasible_reason;
    }
    for (auto& e : w.top.items()) top.insert(std::move(e.key), std::move(e.item));
  }
  for (auto& e : top.items()) result.top.push_back(std::move(e.item));
  result.cut_short = control.stopped();
  if (result.cut_short)
    result.cut_reason = control.why() == SearchControl::kCancelled
                            ? "interrupted"
                            : "time budget of " + std::to_string(options.time_budget_s) + " s reached";
  return result;
}

}  // namespace

bool whole_node_stages(StageBoundaries b, int num_gpus) {
  return b == StageBoundaries::kNode || (b == StageBoundaries::kAuto && num_gpus > kWholeNodeStagesAbove);
}

StageBoundaries parse_stage_boundaries(const std::string& s) {
  if (s == "auto") return StageBoundaries::kAuto;
  if (s == "node") return StageBoundaries::kNode;
  if (s == "rank") return StageBoundaries::kRank;
  throw InputError("--stage-boundaries: '" + excerpt(s) + "': expected auto, node or rank");
}

std::vector<TrainingSetup> search_setups(const TrainingSetup& base, const std::string& zero,
                                         const std::string& recompute) {
  std::vector<int> zeros;
  if (zero == "auto") {
    zeros = {0, 1, 2, 3};
  } else if (zero.size() == 1 && zero[0] >= '0' && zero[0] <= '3') {
    zeros = {zero[0] - '0'};
  } else {
    throw InputError("--zero: '" + excerpt(zero) + "': expected 0, 1, 2, 3 or auto");
  }
  std::vector<Recompute> recomputes;
  if (recompute == "auto")
    recomputes = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  else
    recomputes = {parse_recompute(recompute, "--recompute")};
  std::vector<TrainingSetup> out;
  for (int z : zeros)
    for (Recompute r : recomputes) {
      TrainingSetup s = base;
      s.zero_stage = z;
      s.recompute = r;
      out.push_back(s);
    }
  return out;
}

std::string setup_label(const TrainingSetup& s) {
  return "ZeRO-" + std::to_string(s.zero_stage) + ", recompute " + to_string(s.recompute);
}

PlanSearch::PlanSearch(const Cluster& cluster, const ProfileSet& profiles, const PlanSimulator& simulator,
                       PlanSearchOptions options)
    : cluster_(&cluster), profiles_(&profiles), sim_(&simulator), opt_(std::move(options)) {
  if (opt_.gbs < 1) throw InputError("--gbs: expected a positive global batch size");
  if (opt_.top_k < 1) throw InputError("--top: expected a positive integer");
  if (opt_.setups.size() > 32) throw InputError("search: at most 32 training settings can be searched at once");
  for (const auto& name : cluster.device_types())
    if (profiles.type_index(name) < 0) throw unknown_device_type(cluster, profiles, name);
}

PlanSearchResult PlanSearch::run() const {
  if (opt_.arena) return opt_.arena->execute([&] { return search(); });
  if (opt_.threads <= 0) return search();
  // An arena of that many slots, not a global_control: lifting a global limit of one thread at the end
  // made TBB start a worker just as the process exited (a thread created and torn down for nothing).
  const auto more_threads_than_cores = allow_threads_beyond_cores(opt_.threads, tbb::info::default_concurrency());
  tbb::task_arena arena(opt_.threads);
  return arena.execute([&] { return search(); });
}

PlanSearchResult PlanSearch::search() const {
  // The time budget covers the set-up too: past it, the tables' rows stop early and the phases find the
  // search stopped.
  SearchControl control(SearchControl::Clock::now(), opt_.time_budget_s, opt_.cancel);
  Periodic setup_progress(setup_reporter(opt_, control));
  std::vector<TrainingSetup> setups = opt_.setups;
  if (setups.empty()) setups.push_back(sim_->options().setup);
  const SearchSpace space(*cluster_, *profiles_, *sim_, std::move(setups), opt_);
  const bool table_fits = suffix_table_fits(space, *cluster_, opt_.suffix_table_limit);
  // The throughput bound's data, only where the per-rank table is too large.
  ThroughputRates throughput;
  if (!opt_.exhaustive && !opt_.allow_cross_node_tp && !table_fits)
    throughput = throughput_rates(space, *profiles_, *cluster_);
  // The suffix tables and the depth-first search leave out stages that cannot fit memory under any setup.
  FeasibilityTables tables(space);
  if (!opt_.exhaustive) tables.fill(space, *profiles_, *cluster_, control);

  SharedBound shared(opt_.top_k);
  std::vector<SuffixBound> bounds(space.num_groups());
  KeptEstimates kept(*profiles_, *cluster_, space, sim_->options().max_profiled_bs, !opt_.exhaustive && table_fits);
  const SuffixBoundBuilder builder(space, tables, kept, throughput, shared, control, *profiles_, *cluster_, *sim_,
                                   opt_, table_fits);
  const StageSearch stage_search(space, tables, bounds, kept, shared, control, *cluster_, opt_,
                                 sim_->options().schedule, sim_->options().virtual_stages);
  tbb::enumerable_thread_specific<Worker> workers([&] { return Worker(opt_.top_k, space.num_setups()); });

  setup_progress.stop();
  Periodic reporter(progress_reporter(opt_, control, shared, space.units_total()));
  SearchWork work{space, control, builder, bounds, stage_search, workers};
  if (kept.kept()) run_in_phases(work);
  else run_in_search_order(work);
  for (Worker& w : workers) control.publish(w.counters);
  reporter.stop();

  PlanSearchResult result = merge_workers(workers, control, opt_);
  result.seconds = control.elapsed_s();
  return result;
}

std::vector<int> parse_virtual_stages(const std::string& s) {
  if (s == "auto") return {1, 2, 3, 4};
  int v = 0;
  std::size_t used = 0;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || v < 1 || v > 64)
    throw InputError("--vp: '" + excerpt(s) + "': expected auto or a whole number from 1 to 64");
  return {v};
}

PlanSearchResult search_virtual_stages(const Cluster& cluster, const ProfileSet& profiles, const ModelShape& shape,
                                       int sequence_length, const SimulationOptions& base,
                                       const PlanSearchOptions& options, const std::vector<int>& virtual_stages) {
  PlanSearchResult all;
  const auto start = std::chrono::steady_clock::now();
  for (const int v : virtual_stages) {
    SimulationOptions so = base;
    if (v > 1) {
      so.schedule = Schedule::kInterleaved1F1B;
      so.virtual_stages = v;
    }
    PlanSearchOptions o = options;
    if (options.time_budget_s > 0) {
      const double used = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      o.time_budget_s = std::max(1e-3, options.time_budget_s - used);
    }
    const PlanSimulator sim(cluster, profiles, shape, sequence_length, so);
    PlanSearchResult r = PlanSearch(cluster, profiles, sim, o).run();
    for (SearchedPlan& p : r.top) {
      p.virtual_stages = v;
      all.top.push_back(std::move(p));
    }
    all.enumerated += r.enumerated;
    all.pruned += r.pruned;
    all.costed += r.costed;
    all.infeasible += r.infeasible;
    if (all.first_infeasible_reason.empty()) all.first_infeasible_reason = r.first_infeasible_reason;
    if (r.cut_short && !all.cut_short) {
      all.cut_short = true;
      all.cut_reason = r.cut_reason;
    }
    if (all.cut_short) break;
  }
  // Stable: each search's order, and the searches in the order of `virtual_stages`, on equal costs.
  std::stable_sort(all.top.begin(), all.top.end(),
                   [](const SearchedPlan& a, const SearchedPlan& b) { return a.plan.cost < b.plan.cost; });
  if (static_cast<int>(all.top.size()) > options.top_k) all.top.resize(options.top_k);
  all.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return all;
}

}  // namespace hetplan
