// The search's lower bounds on single stages (used by planner/suffix_bound.cc and stage_search.cc): StageEstimate and the
// StageEstimator that makes them from the same profile look-ups as the simulator, and the stores
// that share them between the search's (node order, m) groups: ShareSlices (the simulator's
// slicing of a replica's share), HomogeneousEstimates and MixedLists (kept estimates, each
// filled once within an EstimateBudget through an EstimateSlot). An estimate never exceeds what
// PlanCostModel::stage charges for the same stage (tests/test_plan_search.cc checks the search
// that uses them against exhaustive enumeration).
//
// Internal to the planner's default search (planner/plan_search.h and its parts, planner/plan_search.md).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "base/spin_lock.h"
#include "sim/cluster.h"
#include "sim/data_load_balancer.h"
#include "sim/parallel_layout.h"
#include "sim/plan_cost.h"
#include "sim/profile.h"
#include "sim/rank_layout.h"
#include "sim/sequence_parallel.h"

namespace hetplan::stage_estimates {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Where the estimate of layers [l, e) of L sits in a stage's estimates: rows by l, each e = l + 1 .. L
// (contiguous in e), L (L + 1) / 2 in all. REQUIRES: 0 <= l < e <= L.
inline std::size_t span_index(int L, int l, int e) {
  return static_cast<std::size_t>(l) * L - static_cast<std::size_t>(l) * (l - 1) / 2 + (e - l - 1);
}
inline std::size_t spans(int L) { return static_cast<std::size_t>(L) * (L + 1) / 2; }

// Lower bounds on a stage's costs per micro-batch (ms), from the same profile
// look-ups the simulator makes (under context parallelism cp as it makes them:
// the micro-batch split over the dp / cp groups, each rank running its group's
// share as Slices says), leaving out every term that only adds (the
// first and last stages' extras, recomputation, ZeRO's collectives, the
// sustained stretch, cross-node tp, the cp ring's exchange and merges): its
// forward + backward, a lower bound on
// each of the two, its measured gradient accumulation, and its two p2p sends
// (exact: they depend only on the ranks, tp and the largest replica share).
// Look-ups are resolved once, so an estimate is a few slice sums.
struct StageEstimate {
  double t = 0;       // forward + backward of the slowest replica (<= the stage's forward_ms + backward_ms)
  double f = 0, b = 0;  // <= forward_ms, <= backward_ms (f + b <= t)
  double a = 0;       // <= accumulation_ms
  // A lower bound on n_f forwards and n_b backwards: f + b <= t, so the smaller count is taken at t.
  double runs(double n_f, double n_b) const {
    return n_f <= n_b ? n_f * t + (n_b - n_f) * b : n_b * t + (n_f - n_b) * f;
  }
};

// The simulator's slicing of a replica's share of a micro-batch: its own profile file, else its
// power-of-two slices (ProfileSet::share_files). Under context parallelism cp the share is a cp group's and
// the slicing its ranks' (cp_rank_work, sim/sequence_parallel.h, as PlanCostModel's slowest replica).
struct Slices {
  int type = 0, tp = 1;
  double divisor = 1;  // a rank's time is its files' time / divisor
  bool missing = false;
  bool forward_known = false;  // every file splits out the forward
  // The fb_sync_ms of the share's own profile file (0 without one): what stage() adds to a replica of this
  // share per micro-batch, times the stage's share of the model's parameter bytes (the pass's time outside
  // its layers).
  double fb_sync = 0;
  std::vector<const LayerProfile*> files;
};

// Slices of every (cluster type, tp, share), shared by every (node order, m) group: they depend on
// nothing else but the context-parallel size cp (the search's: SearchSpace::cp). Read-only after
// construction (thread-safe); REQUIRES: the profiles outlive it; cp >= 1.
class ShareSlices {
 public:
  ShareSlices(const ProfileSet& profiles, const Cluster& cluster, int max_tp, int max_share, int max_profiled_bs,
              int cp = 1)
      : tps_(max_tp + 1), shares_(max_share + 1), cp_(cp) {
    const int types = static_cast<int>(cluster.device_types().size());
    v_.resize(static_cast<std::size_t>(types) * tps_ * shares_);
    for (int t = 0; t < types; ++t) {
      const int pt = profiles.type_index(cluster.device_types()[t]);
      for (int tp = 1; tp <= max_tp; ++tp)
        for (int share = 1; share <= max_share; ++share) {
          Slices& sl = v_[(static_cast<std::size_t>(t) * tps_ + tp) * shares_ + share];
          const CpRankWork work = cp_rank_work(share, cp);
          const int samples = work.samples;
          sl.divisor = work.divisor;
          const LayerProfile* files[32];
          const int n = profiles.share_files(pt, tp, samples, max_profiled_bs, files);
          if (n < 0) sl.missing = true;
          sl.files.assign(files, files + std::max(0, n));
          sl.type = t;
          sl.tp = tp;
          sl.forward_known = !sl.files.empty();
          const LayerProfile* own = profiles.find(pt, tp, samples);
          sl.fb_sync = own ? std::max(0.0, own->fb_sync_ms) : 0.0;
          for (const LayerProfile* lp : sl.files) sl.forward_known = sl.forward_known && lp->has_forward();
        }
    }
  }
  // REQUIRES: 1 <= tp <= max_tp, 1 <= share <= max_share.
  const Slices& at(int type, int tp, int share) const {
    return v_[(static_cast<std::size_t>(type) * tps_ + tp) * shares_ + share];
  }
  int cp() const { return cp_; }

 private:
  int tps_, shares_, cp_;
  std::vector<Slices> v_;  // [type][tp][share]
};

// A memory budget shared by the kept estimates. Thread-safe.
class EstimateBudget {
 public:
  explicit EstimateBudget(std::size_t bytes) : limit_(bytes) {}
  bool take(std::size_t bytes) {
    if (used_.fetch_add(bytes) + bytes <= limit_) return true;
    used_.fetch_sub(bytes);
    return false;
  }
  void give_back(std::size_t bytes) { used_.fetch_sub(bytes); }  // REQUIRES: taken before

 private:
  std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

// One kept set of stage estimates, filled by the first caller that claims it (within the budget). A
// caller that finds another thread filling it waits for it: a fill takes microseconds, and a caller
// that computed its own instead would compute them again at each call until the fill ends (on two
// threads that made a group's table four times slower). Thread-safe; `fill` must not wait on a slot.
class EstimateSlot {
 public:
  // `fill(v)` writes the estimates into v (sized `n`).
  template <class Fill>
  const StageEstimate* get(std::size_t n, EstimateBudget& budget, Fill&& fill) {
    int state = state_.load(std::memory_order_acquire);
    if (state == kEmpty && state_.compare_exchange_strong(state, kFilling, std::memory_order_acquire)) {
      bool taken = false;
      try {
        if ((taken = budget.take(n * sizeof(StageEstimate)))) {
          v_.resize(n);
          fill(v_.data());
        }
      } catch (...) {  // (out of memory) kept empty, so that no caller waits for ever
        if (taken) budget.give_back(n * sizeof(StageEstimate));
        std::vector<StageEstimate>().swap(v_);
        state_.store(kReady, std::memory_order_release);
        throw;
      }
      state_.store(kReady, std::memory_order_release);
      state = kReady;
    }
    while (state == kFilling) {
      std::this_thread::yield();
      state = state_.load(std::memory_order_acquire);
    }
    return state == kReady && !v_.empty() ? v_.data() : nullptr;
  }

 private:
  enum { kEmpty, kFilling, kReady };
  std::atomic<int> state_{kEmpty};
  std::vector<StageEstimate> v_;
};

// Samples a replica of per-sample time w finishes by t: floor(t / w), a hair more so that rounding never
// undercounts.
inline double samples_by(double t, double w) { return std::floor(t / w * (1 + 1e-12)); }

// The most runs of ranks of one type whose whole-sample walk StageEstimator::estimate takes.
constexpr int kMaxWalkRuns = 8;

// The whole-sample walk of StageEstimator::estimate for a mixed-type stage: from t (the fractional bound
// b / capacity), breakpoint by breakpoint, the first t at which the `runs` runs (n[i] replicas of
// per-sample time w[i] > 0, finite) finish b samples by samples_by, or the breakpoint reached after 64
// steps (each t at which the sum still falls short is itself a lower bound). Each step recomputes run i's
// samples by t only where they may have changed: the run whose breakpoint t = fl((k + 1) w) is gains
// exactly one (t / w rounds to within 3 ulp of k + 1; the hair, 1e-12, lifts that past k + 1 and keeps it
// below k + 2 while k < 1e11), and a run whose next breakpoint is more than 1e-11 relative above t keeps
// its count (t / w stays below k + 1 even with the hair); only near-ties divide again. So the result is
// bit for bit that of dividing every run at every step (tests/test_plan_search.cc checks it against that),
// at one division per run instead of one per run per step.
// REQUIRES: 1 <= runs <= kMaxWalkRuns.
inline double whole_sample_walk(double t, const double* w, const int* n, int runs, int b) {
  double k[kMaxWalkRuns], next_at[kMaxWalkRuns];
  for (int i = 0; i < runs; ++i) {
    k[i] = samples_by(t, w[i]);
    next_at[i] = (k[i] + 1) * w[i];
  }
  for (int step = 0; step < 64; ++step) {
    long long done = 0;
    double next = std::numeric_limits<double>::infinity();
    for (int i = 0; i < runs; ++i) {
      done += static_cast<long long>(k[i]) * n[i];
      next = std::min(next, next_at[i]);
    }
    if (done >= b) break;
    t = next;
    for (int i = 0; i < runs; ++i) {
      if (next_at[i] == t && k[i] < 1e11) {
        k[i] += 1;
      } else if (!(t < next_at[i] * (1 - 1e-11))) {
        k[i] = samples_by(t, w[i]);
      } else {
        continue;
      }
      next_at[i] = (k[i] + 1) * w[i];
    }
  }
  return t;
}

class StageEstimator;
// The distinct replicas of mixed-type stages, as sorted lists of slicings, shared by every (node order,
// m) group: stages with the same list have the same estimates, which the entry keeps once computed.
// Thread-safe; an entry's address is stable for the object's lifetime.
class MixedLists {
 public:
  explicit MixedLists(EstimateBudget& budget) : budget_(&budget) {}
  struct Entry {
    std::vector<const Slices*> list;
    EstimateSlot estimates;  // [span_index(L, l, e)]
  };
  Entry* intern(const std::vector<const Slices*>& sorted_list) {
    std::lock_guard<SpinLock> lock(mu_);
    auto [it, fresh] = index_.try_emplace(sorted_list, nullptr);
    if (fresh) {
      entries_.push_back(std::make_unique<Entry>());
      entries_.back()->list = sorted_list;
      it->second = entries_.back().get();
    }
    return it->second;
  }
  // The estimates of layers [l, e) at [span_index(layers, l, e)] of every stage with `entry` (`est`'s
  // stage [r, r + s) at tp is one), computed by the first caller; nullptr for a null entry or past the
  // memory budget.
  const StageEstimate* estimates(Entry* entry, const StageEstimator& est, int r, int s, int tp, int layers);

 private:
  EstimateBudget* budget_;
  SpinLock mu_;  // a lookup or an insert: the groups' estimators intern at once at the search's start
  std::map<std::vector<const Slices*>, Entry*> index_;
  std::vector<std::unique_ptr<Entry>> entries_;
};

class StageEstimator {
 public:
  // The largest mixed-stage table ((R + 1)^2 (max_tp + 1) entries) the estimator builds; above it, the
  // whole-sample capacity bound stands in. Tests lower it to exercise that bound.
  static constexpr double kMixedTableLimit = 2e6;
  // `unmeasured_acc`: an UnmeasuredAccumulation table for these types and max_tp.
  // Context parallelism: the cost model's setups' context-parallel size cp (SearchSpace::cp), over which
  // each stage's dp replicas form dp / cp groups (StageGrid::cp_groups) that the micro-batch is split
  // over, each rank running its group's share as PlanCostModel::stage's slowest replica does (the
  // slicing of `slices`, built at that cp: share / cp whole sequences, or 1/cp of the share's profile),
  // with the time outside the layers and the accumulation of those files; the ring exchange only adds
  // (left out). REQUIRES: `slices` covers max_tp and shares up to micro_batch and has the setups' cp;
  // every setup of `cost` has the same context_parallel; `slices`, `mixed_lists`, `unmeasured_acc`, the
  // layout, cost model and profiles outlive the estimator.
  StageEstimator(const ProfileSet& profiles, const Cluster& cluster, const RankLayout& layout, const PlanCostModel& cost,
                 const ShareSlices& slices, MixedLists& mixed_lists, int micro_batch, int max_tp, bool full_params,
                 double backward_share, const std::vector<double>& unmeasured_acc, int layers,
                 double mixed_table_limit = kMixedTableLimit)
      : layout_(&layout), cost_(&cost), slices_(&slices), b_(micro_batch), max_tp_(max_tp),
        cp_(std::max(1, cost.setup(0).context_parallel)), full_params_(full_params),
        forward_share_(1 - backward_share), recompute_(cost.least_recompute_fraction()), unmeasured_acc_(&unmeasured_acc),
        L_(layers) {
    if (slices.cp() != cp_) throw std::invalid_argument("StageEstimator: slices of another context-parallel size");
    const int types = static_cast<int>(cluster.device_types().size());
    param_bytes_.assign(L_ + 1, 0.0);
    const std::vector<double>& bytes = profiles.model().parameters_per_layer_bytes;
    for (int l = 0; l < L_; ++l) param_bytes_[l + 1] = param_bytes_[l] + (l < static_cast<int>(bytes.size()) ? bytes[l] : 0.0);
    tied_copy_ = L_ > 1 ? cost.tied_copy_bytes(1, L_) : 0.0;  // any piece [l > 0, L) keeps the same copy
    // Mixed-type stages: the data load balancer's shares depend only on the replicas' types, tp and the
    // micro-batch, not on the layers, so each (first rank, size, tp) keeps its distinct (type, share)
    // replicas, and an estimate is its slowest replica's exact profile time. (Off where the table
    // would be too large: the whole-sample capacity bound below then stands in.)
    const int R = layout.num_ranks();
    if (static_cast<double>(R + 1) * (R + 1) * (max_tp + 1) <= mixed_table_limit) {
      R_ = R;
      mixed_.assign(static_cast<std::size_t>(R + 1) * (R + 1) * (max_tp + 1), MixedRef{});
      std::vector<int> ptype(types);
      for (int t = 0; t < types; ++t) ptype[t] = profiles.type_index(cluster.device_types()[t]);
      std::vector<int> rtype, share;
      std::vector<const Slices*> list;
      std::map<std::vector<const Slices*>, MixedLists::Entry*> interned;  // this estimator's: few locks
      for (int r = 0; r < R; ++r)
        for (int s = 2; r + s <= R; ++s) {
          if (layout.homogeneous(r, r + s)) continue;
          for (int tp = 1; tp <= std::min(s, max_tp); ++tp) {
            const int dp = s / tp;
            if (s % tp != 0 || dp / cp_ > b_ || dp > kMaxReplicas) continue;
            MixedRef& ref = mixed_[(static_cast<std::size_t>(r) * (R + 1) + s) * (max_tp + 1) + tp];
            if (dp % cp_ != 0) {
              ref.count = -1;  // no cp groups: the simulator refuses the stage
              continue;
            }
            // The data load balancer splits the micro-batch over the cp groups (each its first replica's
            // type, as PlanCostModel's replica shares); every replica takes its group's share.
            const StageGrid grid(r, dp, tp), groups = grid.cp_groups(cp_);
            rtype.assign(groups.dp, 0);
            share.assign(dp, 0);
            for (int g = 0; g < groups.dp; ++g) rtype[g] = ptype[layout.type_of(groups.rank(g, 0))];
            if (!partition_data(profiles, rtype.data(), Strategy{groups.dp, tp}, b_, share.data())) {
              ref.count = -1;  // the simulator fails too
              continue;
            }
            for (int d = dp - 1; d >= 0 && cp_ > 1; --d) share[d] = share[d / cp_];
            list.clear();
            for (int d = 0; d < dp; ++d) {
              ref.max_share = std::max(ref.max_share, share[d]);
              if (share[d] == 0) continue;
              const Slices* sl = &slices.at(layout.type_of(grid.rank(d, 0)), tp, share[d]);
              if (std::find(list.begin(), list.end(), sl) == list.end()) list.push_back(sl);
            }
            // Stages with the same replicas (as (type, share) slicings) share one list: one estimate.
            std::sort(list.begin(), list.end());
            MixedLists::Entry*& entry = interned[list];
            if (!entry) entry = mixed_lists.intern(list);
            ref.entry = entry;
            ref.count = static_cast<int>(list.size());
          }
        }
    } else {
      per_sample_best_.assign(static_cast<std::size_t>(types) * (max_tp + 1), {});
      for (int t = 0; t < types; ++t) {
        const int pt = profiles.type_index(cluster.device_types()[t]);
        for (int tp = 1; tp <= max_tp; ++tp)
          for (int bs = 1; bs <= b_; ++bs) {  // the files of bs <= b
            const LayerProfile* lp = profiles.find(pt, tp, bs);
            if (!lp) continue;
            std::vector<double>& v = per_sample_best_[t * (max_tp + 1) + tp];
            if (v.empty()) v.assign(spans(L_), kInf);
            for (int l = 0; l < L_; ++l)
              for (int e = l + 1; e <= L_; ++e) {
                double& best = v[span_index(L_, l, e)];
                best = std::min(best, lp->time(l, e) / bs);
              }
          }
      }
      run_end_.assign(R, R);
      for (int r = R - 2; r >= 0; --r) run_end_[r] = layout.type_of(r + 1) == layout.type_of(r) ? run_end_[r + 1] : r + 1;
    }
  }
  // Stage [r, r + s) at (s / tp, tp) on layers [l, e). `split`: f and b are bounded apart (else 0: a tp
  // group across nodes adds to both, and its slowest replica need not be the one estimated). The
  // accumulation bound is a measured one of a replica the stage has (the stage's is their largest)
  // when every setup trains every parameter (LoRA scales it down), else 0. t = infinity when a profile
  // the simulator needs is missing.
  StageEstimate estimate(int r, int s, int tp, int l, int e, bool homogeneous, bool split) const {
    StageEstimate x;
    if (cp_ > 1 && (s / tp) % cp_ != 0) {  // no cp groups: the simulator refuses the stage
      x.t = kInf;
      return x;
    }
    const int dp = groups(s / tp);  // the replicas (cp groups) the micro-batch is split over
    if (homogeneous) {
      // The slowest replica: ceil(b / dp) samples, exactly as the simulator slices them.
      const Slices& sl = slices_->at(layout_->type_of(r), tp, (b_ + dp - 1) / dp);
      if (sl.missing) {
        x.t = kInf;
        return x;
      }
      x.t = time(sl, l, e);
      double recomputed = recompute_ > 0 ? recompute_ * block_forward(sl, l, e, x.t) : 0.0;
      // The pass's time outside its layers (the ceil-share replica's, which the slowest is at least).
      const double out = outside(sl, l, e);
      // Uneven shares: the slowest replica may be one with a sample less (a share costed from
      // slices can take longer than a larger share with its own file): f, b and the recomputed forward
      // bound both.
      const int low = b_ / dp;
      const Slices* lo = b_ % dp != 0 && low > 0 ? &slices_->at(layout_->type_of(r), tp, low) : nullptr;
      if (lo && lo->missing) lo = nullptr;
      if (lo && recompute_ > 0) {
        const double t = time(*lo, l, e);
        recomputed = std::min(recomputed, recompute_ * block_forward(*lo, l, e, t));
      }
      if (split) {
        x.f = forward(sl, l, e, x.t);
        x.b = std::max(0.0, x.t - x.f);
        if (lo) {
          const double t = time(*lo, l, e), f = forward(*lo, l, e, t);
          x.f = std::min(x.f, f);
          x.b = std::min(x.b, std::max(0.0, t - f));
        }
        x.b += recomputed;
        x.f += out * forward_share_;
        x.b += out * (1 - forward_share_);
      }
      x.t += recomputed + out;
      x.a = accumulation(sl, l, e);
      return x;
    }
    if (!mixed_.empty()) {
      const MixedRef& ref = mixed_[(static_cast<std::size_t>(r) * (R_ + 1) + s) * (max_tp_ + 1) + tp];
      if (ref.count < 0) {
        x.t = kInf;
        return x;
      }
      // The slowest replica is one of these: each of f, b and its recomputed forward is at least the
      // smallest over them.
      double f_min = kInf, b_min = kInf, recomputed = kInf;
      for (const Slices* slp : ref.entry->list) {
        const Slices& sl = *slp;
        if (sl.missing) {
          x.t = kInf;
          return x;
        }
        const double t = time(sl, l, e);
        x.t = std::max(x.t, t + outside(sl, l, e));  // (each replica's total is at least this)
        const double f = forward(sl, l, e, t);
        f_min = std::min(f_min, f);
        b_min = std::min(b_min, std::max(0.0, t - f));
        recomputed = std::min(recomputed, recompute_ > 0 ? recompute_ * block_forward(sl, l, e, t) : 0.0);
        x.a = std::max(x.a, accumulation(sl, l, e));
      }
      if (ref.count > 0 && std::isfinite(recomputed)) x.t += recomputed;
      if (split && ref.count > 0) {
        x.f = f_min;
        x.b = b_min + recomputed;
      }
      return x;
    }
    // Mixed types: replica d (first rank StageGrid::rank(d, 0)) computes share_d samples in at least share_d x
    // its type's cheapest time per sample, and the shares sum to b. The replicas are counted per run
    // of ranks of one type (the layout's types are contiguous): O(types), not O(dp).
    // Shares are whole samples: in time T a replica of per-sample time w computes at most floor(T / w)
    // of them, so T is at least the least T with sum over replicas of floor(T / w) >= b. From the
    // fractional bound b / capacity up, breakpoint by breakpoint (each a T at which that sum still
    // falls short is itself a lower bound, so the walk may stop early).
    constexpr int kRuns = kMaxWalkRuns;  // (more: the fractional bound alone)
    // Under context parallelism a replica is a cp group (its first rank's type: the slowest of its ranks
    // takes at least that one's time) whose ranks each run share / cp sequences' work (or 1/cp of the
    // share's profile): at least share x that type's least time per sample / cp.
    double w[kRuns];
    int n[kRuns], runs = 0;
    double capacity = 0;
    const StageGrid grid = StageGrid(r, s / tp, tp).cp_groups(cp_);
    for (int q = r; q < r + s; q = run_end_[q]) {
      const int end = std::min(run_end_[q], r + s);
      const int replicas = grid.replicas_starting_in(q, end);
      if (replicas <= 0) continue;
      const std::vector<double>& v = per_sample_best_[layout_->type_of(q) * (max_tp_ + 1) + tp];
      if (v.empty()) continue;  // no file: infinite time per sample, no capacity
      const double best = cp_ == 1 ? v[span_index(L_, l, e)] : v[span_index(L_, l, e)] / cp_;
      if (std::isfinite(best) && best <= 0) return x;  // a free replica: no bound
      if (!std::isfinite(best)) continue;
      capacity += replicas / best;
      if (runs < kRuns) {
        w[runs] = best;
        n[runs++] = replicas;
      } else {
        runs = kRuns + 1;  // too many runs to walk: the fractional bound
      }
    }
    if (capacity <= 0) return x;
    x.t = runs <= kRuns ? whole_sample_walk(b_ / capacity, w, n, runs, b_) : b_ / capacity;
    return x;
  }
  // Which mixed-type stages share estimates: stages with the same entry have the same estimates;
  // nullptr where not known (homogeneous stages, no mixed table, or a missing profile).
  MixedLists::Entry* mixed_entry(int r, int s, int tp) const {
    if (mixed_.empty()) return nullptr;
    const MixedRef& ref = mixed_[(static_cast<std::size_t>(r) * (R_ + 1) + s) * (max_tp_ + 1) + tp];
    return ref.count > 0 ? ref.entry : nullptr;
  }
  // The stage's two p2p sends (stage()'s, less the scatter/gather's all-gather that setups without
  // sequence parallelism add: a lower bound): forward to rank r + s unless it ends the ranks,
  // backward to rank r - 1 unless it starts them. 0 where the largest share is not known here.
  void sends(int r, int s, int tp, bool homogeneous, double* forward, double* backward) const {
    int share = 0;
    if (homogeneous) {
      share = (b_ + groups(s / tp) - 1) / groups(s / tp);
    } else if (!mixed_.empty()) {
      share = std::max(0, mixed_[(static_cast<std::size_t>(r) * (R_ + 1) + s) * (max_tp_ + 1) + tp].max_share);
    }
    const int R = layout_->num_ranks();
    *forward = share > 0 && r + s < R ? cost_->p2p_ms(r + s - 1, r + s, share, tp, cp_) : 0.0;
    *backward = share > 0 && r > 0 ? cost_->p2p_ms(r, r - 1, share, tp, cp_) : 0.0;
  }
  // The context-parallel size, and the Megatron replicas (cp groups) of dp replicas: dp / cp.
  int cp() const { return cp_; }
  int groups(int dp) const { return cp_ == 1 ? dp : dp / cp_; }  // (no division on the plain search's path)

 private:
  struct MixedRef {
    MixedLists::Entry* entry = nullptr;
    int count = 0;  // count < 0: the load balancer lacks a profile
    int max_share = 0;
  };
  // A rank's profile time of these slices (under context parallelism, over their divisor, as stage()).
  static double time(const Slices& sl, int l, int e) {
    double t = 0;
    for (const LayerProfile* lp : sl.files) t += lp->time(l, e);
    return sl.divisor == 1 ? t : t / sl.divisor;
  }
  // A lower bound on the accumulation of a replica with these slices: its file's measured one when every
  // setup trains every parameter (LoRA scales it down), else, when its file does not measure it, the
  // least over the setups of what stage() derives from bytes.
  // What stage() adds to a replica of these slices per micro-batch outside layers [l, e): its own file's
  // fb_sync_ms by the layers' share of the model's parameter bytes, a tied table's copy on the head's
  // stage included (PlanCostModel's param_share), a hair less so that a sum in another order never
  // exceeds stage()'s.
  double outside(const Slices& sl, int l, int e) const {
    const double model = param_bytes_[L_];
    const double bytes = param_bytes_[e] - param_bytes_[l] + (l > 0 && e == L_ ? tied_copy_ : 0.0);
    return sl.fb_sync > 0 && model > 0 ? sl.fb_sync * (bytes / model) * (1 - 1e-12) : 0.0;
  }
  double accumulation(const Slices& sl, int l, int e) const {
    const LayerProfile* lp = sl.files[0];
    if (lp->has_grad_accumulation()) return full_params_ ? lp->accumulation_time(l, e) : 0.0;
    return (*unmeasured_acc_)[((static_cast<std::size_t>(sl.type) * (max_tp_ + 1) + sl.tp) * (L_ + 1) + l) * (L_ + 1) + e];
  }
  // The blocks' forward of these slices (what recomputation runs again), as stage() takes it: measured
  // (Metis layers 1 .. L - 2: not the embedding nor the head), else the forward's share of the blocks.
  double block_forward(const Slices& sl, int l, int e, double t) const {
    const int first = std::max(l, 1), end = std::min(e, L_ - 1);
    if (end <= first) return 0.0;
    if (!sl.forward_known) return forward(sl, l, e, t) * (end - first) / (e - l);
    double f = 0;
    for (const LayerProfile* lp : sl.files) f += lp->forward_time(first, end);
    return sl.divisor == 1 ? f : f / sl.divisor;
  }
  // The forward of these slices, as stage() splits it: measured, else the total's forward share.
  double forward(const Slices& sl, int l, int e, double t) const {
    if (!sl.forward_known) return t * forward_share_;
    double f = 0;
    for (const LayerProfile* lp : sl.files) f += lp->forward_time(l, e);
    return sl.divisor == 1 ? f : f / sl.divisor;
  }
  const RankLayout* layout_;
  const PlanCostModel* cost_;
  const ShareSlices* slices_;
  int b_, max_tp_, R_ = 0;
  int cp_ = 1;  // the setups' context-parallel size
  bool full_params_ = false;
  double forward_share_ = 1.0 / 3.0;
  double recompute_ = 0;  // PlanCostModel::least_recompute_fraction: the backward recomputes this much of the blocks' forward
  const std::vector<double>* unmeasured_acc_;
  std::vector<double> param_bytes_;  // [l]: the parameter bytes of Metis layers [0, l) (prefix sums)
  double tied_copy_ = 0;             // the tied word table's copy a piece [l > 0, L) keeps (tied_copy_bytes)
  int L_;
  std::vector<MixedRef> mixed_;  // [r][s][tp], mixed-type stages only
  // Where the whole-sample capacity bound stands in (no mixed_ table): [type][tp][span_index(L, l, e)], the
  // least time per sample of layers [l, e) over the type's files at tp of bs <= b (empty: no such file);
  // [r]: the first rank after r's run of ranks of one type.
  std::vector<std::vector<double>> per_sample_best_;
  std::vector<int> run_end_;
};


inline const StageEstimate* MixedLists::estimates(Entry* entry, const StageEstimator& est, int r, int s, int tp, int layers) {
  if (!entry) return nullptr;
  return entry->estimates.get(spans(layers), *budget_, [&](StageEstimate* v) {
    for (int l = 0; l < layers; ++l)
      for (int e = l + 1; e <= layers; ++e) v[span_index(layers, l, e)] = est.estimate(r, s, tp, l, e, false, true);
  });
}

// The estimates of homogeneous stages, [span_index(L, l, e)] each, shared by every (node order, m) group: such a
// stage's estimate (StageEstimator::estimate) depends only on its type, tp, its slowest replica's share
// of the micro-batch and whether the shares are uneven, not on the group or the stage's ranks. Each is
// computed once, by its first caller, within a memory budget (EstimateSlot: past it, get() returns
// nullptr and callers compute their own; while another thread fills it, they wait). Thread-safe.
class HomogeneousEstimates {
 public:
  HomogeneousEstimates(int types, int max_tp, int max_micro_batch, int layers, EstimateBudget& budget)
      : tps_(max_tp + 1), shares_(max_micro_batch + 1), L_(layers), budget_(&budget),
        slots_(new EstimateSlot[static_cast<std::size_t>(types) * tps_ * shares_ * 2]) {}
  // Stage [r, r + s), homogeneous of `type`, at (s / tp, tp) with micro-batch b: its estimates of
  // layers [l, e) at [span_index(layers, l, e)], or nullptr (over the budget). REQUIRES: tp <= max_tp,
  // b <= max_micro_batch, est.groups(s / tp) <= b (the estimator's cp divides s / tp).
  const StageEstimate* get(const StageEstimator& est, int type, int r, int s, int tp, int b) {
    const int dp = est.groups(s / tp), share = (b + dp - 1) / dp;
    const std::size_t k = ((static_cast<std::size_t>(type) * tps_ + tp) * shares_ + share) * 2 + (b % dp != 0 ? 1 : 0);
    return slots_[k].get(spans(L_), *budget_, [&](StageEstimate* v) {
      for (int l = 0; l < L_; ++l)
        for (int e = l + 1; e <= L_; ++e) v[span_index(L_, l, e)] = est.estimate(r, s, tp, l, e, true, true);
    });
  }

 private:
  int tps_, shares_, L_;
  EstimateBudget* budget_;
  std::unique_ptr<EstimateSlot[]> slots_;  // [type][tp][share][uneven]
};

}  // namespace hetplan::stage_estimates
