#include "planner/search_phases.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <memory>
#include <thread>
#include <tuple>

namespace hetplan {

namespace {

// Groups in order of decreasing micro-batch (more (dp, tp) options: the costlier tables), each taken by
// the next free thread: none is left alone with a large table at the end. Two micro-batches at a time,
// node order by node order (m1 o1, m2 o1, m1 o2, m2 o2, ...): groups taken at once then mostly differ in
// their micro-batch, and so in the estimates they fill (shared by the node orders of one micro-batch),
// so that two threads seldom compute the same estimate.
std::vector<int> group_order(const SearchSpace& space) {
  const int n_ms = static_cast<int>(space.micro_batch_counts.size());
  std::vector<int> order(space.num_groups());
  for (std::size_t group = 0; group < order.size(); ++group) order[group] = static_cast<int>(group);
  auto order_key = [&](int group) {
    const int rank = n_ms - 1 - group % n_ms;  // 0: the largest micro-batch (the counts run from the most)
    return std::make_tuple(rank / 2, group / n_ms, rank % 2);
  };
  std::sort(order.begin(), order.end(), [&](int x, int y) { return order_key(x) < order_key(y); });
  return order;
}

// The groups in `order`, each taken from `next` by the calling thread, until none is left, the search
// stops, or body(g) returns false.
template <class Body>
void take_groups(SearchControl& control, const std::vector<int>& order, std::atomic<std::size_t>& next, Body&& body) {
  for (std::size_t i = next.fetch_add(1); i < order.size() && !control.check_stop(); i = next.fetch_add(1))
    if (!body(order[i])) return;
}

int lanes() { return std::max(1, tbb::this_task_arena::max_concurrency()); }

// The phases' shared state and each thread's pass through them (run_in_phases).
class Phases {
 public:
  explicit Phases(SearchWork& work);
  void lane(int lane);

 private:
  void build_last_stages();
  void run_shallow_units(Worker& w);
  bool build_deeper_and_run(Worker& w, int lane, int group);
  void join_deep_units(Worker& w, int lane);
  bool run_deep_units(Worker& w, int lane, int group);
  void update_open_bound(int group);
  // Waits until `done()`: work of an earlier phase, which running threads have taken (every item of a
  // phase is taken before any thread leaves it), and which waits only on work of a phase before its own
  // (phase 1 on nothing). No TBB wait runs inside a lane, so no thread holds such work below a wait.
  // False where the search stops first (cut short, or a thread's exception).
  template <class Done>
  bool wait_for(Done&& done) {
    while (!done())
      if (work_.control.stopped()) return false;
      else std::this_thread::yield();
    return true;
  }

  static constexpr long long kChunk = 32;
  static constexpr std::size_t kArgminDepths = 2;  // depths whose argmin plans are polished, per group
  static constexpr double kArgminPolishS = 0.1;    // time limit of one polish
  static constexpr double kArgminShare = 0.1;      // of the time budget, for every polish together
  std::atomic<double> polish_s_{0};
  SearchWork& work_;
  std::vector<int> order_;  // (re-sorted by the bounds pass, before any thread reads it past that pass)
  const std::size_t n_groups_;
  // The least pipeline depth of phase 3: 3, or 1 where the seed plans set a threshold before the search
  // on a cluster of kDeepTablesFirstFrom GPUs or more (phase 2 is then empty: its plans are not needed to
  // set one, and they are pruned far better by the deeper entries, which also give the group's bound at
  // once). On smaller clusters phase 2 is cheap and its plans tighten the threshold the deeper entries
  // are built with. Also 1 wherever the bounds pass runs (it needs it; with the default bounds_pass_above_gpus
  // that is already so, and tests that lower it to 0 reach the pass on small clusters).
  static constexpr int kDeepTablesFirstFrom = 64;
  const int first_deep_;
  // The bounds pass (seeded searches of more than kWholeNodeStagesAbove GPUs): every group's whole table
  // first, for its bound over every depth (the global bound at once), then released; the groups are
  // then searched from the least bound up, and a group whose bound is above the threshold is closed
  // without building anything more.
  const bool bounds_pass_;
  std::atomic<std::size_t> next0_{0};
  std::atomic<std::size_t> bounded_{0};
  std::atomic<bool> sorted_{false};
  std::vector<double> group_bound_;  // [group]: the bounds pass's bound over every depth
  void run_bounds_pass();
  std::vector<double> root_bounds(int group) const;
  void seed_from_table(int group);
  bool closed_by_bound(int group) const {
    return bounds_pass_ && group_bound_[group] > work_.shared.threshold();
  }
  const long long per_group2_, n2_;  // each group's units of one and two stages; all groups'
  const long long per_group3_;       // each group's units of three stages and more
  std::atomic<std::size_t> next1_{0}, next3_{0};
  std::atomic<long long> next2_{0};
  std::unique_ptr<std::atomic<bool>[]> ready_;       // [g]: phase 1 done
  std::unique_ptr<std::atomic<long long>[]> left2_;  // [g]: phase 2's units to run
  // Phase 3's units of group g: the next not taken (next3u_[g]) and the number run (done3u_[g]) of its
  // per_group3_, once its deeper entries are built (open3_[g]).
  std::unique_ptr<std::atomic<long long>[]> next3u_, done3u_;
  std::unique_ptr<std::atomic<bool>[]> open3_;
  // The global bound's data: per group, the least of its deeper table's bound over the depths from p on
  // ([group][p], written before open3_[group]); per lane, the phase-3 unit it runs (group x (per_group3_ +
  // 1) + index, or -1), published before it takes the unit from next3u_.
  std::vector<std::vector<double>> from_depth_;
  const int n_lanes_;
  std::unique_ptr<std::atomic<long long>[]> lane_at_;
};

Phases::Phases(SearchWork& work)
    : work_(work),
      order_(group_order(work.space)),
      n_groups_(order_.size()),
      first_deep_(std::isfinite(work.shared.threshold()) &&
                          (work.space.gpus >= kDeepTablesFirstFrom || work.space.gpus > work.bounds_pass_above_gpus)
                      ? 1
                      : 3),
      bounds_pass_(first_deep_ == 1 && work.space.gpus > work.bounds_pass_above_gpus),
      group_bound_(n_groups_, 0.0),
      per_group2_(first_deep_ == 1 ? 0 : work.space.group_unit_count(1, 2)),
      n2_(per_group2_ * static_cast<long long>(n_groups_)),
      per_group3_(work.space.group_unit_count(first_deep_, work.space.max_stages)),
      ready_(new std::atomic<bool>[n_groups_]),
      left2_(new std::atomic<long long>[n_groups_]),
      next3u_(new std::atomic<long long>[n_groups_]),
      done3u_(new std::atomic<long long>[n_groups_]),
      open3_(new std::atomic<bool>[n_groups_]),
      from_depth_(n_groups_),
      n_lanes_(lanes()),
      lane_at_(new std::atomic<long long>[n_lanes_]) {
  for (int i = 0; i < n_lanes_; ++i) lane_at_[i].store(-1);
  for (std::size_t group = 0; group < n_groups_; ++group) {
    ready_[group].store(false);
    left2_[group].store(per_group2_);
    next3u_[group].store(0);
    done3u_[group].store(0);
    open3_[group].store(false);
  }
}

void Phases::lane(int lane) {
  if (bounds_pass_) run_bounds_pass();
  build_last_stages();
  Worker& w = work_.workers.local();
  run_shallow_units(w);
  // 3. Per group, its deeper entries, then its units of three stages and more; then, with no group left
  //    to build, the units of the groups other threads are on (see run_deep_units).
  take_groups(work_.control, order_, next3_, [&](int group) { return build_deeper_and_run(w, lane, group); });
  join_deep_units(w, lane);
}

// 0. Every group's table, for its bound, then released.
void Phases::run_bounds_pass() {
  // Under a time budget, the pass takes at most half of it: the groups it has not reached keep the floor.
  const double budget = work_.control.time_budget_s(), pass_end = budget > 0 ? 0.5 * budget : 1e300;
  take_groups(work_.control, order_, next0_, [&](int group) {
    if (work_.control.elapsed_s() > pass_end) {
      bounded_.fetch_add(1);
      return true;
    }
    SuffixBound& b = work_.bounds[group];
    b.with_pairs = true;  // the root bounds read the coupled entries
    work_.builder.build_last_stages(group, &b);
    work_.builder.finish(&b);
    work_.builder.build_deeper(group, &b);
    if (!work_.control.stopped()) {
      seed_from_table(group);
      from_depth_[group] = root_bounds(group);
      group_bound_[group] = from_depth_[group][1];
      work_.open.set(group, group_bound_[group]);
    }
    b.release();
    bounded_.fetch_add(1);
    return true;
  });
  // The last thread out sorts the groups by their bound; the others wait for it.
  if (!wait_for([&] { return bounded_.load() >= n_groups_; })) return;
  std::size_t expected = n_groups_;
  if (bounded_.compare_exchange_strong(expected, n_groups_ + 1)) {
    std::stable_sort(order_.begin(), order_.end(), [&](int x, int y) { return group_bound_[x] < group_bound_[y]; });
    sorted_.store(true);
  }
  wait_for([&] { return sorted_.load(); });
}

// The table's argmin plans at the few depths of least path(q, 0, 0), polished and kept (ArgminSeeds).
void Phases::seed_from_table(int group) {
  ArgminSeeds* a = work_.argmin;
  if (!a) return;
  // At most a tenth of the time budget (10 s without one) in all: past a few hundred GPUs a group's polish
  // takes its whole limit, and 72 groups' would take most of the bounds pass.
  const double budget = work_.control.time_budget_s(), cap = budget > 0 ? kArgminShare * budget : 10.0;
  if (polish_s_.load(std::memory_order_relaxed) > cap) return;
  const double started = work_.control.elapsed_s();
  const SuffixBound& bound = work_.bounds[group];
  const SearchSpace& sp = work_.space;
  std::vector<std::pair<double, int>> depths;
  for (int q = 1; q <= std::min(bound.depth, sp.max_stages); ++q) {
    const double v = std::max(bound.path(q, 0, 0), bound.tail_path(q, 0, 0));
    if (std::isfinite(v)) depths.emplace_back(v, q);
  }
  std::sort(depths.begin(), depths.end());
  if (depths.size() > kArgminDepths) depths.resize(kArgminDepths);
  std::vector<StageChoice> stages;
  for (const auto& depth : depths) {
    stages.clear();
    if (!work_.builder.argmin_stages(group, bound, depth.second, 0, 0, &stages)) continue;
    polish_plan(sp, a->cluster, a->options, a->schedule, sp.order_of_group(group).index,
                                 sp.micro_batches_of_group(group), stages, kArgminPolishS, work_.control, work_.shared,
                                 &a->found.local());
  }
  double spent = polish_s_.load(std::memory_order_relaxed);
  while (!polish_s_.compare_exchange_weak(spent, spent + work_.control.elapsed_s() - started)) {
  }
}

// [p]: a bound on every plan of the group with p stages or more, from its whole table: stage 0's
// choices (size, tp, layers), each bounded as the depth-first search bounds it (its estimate's busy time,
// or its passes plus the table's path through the stages after it), plus its exact all-reduce and
// optimizer step (the least over the settings), which the plan runs after the last backward reaches
// stage 0. The table's path(q, 0, 0) alone leaves that tail out.
std::vector<double> Phases::root_bounds(int group) const {
  const SearchSpace& sp = work_.space;
  const SuffixBound& bound = work_.bounds[group];
  const NodeOrder& o = sp.order_of_group(group);
  const int m = sp.micro_batches_of_group(group), mb = sp.gbs / m, layers = sp.layers, depth = sp.max_stages;
  const int setups = sp.num_setups();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> best(depth + 2, kInf);
  std::vector<FastStageCost> costs(setups);
  for (int s = 1; s <= sp.gpus && !work_.control.stopped(); ++s) {
    if (sp.whole_nodes && !o.node_start(s)) continue;
    const bool homo = o.homogeneous(0, s), all = s == sp.gpus;
    if (!all && depth < 2) continue;
    for (int tp = 1; tp <= std::min(s, sp.max_tp); ++tp) {
      if (s % tp != 0 || !sp.splits_micro_batch(s / tp, mb) || !o.tp_profiled(0, s, tp)) continue;
      const bool inside = o.tp_inside_nodes(0, s, tp);
      if (!work_.builder.cross_node_tp() && !inside) continue;
      double sf = 0, sb = 0;
      bound.estimator->sends(0, s, tp, homo, &sf, &sb);
      for (int k = all ? layers : 1; k <= (all ? layers : layers - 1); ++k) {
        const stage_estimates::StageEstimate x = bound.estimator->estimate(0, s, tp, 0, k, homo, inside);
        if (!std::isfinite(x.t)) continue;
        const double busy = m * x.t + (m - 1) * x.a + sb, csum = x.t + sf + sb + (m > 1 ? x.a : 0.0);
        double first = busy;  // the least of the bounds without the tail, over the depths
        if (!all)
          for (int q = 2; q <= std::min(depth, layers - k + 1); ++q) first = std::min(first, std::max(busy, csum + bound.path(q - 1, s, k)));
        if (!(first < best[all ? 1 : 2])) {
          bool above = true;  // no depth gains: skip the stage cost
          if (!all)
            for (int q = 2; q <= std::min(depth, layers - k + 1) && above; ++q)
              above = !(std::max(busy, csum + bound.path(q - 1, s, k)) < best[q]);
          if (above) continue;
        }
        StageChoice c;
        c.begin = 0;
        c.size = s;
        c.st = Strategy{s / tp, tp};
        c.layer_begin = 0;
        c.layer_end = k;
        if (!o.cost->stage(c, 0, all ? 1 : 2, m, mb, costs.data())) continue;
        // Its all-reduce, ZeRO collectives and step, coupled over the settings (least_sync_ms; those that fit
        // where it is the whole pipeline, its memory then exact).
        const double tail = least_sync_ms(*o.cost, costs.data(), setups, all);
        if (!std::isfinite(tail)) continue;
        if (all) {
          best[1] = std::min(best[1], busy + tail);
          continue;
        }
        // (With the tables' tails: also the forward to stage 1, then the rest's chain to some stage's end.)
        for (int q = 2; q <= std::min(depth, layers - k + 1); ++q) {
          // Stage 0's multi-trip chains (sim/schedule.h, multi_trip_counts: the most trips, and two), then
          // its tail.
          double trips = 0;
          for (const int wanted : {0, 2}) {
            const MultiTripCounts h = multi_trip_counts(work_.builder.schedule(), q - 1, m, wanted);
            if (h.trips >= 1)
              trips = std::max(trips, h.forwards * x.t + (h.backwards - h.forwards) * x.b + h.accumulations * x.a +
                                          h.trips * sf + sb + bound.first_trip(q - 1, s, k) +
                                          (h.trips - 1) * bound.last_trip(q - 1, s, k));
          }
          double v = std::max(std::max({busy, csum + bound.path(q - 1, s, k), trips}) + tail,
                              x.f + sf + bound.tail_path(q - 1, s, k));
          // The same with each coupled tuple of the stages after it: the least over them bounds every way
          // to form those stages, and each is at least the scalar entries (planner/plan_search.md,
          // "Coupled entries").
          int n = 0;
          const SuffixBound::Coupled* kept = bound.has_pairs() ? bound.coupled(q - 1, s, k, &n) : nullptr;
          double coupled = n > 0 ? kInf : v;
          for (int i = 0; i < n; ++i) {
            const SuffixBound::Coupled& p = kept[i];
            double tr = 0;
            for (const int wanted : {0, 2}) {
              const MultiTripCounts h = multi_trip_counts(work_.builder.schedule(), q - 1, m, wanted);
              if (h.trips >= 1)
                tr = std::max(tr, h.forwards * x.t + (h.backwards - h.forwards) * x.b + h.accumulations * x.a +
                                      h.trips * sf + sb + p.g0 + (h.trips - 1) * p.g);
            }
            coupled = std::min(coupled, std::max(std::max({busy, csum + p.h, tr}) + tail, x.f + sf + p.t));
          }
          best[q] = std::min(best[q], std::max(v, coupled));
        }
      }
    }
  }
  for (int q = depth; q >= 1; --q) best[q] = std::min(best[q], best[q + 1]);
  if (work_.control.stopped()) best.assign(depth + 2, 0.0);
  return best;
}

// 1. Every group's estimator and the one-stage entries of its suffix bound.
void Phases::build_last_stages() {
  take_groups(work_.control, order_, next1_, [&](int group) {
    if (closed_by_bound(group)) {
      ready_[group].store(true, std::memory_order_release);
      return true;
    }
    work_.builder.build_last_stages(group, &work_.bounds[group]);
    work_.builder.finish(&work_.bounds[group]);
    ready_[group].store(true, std::memory_order_release);
    return true;
  });
}

// 2. Every group's units of one and two stages, in group order, a few at a time: the threads stay near
//    the front, where the plans found set the threshold for the rest.
void Phases::run_shallow_units(Worker& w) {
  bool stopped = false;
  for (long long b = next2_.fetch_add(kChunk); b < n2_ && !stopped; b = next2_.fetch_add(kChunk))
    for (long long i = b, end = std::min(n2_, b + kChunk); i < end && !stopped;) {
      const long long gi = i / per_group2_, group_end = std::min(end, (gi + 1) * per_group2_), from = i;
      const int group = order_[gi];
      stopped = !wait_for([&] { return ready_[group].load(std::memory_order_acquire); });
      for (; i < group_end && !stopped; ++i, ++w.counters.own.units) {
        if ((stopped = work_.control.every_so_often(w.counters))) break;
        work_.stage_search.run_unit(w, work_.space.group_unit(group, 1, i % per_group2_));
      }
      left2_[group].fetch_sub(i - from, std::memory_order_release);
    }
}

bool Phases::build_deeper_and_run(Worker& w, int lane, int group) {
  // Its one-stage entries (phase 1: with no phase 2, another thread may still be building them), then
  // its units of one and two stages.
  if (!wait_for([&] { return ready_[group].load(std::memory_order_acquire); })) return false;
  if (!wait_for([&] { return left2_[group].load(std::memory_order_acquire) == 0; })) return false;
  if (closed_by_bound(group)) {  // every plan of the group costs more than the threshold
    work_.bounds[group].release();
    from_depth_[group].assign(work_.space.max_stages + 2, std::numeric_limits<double>::infinity());
    next3u_[group].store(per_group3_);
    done3u_[group].store(per_group3_);
    open3_[group].store(true, std::memory_order_release);
    work_.open.close(group);
    return true;
  }
  work_.builder.build_deeper(group, &work_.bounds[group]);
  work_.builder.finish(&work_.bounds[group]);
  // Every plan of q stages of the group is bounded by path(q, 0, 0) (or costs more than the threshold).
  const int max_stages = work_.space.max_stages;
  std::vector<double>& fd = from_depth_[group];
  const std::vector<double> from_pass = fd;  // the bounds pass's, where it ran: stage 0's tail included
  fd.assign(max_stages + 2, std::numeric_limits<double>::infinity());
  if (!work_.control.stopped())
    for (int q = max_stages; q >= 1; --q)
      fd[q] = std::min(fd[q + 1], std::max(work_.bounds[group].path(q, 0, 0), work_.bounds[group].tail_path(q, 0, 0)));
  else fd.assign(max_stages + 2, 0.0);  // (the table may be part-built)
  if (from_pass.size() == fd.size())
    for (std::size_t q = 0; q < fd.size(); ++q) fd[q] = std::max(fd[q], from_pass[q]);
  open3_[group].store(true, std::memory_order_release);
  if (per_group3_ == 0) {
    work_.bounds[group].release();  // no unit of three stages or more (fewer stages searched)
    work_.open.close(group);
  } else {
    work_.open.set(group, fd[first_deep_]);
  }
  return run_deep_units(w, lane, group);
}

// The group's bound from the least pipeline depth of its phase-3 units not yet done.
void Phases::update_open_bound(int group) {
  if (done3u_[group].load() >= per_group3_) {
    work_.open.close(group);
    return;
  }
  long long lowest = next3u_[group].load();
  const long long base = static_cast<long long>(group) * (per_group3_ + 1);
  for (int i = 0; i < n_lanes_; ++i) {
    const long long at = lane_at_[i].load();
    if (at >= base && at <= base + per_group3_) lowest = std::min(lowest, at - base);
  }
  if (lowest >= per_group3_) return;
  const int p = work_.space.group_unit(group, first_deep_, lowest).stages;
  work_.open.set(group, from_depth_[group][p]);
}

void Phases::join_deep_units(Worker& w, int lane) {
  for (bool left = true; left && !work_.control.stopped();) {
    left = false;
    bool ran = false;
    for (int group : order_) {
      if (next3u_[group].load(std::memory_order_relaxed) >= per_group3_) continue;
      left = true;
      if (!open3_[group].load(std::memory_order_acquire)) continue;  // its table is being built
      ran = true;
      if (!run_deep_units(w, lane, group)) break;
    }
    if (left && !ran) std::this_thread::yield();
  }
}

// Runs group g's phase-3 units, a chunk at a time, until every one is taken; the thread that runs its
// last frees its table. Any thread may join a group's units: the chunks shrink as they run out, so that
// at the end of the search no thread is left alone with a long chunk (a few units take milliseconds, most
// microseconds) while the other has nothing to do. False where the search stops.
bool Phases::run_deep_units(Worker& w, int lane, int group) {
  const long long base = static_cast<long long>(group) * (per_group3_ + 1);
  for (;;) {
    const long long taken = next3u_[group].load();
    const long long left = per_group3_ - taken;
    if (left <= 0) return true;
    const long long chunk = std::clamp<long long>(left / 64, 1, 64);
    lane_at_[lane].store(base + taken);  // at most the unit it takes: published before next3u_ moves past
    const long long b = next3u_[group].fetch_add(chunk);
    lane_at_[lane].store(base + std::min(b, per_group3_));
    if (b >= per_group3_) {
      lane_at_[lane].store(-1);
      return true;
    }
    const long long e = std::min(per_group3_, b + chunk);
    long long i = b;
    bool stopped = false;
    for (Unit u = work_.space.group_unit(group, first_deep_, b); i < e; ++i, ++w.counters.own.units, u = work_.space.next_in_group(u)) {
      if ((stopped = work_.control.every_so_often(w.counters))) break;
      work_.stage_search.run_unit(w, u);
    }
    if (stopped) return false;  // (the table is left to the search's end)
    lane_at_[lane].store(-1);
    if (done3u_[group].fetch_add(e - b, std::memory_order_acq_rel) + (e - b) == per_group3_) work_.bounds[group].release();
    update_open_bound(group);
  }
}

}  // namespace

void run_in_search_order(SearchWork& work) {
  // Nothing gains from a threshold before the tables, and the shallow plans of a large cluster are often
  // out of memory, so the units run in the search's order, the threads starting far apart in it (at
  // different depths).
  const std::vector<int> order = group_order(work.space);
  std::atomic<std::size_t> next{0};
  tbb::parallel_for(0, lanes(), [&](int) {
    take_groups(work.control, order, next, [&](int group) {
      work.builder.build_last_stages(group, &work.bounds[group]);
      work.builder.finish(&work.bounds[group]);
      return true;
    });
  });
  tbb::parallel_for(tbb::blocked_range<long long>(0, work.space.units_total(), 1),
                    [&](const tbb::blocked_range<long long>& range) {
                      Worker& w = work.workers.local();
                      for (long long i = range.begin(); i != range.end() && !work.control.every_so_often(w.counters);
                           ++i, ++w.counters.own.units)
                        work.stage_search.run_unit(w, work.space.unit_at(i));
                    });
}

void run_in_phases(SearchWork& work) {
  // One pass of every thread, with no wait between the phases: a thread that finds no work left in one
  // phase goes on to the next (a thread that goes idle between phases can take milliseconds to wake on a
  // VM). A group's units wait only for its own one-stage entries, and its deeper entries (which rebuild
  // its table) for its units of one and two stages.
  Phases phases(work);
  tbb::parallel_for(0, lanes(), [&](int lane) {
    try {
      phases.lane(lane);
    } catch (...) {
      work.control.stop_now();  // (out of memory) no thread waits for ever on this one's work
      throw;
    }
  });
}

}  // namespace hetplan
