// The driver of the default search (planner/plan_search.md): options, the parts of the search, threads,
// progress, and the merge of the workers' best plans.
#include "planner/plan_search.h"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "planner/kept_estimates.h"
#include "base/periodic.h"
#include "sim/profile.h"  // unknown_device_type
#include "planner/search_control.h"
#include "planner/search_phases.h"
#include "planner/search_settings.h"
#include "planner/search_space.h"
#include "planner/seed_plans.h"
#include "planner/shared_bound.h"
#include "planner/stage_search.h"
#include "planner/suffix_bound.h"
#include "base/thread_limit.h"
#include "base/input_error.h"

namespace hetplan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A lower bound on the optimum over the whole space: every plan already searched was costed (at least
// the best) or pruned by a bound above the threshold at the time (at least today's threshold); every
// plan not yet searched is bounded by its group's open bound (or `floor`, before the groups exist).
double global_lower_bound(const SharedBound& shared, const OpenBounds* open, double floor) {
  return std::min({shared.best(), shared.threshold(), open ? open->least() : floor});
}

// best / bound - 1, or -1 where unknown.
double relative_gap(double best, double bound) {
  if (!std::isfinite(best) || !(bound > 0)) return -1;
  return std::max(0.0, best / bound - 1);
}

// The set-up's progress report (units_total 0), about once a second from a side thread, until the
// search's units start: the set-up's tables grow with layers^2 x tp (seconds at thousands of layers),
// and the seed plans are costed (best and bound already known).
std::function<void()> setup_reporter(const PlanSearchOptions& options, const SearchControl& control,
                                     const SharedBound& shared, const double& floor) {
  if (!options.progress) return {};
  return [&options, &control, &shared, &floor] {
    PlanSearchProgress pr;  // units_total 0: still setting up
    pr.elapsed_s = control.elapsed_s();
    const double best = shared.best();
    pr.best_ms = std::isfinite(best) ? best : -1;
    pr.lower_bound_ms = global_lower_bound(shared, nullptr, floor);
    pr.gap = relative_gap(best, pr.lower_bound_ms);
    options.progress(pr);
  };
}

// About once a second from a side thread: stops the search once what is left is proven within the gap
// asked for (gap > 0 only: at gap 0 a plan left may tie the best and come first in the plan order), and
// reports the progress where asked to.
std::function<void()> progress_reporter(const PlanSearchOptions& options, SearchControl& control,
                                        const SharedBound& shared, const OpenBounds& open, long long units_total) {
  return [&options, &control, &shared, &open, units_total] {
    const double best = shared.best(), lb = global_lower_bound(shared, &open, open.floor());
    if (options.gap > 0 && std::isfinite(best) && open.least() * (1 + options.gap) >= best) control.stop_proven();
    if (!options.progress) return;
    PlanSearchProgress pr;
    pr.units_done = control.units_done();
    pr.units_total = units_total;
    pr.enumerated = control.enumerated();
    pr.pruned = control.pruned();
    pr.costed = control.costed();
    pr.elapsed_s = control.elapsed_s();
    if (pr.units_done > 0)
      pr.eta_s = pr.elapsed_s * static_cast<double>(pr.units_total - pr.units_done) / pr.units_done;
    pr.best_ms = std::isfinite(best) ? best : -1;
    pr.lower_bound_ms = lb;
    pr.gap = relative_gap(best, lb);
    options.progress(pr);
  };
}

// The throughput bound on every plan of the space (SuffixBound::throughput_bound from rank 0 and layer
// 0): some stage takes at least gbs x the reference type's GPU-ms of every layer over the cluster's
// GPUs weighted by 1 / kappa. 0 where the rates are unknown.
double space_floor(const SearchSpace& space, const ThroughputRates& rates) {
  if (rates.kappa.empty() || rates.reference.empty()) return 0;
  const NodeOrder& o = space.orders[0];
  double inverse = 0;
  for (int r = 0; r < o.ranks; ++r) {
    const double k = rates.kappa[o.layout->type_of(r)];
    if (!(k > 0)) return 0;
    inverse += 1 / k;
  }
  const double floor = space.gbs * rates.reference[space.layers] / inverse;
  return std::isfinite(floor) ? floor : 0;
}

// The workers' counts, first infeasibility and best plans, merged; the stop's reason.
PlanSearchResult merge_workers(tbb::enumerable_thread_specific<Worker>& workers, TopPlans& seeds,
                               const SearchControl& control, const PlanSearchOptions& options) {
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
  // The seeds the search met again are there already (with the setting the search chose on ties); so are
  // the plans met around the search's new best plans.
  for (auto& e : seeds.items()) insert_unique(&top, std::move(e.key), std::move(e.item));
  for (Worker& w : workers)
    for (auto& e : w.polished.items()) insert_unique(&top, std::move(e.key), std::move(e.item));
  for (auto& e : top.items()) result.top.push_back(std::move(e.item));
  result.cut_short = control.stopped() && control.why() != SearchControl::kProven;
  if (result.cut_short)
    result.cut_reason = control.why() == SearchControl::kCancelled    ? "interrupted"
                        : control.why() == SearchControl::kTimeBudget ? "time budget of " +
                                                                            std::to_string(options.time_budget_s) +
                                                                            " s reached"
                                                                      : "stopped (seed plans only, or an error)";
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
  // (Settings of different context-parallel sizes are searched apart: the limit is per size.)
  for (const std::vector<int>& part : context_parallel_parts(opt_.setups))
    if (part.size() > 32)
      throw InputError("search: at most 32 training settings can be searched at once (per context-parallel size)");
  for (const auto& name : cluster.device_types())
    if (profiles.type_index(name) < 0) throw unknown_device_type(cluster, profiles, name);
}

PlanSearchResult PlanSearch::run() const {
  if (opt_.arena) return opt_.arena->execute([&] { return search_all(); });
  if (opt_.threads <= 0) return search_all();
  // An arena of that many slots, not a global_control: lifting a global limit of one thread at the end
  // made TBB start a worker just as the process exited (a thread created and torn down for nothing).
  const auto more_threads_than_cores = allow_threads_beyond_cores(opt_.threads, tbb::info::default_concurrency());
  tbb::task_arena arena(opt_.threads);
  return arena.execute([&] { return search_all(); });
}

PlanSearchResult PlanSearch::search_all() const {
  // Context parallelism: one search per size (each prices its stages at its own cp), exhaustive ones too.
  const std::vector<std::vector<int>> cps = context_parallel_parts(opt_.setups);
  if (cps.size() > 1) return search_parts(cps, true);
  using Parts = PlanSearchOptions::SettingParts;
  const bool parts = !opt_.exhaustive && !opt_.seeds_only && opt_.setups.size() > 1 &&
                     (opt_.setting_parts == Parts::kAlways ||
                      (opt_.setting_parts == Parts::kAuto && settings_bind_memory(*cluster_, *profiles_, *sim_, opt_.setups)));
  return parts ? search_parts(setting_parts(opt_.setups), false) : search();
}

PlanSearchResult PlanSearch::search() const {
  // The time budget covers the set-up too: past it, the tables' rows stop early and the phases find the
  // search stopped.
  SearchControl control(SearchControl::Clock::now(), opt_.time_budget_s, opt_.cancel);
  SharedBound shared(opt_.top_k, opt_.gap);
  for (const auto& [cost, id] : opt_.incumbents) shared.offer(cost, id);
  double floor = 0;  // the throughput bound on every plan, once known
  Periodic setup_progress(setup_reporter(opt_, control, shared, floor));
  std::vector<TrainingSetup> setups = opt_.setups;
  if (setups.empty()) setups.push_back(sim_->options().setup);
  const SearchSpace space(*cluster_, *profiles_, *sim_, std::move(setups), opt_);
  const bool table_fits = suffix_table_fits(space, *cluster_, opt_.suffix_table_limit);
  // The throughput bound's data: the global bound's floor, and the search's bound where the per-rank
  // table is too large.
  ThroughputRates throughput = throughput_rates(space, *profiles_, *cluster_);
  floor = space_floor(space, throughput);
  if (opt_.exhaustive || opt_.allow_cross_node_tp || table_fits) throughput = ThroughputRates();
  // Every plan above the threshold the plans of earlier setting parts set (PlanSearchOptions::incumbents):
  // nothing to search (the bound is the threshold).
  const bool closed = !opt_.exhaustive && floor > shared.threshold();
  // The suffix tables and the depth-first search leave out stages that cannot fit memory under any setup.
  FeasibilityTables tables(space);
  if (!opt_.exhaustive && !closed) tables.fill(space, *profiles_, *cluster_, control);

  // The seed plans: a runnable plan and a threshold before the search proper.
  TopPlans seeds(opt_.top_k);
  SeedStats seeded;
  // (Not under interleaving: the seeds are plain pipelines costed stage by stage, and an interleaved plan needs
  // pp >= 2 and micro-batches a multiple of pp; the interleaved search runs without them.)
  if (!opt_.exhaustive && !closed && sim_->options().schedule != Schedule::kInterleaved1F1B) {
    const double seed_time = opt_.time_budget_s > 0 ? std::min(opt_.seed_time_s, 0.25 * opt_.time_budget_s)
                                                    : opt_.seed_time_s;
    seeded = seed_plans(space, least_gpu_ms_per_sample(space, *profiles_, *cluster_), *cluster_, opt_,
                        sim_->options().schedule, seed_time, control, shared, &seeds);
  }

  std::vector<SuffixBound> bounds(space.num_groups());
  KeptEstimates kept(*profiles_, *cluster_, space, sim_->options().max_profiled_bs, !opt_.exhaustive && table_fits);
  const SuffixBoundBuilder builder(space, tables, kept, throughput, shared, control, *profiles_, *cluster_, *sim_,
                                   opt_, table_fits);
  const StageSearch stage_search(space, tables, bounds, kept, shared, control, *cluster_, opt_,
                                 sim_->options().schedule, sim_->options().virtual_stages);
  tbb::enumerable_thread_specific<Worker> workers(
      [&] { return Worker(opt_.top_k, space.num_setups(), stage_cache_bytes(space.gpus)); });
  OpenBounds open(space.num_groups(), floor);

  setup_progress.stop();
  Periodic reporter(progress_reporter(opt_, control, shared, open, space.units_total()));
  tbb::enumerable_thread_specific<TopPlans> from_tables([&] { return TopPlans(opt_.top_k); });
  ArgminSeeds argmin{*cluster_, opt_, sim_->options().schedule, from_tables};
  SearchWork work{space, control, builder, bounds, stage_search, workers, open, shared, opt_.bounds_pass_above_gpus};
  if (!opt_.exhaustive && sim_->options().schedule != Schedule::kInterleaved1F1B) work.argmin = &argmin;
  if (opt_.seeds_only) control.stop_now();
  if (!control.stopped() && !closed) {
    if (kept.kept()) run_in_phases(work);
    else run_in_search_order(work);
  }
  for (Worker& w : workers) control.publish(w.counters);
  reporter.stop();

  for (TopPlans& t : from_tables)
    for (auto& e : t.items()) insert_unique(&seeds, std::move(e.key), std::move(e.item));
  PlanSearchResult result = merge_workers(workers, seeds, control, opt_);
  result.seconds = control.elapsed_s();
  finish_proof(shared, open, control, &result);
  result.gap_asked = opt_.gap;
  result.seeds_costed = seeded.costed;
  result.seed_seconds = seeded.seconds;
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
    // The proof over the union: every search's bound holds for its part of the space.
    all.lower_bound_ms = v == virtual_stages.front() ? r.lower_bound_ms : std::min(all.lower_bound_ms, r.lower_bound_ms);
    all.space_empty = (v == virtual_stages.front() || all.space_empty) && r.space_empty;
    all.gap_asked = r.gap_asked;
    all.seeds_costed += r.seeds_costed;
    all.seed_seconds += r.seed_seconds;
    if (r.first_plan_s >= 0 && (all.first_plan_s < 0 || r.first_plan_s < all.first_plan_s)) all.first_plan_s = r.first_plan_s;
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
  all.best_ms = all.top.empty() ? -1 : all.top[0].plan.cost;
  if (!all.top.empty()) all.lower_bound_ms = std::min(all.lower_bound_ms, all.best_ms);
  const double g = all.top.empty() ? -1 : relative_gap(all.best_ms, all.lower_bound_ms);
  all.gap = g < 0 ? std::numeric_limits<double>::infinity() : g;
  all.proven = all.space_empty || (!all.top.empty() && all.gap <= all.gap_asked * (1 + 1e-9) + 1e-12);
  all.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return all;
}

// The result's best, bound and gap: a search that ran to its end (or stopped with what is left proven
// within the gap) has searched every plan not proven worse than the threshold.
void PlanSearch::finish_proof(const SharedBound& shared, const OpenBounds& open, const SearchControl& control,
                              PlanSearchResult* result) const {
  result->best_ms = result->top.empty() ? -1 : result->top[0].plan.cost;
  const double best = result->top.empty() ? kInf : result->top[0].plan.cost;
  const bool finished = !result->cut_short;
  const double left = control.stopped() ? open.least() : kInf;  // stopped: cut short, or proven early
  result->lower_bound_ms = std::min({best, shared.threshold(), left});
  result->space_empty = finished && result->top.empty();
  const double g = relative_gap(best, result->lower_bound_ms);
  result->gap = g < 0 ? kInf : g;
  result->proven = result->space_empty || (!result->top.empty() && result->gap <= opt_.gap * (1 + 1e-9) + 1e-12);
  if (std::isfinite(shared.best()))
    result->first_plan_s = std::chrono::duration<double>(shared.first_found() - control.start()).count();
}

}  // namespace hetplan
