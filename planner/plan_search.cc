#include "planner/plan_search.h"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>

#include "planner/search.h"
#include "planner/periodic.h"
#include "planner/top_k.h"
#include "sim/data_load_balancer.h"
#include "sim/input_error.h"
#include "sim/plan_cost.h"
#include "sim/rank_layout.h"

namespace hetplan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using Clock = std::chrono::steady_clock;

// A plan's place in the results: cost, then a fixed order on plans, so that
// ties never depend on which thread found a plan first.
struct PlanKey {
  double cost = kInf;
  std::vector<int> order;  // node order, m, p, then (size, dp, layers) per stage
  bool operator<(const PlanKey& o) const {
    if (cost != o.cost) return cost < o.cost;
    return order < o.order;
  }
};

using TopPlans = TopK<PlanKey, SearchedPlan>;

// The K smallest costs found by any worker: the pruning threshold.
class SharedBound {
 public:
  explicit SharedBound(int k) : k_(k) {}
  double threshold() const { return threshold_.load(std::memory_order_relaxed); }
  void offer(double cost) {
    if (cost > threshold()) return;
    std::lock_guard<std::mutex> lock(mu_);
    costs_.insert(std::upper_bound(costs_.begin(), costs_.end(), cost), cost);
    if (static_cast<int>(costs_.size()) > k_) costs_.pop_back();
    // A hair above the K-th cost: a bound summed in another order than the cost itself may exceed a
    // plan's exact cost by a few ulps, and must not prune a plan that ties the K-th (ties are broken by
    // the plan order, not by which was found first).
    if (static_cast<int>(costs_.size()) == k_)
      threshold_.store(costs_.back() * (1 + 1e-9), std::memory_order_relaxed);
  }

 private:
  int k_;
  std::mutex mu_;
  std::vector<double> costs_;
  std::atomic<double> threshold_{kInf};
};

// What does not change within one node order.
struct OrderContext {
  int index = 0;                // lexicographic index of the node order
  std::vector<int> sequence;    // type indices
  std::unique_ptr<RankLayout> layout;
  std::unique_ptr<PlanCostModel> cost;
  int ranks = 0;
  std::vector<int> node_run;    // ranks from r to the end of r's node
  std::vector<int> block;       // position in `sequence` of rank r's type
  std::vector<std::vector<char>> tp_ok;  // [block][tp]: the type at that sequence position has tp profiles
  // tp_fail[tp][g]: the first rank g' >= g, g' = g mod tp, whose tp group [g', g' + tp) leaves its node
  // (ranks() if none): a stage [r, r + s) keeps its tp groups inside nodes iff tp_fail[tp][r] >= r + s.
  std::vector<std::vector<int>> tp_fail;
  // Ranks [r, r + s) hold one device type, and every type they hold has profiles at tp.
  bool homogeneous(int r, int s) const { return block[r] == block[r + s - 1]; }
  bool tp_profiled(int r, int s, int tp) const {
    for (int k = block[r]; k <= block[r + s - 1]; ++k)
      if (!tp_ok[k][tp]) return false;
    return true;
  }
  bool tp_inside_nodes(int r, int s, int tp) const { return tp_fail[tp][r] >= r + s; }
};

// Lower bounds on a stage's forward + backward time per micro-batch (ms),
// from the same profile look-ups the simulator makes, leaving out every term
// that only adds (the first and last stages' extras, recomputation, the
// sustained stretch, communication). Look-ups are resolved once, so an
// estimate is a few slice sums.
class StageEstimator {
 public:
  StageEstimator(const ProfileSet& profiles, const Cluster& cluster, const RankLayout& layout, int micro_batch,
                 int max_profiled_bs, int max_tp, bool full_params)
      : layout_(&layout), b_(micro_batch), max_tp_(max_tp), full_params_(full_params) {
    const int types = static_cast<int>(cluster.device_types().size());
    slices_.assign(static_cast<std::size_t>(types) * (max_tp + 1) * (b_ + 1), {});
    per_sample_.assign(static_cast<std::size_t>(types) * (max_tp + 1), {});
    for (int t = 0; t < types; ++t) {
      const int pt = profiles.type_index(cluster.device_types()[t]);
      for (int tp = 1; tp <= max_tp; ++tp) {
        // The simulator's slicing of a share: its own file, else its power-of-two slices.
        for (int share = 1; share <= b_; ++share) {
          Slices& sl = slices_[(static_cast<std::size_t>(t) * (max_tp + 1) + tp) * (b_ + 1) + share];
          if (const LayerProfile* lp = profiles.find(pt, tp, share)) {
            sl.files.push_back(lp);
            continue;
          }
          for (int bit = 30; bit >= 0; --bit) {
            const int slice = 1 << bit;
            if (!(share & slice)) continue;
            const LayerProfile* lp = slice <= max_profiled_bs ? profiles.find(pt, tp, slice) : nullptr;
            if (!lp) {
              sl.missing = true;
              sl.files.clear();
              break;
            }
            sl.files.push_back(lp);
          }
        }
        for (int bs = 1; bs <= b_; ++bs)
          if (const LayerProfile* lp = profiles.find(pt, tp, bs)) per_sample_[t * (max_tp + 1) + tp].push_back({lp, bs});
      }
    }
    // Mixed-type stages: the data load balancer's shares depend only on the replicas' types, tp and the
    // micro-batch, not on the layers, so each (first rank, size, tp) keeps its distinct (type, share)
    // replicas, and an estimate is its slowest replica's exact profile time. (Off where the table
    // would be too large: the per-sample capacity bound below then stands in.)
    const int R = layout.num_ranks();
    if (static_cast<double>(R + 1) * (R + 1) * (max_tp + 1) <= 2e6) {
      R_ = R;
      mixed_.assign(static_cast<std::size_t>(R + 1) * (R + 1) * (max_tp + 1), MixedRef{});
      std::vector<int> ptype(types);
      for (int t = 0; t < types; ++t) ptype[t] = profiles.type_index(cluster.device_types()[t]);
      std::vector<int> rtype, share;
      for (int r = 0; r < R; ++r)
        for (int s = 2; r + s <= R; ++s) {
          if (layout.homogeneous(r, r + s)) continue;
          for (int tp = 1; tp <= std::min(s, max_tp); ++tp) {
            const int dp = s / tp;
            if (s % tp != 0 || dp > b_ || dp > kMaxReplicas) continue;
            rtype.assign(dp, 0);
            share.assign(dp, 0);
            for (int d = 0; d < dp; ++d) rtype[d] = ptype[layout.type_of(r + d * tp)];
            MixedRef& ref = mixed_[(static_cast<std::size_t>(r) * (R + 1) + s) * (max_tp + 1) + tp];
            if (!partition_data(profiles, rtype.data(), Strategy{dp, tp}, b_, share.data())) {
              ref.count = -1;  // the simulator fails too
              continue;
            }
            ref.offset = static_cast<int>(mixed_pairs_.size());
            for (int d = 0; d < dp; ++d) {
              if (share[d] == 0) continue;
              const Slices* sl =
                  &slices_[(static_cast<std::size_t>(layout.type_of(r + d * tp)) * (max_tp + 1) + tp) * (b_ + 1) + share[d]];
              if (std::find(mixed_pairs_.begin() + ref.offset, mixed_pairs_.end(), sl) == mixed_pairs_.end())
                mixed_pairs_.push_back(sl);
            }
            ref.count = static_cast<int>(mixed_pairs_.size()) - ref.offset;
          }
        }
    }
  }
  // Stage [r, r + s) at (s / tp, tp) on layers [l, e). Sets *acc to a lower bound on its gradient
  // accumulation per micro-batch: a measured one of a replica the stage has (the stage's is their
  // largest) when every setup trains every parameter (LoRA scales it down), else 0.
  double estimate(int r, int s, int tp, int l, int e, bool homogeneous, double* acc) const {
    *acc = 0;
    const int dp = s / tp;
    if (homogeneous) {
      // The slowest replica: ceil(b / dp) samples, exactly as the simulator slices them;
      // infinity when a profile it needs is missing (the simulator then fails too).
      const Slices& sl = slices_[(static_cast<std::size_t>(layout_->type_of(r)) * (max_tp_ + 1) + tp) * (b_ + 1) +
                                 (b_ + dp - 1) / dp];
      if (sl.missing) return kInf;
      double t = 0;
      for (const LayerProfile* lp : sl.files) t += lp->time(l, e);
      if (full_params_ && sl.files[0]->has_grad_accumulation()) *acc = sl.files[0]->accumulation_time(l, e);
      return t;
    }
    if (!mixed_.empty()) {
      const MixedRef& ref = mixed_[(static_cast<std::size_t>(r) * (R_ + 1) + s) * (max_tp_ + 1) + tp];
      if (ref.count < 0) return kInf;
      double slowest = 0;
      for (int i = ref.offset; i < ref.offset + ref.count; ++i) {
        const Slices& sl = *mixed_pairs_[i];
        if (sl.missing) return kInf;
        double t = 0;
        for (const LayerProfile* lp : sl.files) t += lp->time(l, e);
        slowest = std::max(slowest, t);
        if (full_params_ && sl.files[0]->has_grad_accumulation())
          *acc = std::max(*acc, sl.files[0]->accumulation_time(l, e));
      }
      return slowest;
    }
    // Mixed types: replica d (ranks r + d tp ..) computes share_d samples in at least share_d x
    // its type's cheapest time per sample, and the shares sum to b.
    double w[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    double capacity = 0;
    for (int d = 0; d < dp; ++d) {
      const int type = layout_->type_of(r + d * tp);
      double& wt = w[type & 7];
      if (type >= 8 || wt < 0) {
        double best = kInf;
        for (const auto& [lp, bs] : per_sample_[type * (max_tp_ + 1) + tp]) best = std::min(best, lp->time(l, e) / bs);
        if (type >= 8) {
          if (std::isfinite(best) && best <= 0) return 0;
          if (std::isfinite(best)) capacity += 1 / best;
          continue;
        }
        wt = best;
      }
      if (std::isfinite(wt) && wt <= 0) return 0;  // a free replica: no bound
      if (std::isfinite(wt)) capacity += 1 / wt;
    }
    return capacity > 0 ? b_ / capacity : 0;
  }

 private:
  struct Slices {
    bool missing = false;
    std::vector<const LayerProfile*> files;
  };
  struct MixedRef {
    int offset = 0, count = 0;  // count < 0: the load balancer lacks a profile
  };
  const RankLayout* layout_;
  int b_, max_tp_, R_ = 0;
  bool full_params_ = false;
  std::vector<MixedRef> mixed_;               // [r][s][tp], mixed-type stages only
  std::vector<const Slices*> mixed_pairs_;    // each one's distinct (type, share) slicings
  std::vector<Slices> slices_;  // [type][tp][share]
  std::vector<std::vector<std::pair<const LayerProfile*, int>>> per_sample_;  // [type][tp]: files of bs <= b
};

// For one (node order, m): H[q][r][l], a lower bound on
//   max over the q stages j covering ranks [r, R) and layers [l, L) of
//   (sum over the stages before j of their forward + backward) + m x (j's forward + backward),
// minimised over every way to form those stages; infinity where none exists.
struct SuffixBound {
  std::unique_ptr<StageEstimator> est;  // this (node order, m)'s stage estimates
  int R = 0, L = 0, Q = 0;
  std::vector<double> h;
  std::vector<double> h_min;  // min over l' >= l of at(q, r, l'): the bound whatever layers the stage before takes
  // g[q][r][l]: a lower bound on the sum of the forward + backward of the q stages (the compute that
  // micro-batch m - 1 crosses on its way to the last stage and back); infinity where none exists.
  std::vector<double> g;
  double sum_at(int q, int r, int l) const {
    if (g.empty()) return 0;
    return g[(static_cast<std::size_t>(q) * (R + 1) + r) * (L + 1) + l];
  }
  double min_from(int q, int r, int l) const {
    if (h_min.empty()) return 0;
    return h_min[(static_cast<std::size_t>(q) * (R + 1) + r) * (L + 1) + l];
  }
  double at(int q, int r, int l) const {
    if (h.empty()) return 0;
    return h[(static_cast<std::size_t>(q) * (R + 1) + r) * (L + 1) + l];
  }
  double& at(int q, int r, int l) { return h[(static_cast<std::size_t>(q) * (R + 1) + r) * (L + 1) + l]; }
};

// Micro-batch m - 1's path through a stage with `after` stages after it: micro-batch 0 arrives, the
// stage runs its ops in order up to m - 1's forward, that forward crosses the stages after it and its
// backward comes back, and the stage runs m - 1's backward. Under 1F1B the stage has then run its m
// forwards and the `before_last` backwards before (m - 1)'s, besides m - 1's own; under GPipe it has
// run every forward, and the path can instead take micro-batch 0's backward back and then run all m
// backwards (`gpipe`).
int before_last_backwards(int after, int m) { return std::max(0, m - 1 - std::min(after, m)); }
// A lower bound on the compute (in units of one forward + backward) that path spends on the stage.
int path_multiple(Schedule schedule, int after, int m) {
  return schedule == Schedule::kGpipe ? m : 1 + before_last_backwards(after, m);
}

// One (node order, m, p) unit.
struct Unit {
  int order = 0, m = 1, p = 1;
  int bound = 0;       // index of the (node order, m) suffix bound
  int first_size = 1;  // GPUs of stage 0 (units this small balance the threads)
  int first_layers = 0;  // layers of stage 0; 0: any
};

struct Counters {
  long long enumerated = 0, pruned = 0, costed = 0, infeasible = 0;
};

// A worker's cache of stage costs. A stage's costs (every setup's) depend only on the (node order, m)
// unit group, its ranks, (dp, tp), layers, whether it is the first and the last stage, and its in-flight
// micro-batches (the memory of its activations): not on the stages around it, so the same stage met
// again under another pipeline depth or prefix is looked up. Direct-mapped, fixed size: a collision
// overwrites; no allocation after construction. Costs are a pure function of the key, so the cache
// never changes a result.
class StageCache {
 public:
  StageCache(int setups, std::size_t bytes) : setups_(setups) {
    std::size_t n = 1024;
    while (n * 2 * (sizeof(Key) + setups * sizeof(FastStageCost)) <= bytes) n *= 2;
    mask_ = n - 1;
    keys_.assign(n, Key{~0ull, ~0ull});
    vals_.resize(n * setups);
  }
  struct Key {
    unsigned long long a, b;
    bool operator==(const Key& o) const { return a == o.a && b == o.b; }
  };
  static Key key(int group, int r, int s, int tp, int l, int e, bool first, bool last, int in_flight) {
    return Key{(static_cast<unsigned long long>(group) << 32) | (static_cast<unsigned long long>(r) << 1) | (first ? 1u : 0u),
               (static_cast<unsigned long long>(s) << 40) | (static_cast<unsigned long long>(tp) << 32) |
                   (static_cast<unsigned long long>(l) << 22) | (static_cast<unsigned long long>(e) << 12) |
                   (static_cast<unsigned long long>(in_flight & 0x7ff) << 1) | (last ? 1u : 0u)};
  }
  // The slot for `k`: its costs if *hit, else where to store them.
  FastStageCost* slot(const Key& k, bool* hit) {
    const std::size_t i = index(k);
    *hit = keys_[i] == k;
    keys_[i] = k;
    return &vals_[i * setups_];
  }
  std::size_t index(const Key& k) const {
    unsigned long long h = k.a * 0x9e3779b97f4a7c15ull ^ (k.b + 0x632be59bd9b4e019ull + (k.a << 6));
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h & mask_;
  }
  // Drops `k` (a stage that failed: not cached, so its reason is recomputed).
  void invalidate(const Key& k) {
    keys_[index(k)] = Key{~0ull, ~0ull};
  }

 private:
  int setups_;
  std::size_t mask_ = 0;
  std::vector<Key> keys_;
  std::vector<FastStageCost> vals_;
};

struct Worker {
  Worker(int k, int setups) : top(k), cache(setups, static_cast<std::size_t>(24) << 20) {}
  StageCache cache;
  TopPlans top;
  Counters c;
  long long first_infeasible_unit = -1;
  std::string first_infeasible_reason;
  PipelineScratch scratch;
  // DFS state, indexed [stage][setup].
  std::vector<FastStageCost> stage_cost;    // [stage * setups + k]
  std::vector<double> fwd_prefix;           // [stage * setups + k]: forward chain to reach `stage`
  std::vector<double> c_prefix;             // every stage before `stage`: forward, sends, backward, accumulation
  std::vector<double> lb;                   // best lower bound so far along the path
  std::vector<double> extra;                // max over the stages before of what micro-batch m - 1's path
                                            // spends on that stage beyond its forward + backward
  std::vector<unsigned> mask;               // [stage]: setups still feasible
  std::vector<StageChoice> choice;
  std::vector<FastStageCost> leaf;          // [stage] for one setup
};

}  // namespace

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
  const auto t0 = Clock::now();
  const Cluster& cluster = *cluster_;
  const ProfileSet& profiles = *profiles_;
  const int L = profiles.num_layers();
  const int n_types = static_cast<int>(cluster.device_types().size());
  std::vector<TrainingSetup> setups = opt_.setups;
  if (setups.empty()) setups.push_back(sim_->options().setup);
  const int S = static_cast<int>(setups.size());
  const Schedule schedule = sim_->options().schedule;

  // Per device type: which tp degrees have profiles.
  int max_tp = 0;
  for (const auto& e : profiles.entries()) max_tp = std::max(max_tp, e.tp);
  max_tp = std::min(max_tp, opt_.max_tp);
  std::vector<std::vector<char>> type_tp(n_types, std::vector<char>(max_tp + 1, 0));
  for (int t = 0; t < n_types; ++t) {
    const int pt = profiles.type_index(cluster.device_types()[t]);
    for (const LayerProfile& e : profiles.entries()) {
      if (e.tp < 1 || e.tp > max_tp || e.bs < 1 || profiles.find(pt, e.tp, e.bs) != &e) continue;
      type_tp[t][e.tp] = 1;
    }
  }

  // Node orders, each with its layout and fast cost model.
  std::vector<int> perm(n_types);
  for (int t = 0; t < n_types; ++t) perm[t] = t;
  std::vector<OrderContext> orders;
  do {
    OrderContext o;
    o.index = static_cast<int>(orders.size());
    o.sequence = perm;
    o.layout = std::make_unique<RankLayout>(cluster, perm);
    o.cost = std::make_unique<PlanCostModel>(*sim_, *o.layout, setups);
    o.ranks = o.layout->num_ranks();
    o.node_run.assign(o.ranks + 1, 0);
    for (int r = o.ranks - 1; r >= 0; --r)
      o.node_run[r] = (r + 1 < o.ranks && o.layout->node_of(r + 1) == o.layout->node_of(r)) ? o.node_run[r + 1] + 1 : 1;
    o.block.resize(o.ranks);
    for (int r = 0; r < o.ranks; ++r)
      o.block[r] = static_cast<int>(std::find(perm.begin(), perm.end(), o.layout->type_of(r)) - perm.begin());
    o.tp_ok.assign(n_types + 1, std::vector<char>(max_tp + 1, 0));
    for (int k = n_types - 1; k >= 0; --k) {
      for (int tp = 1; tp <= max_tp; ++tp) o.tp_ok[k][tp] = type_tp[perm[k]][tp];
    }
    o.tp_fail.assign(max_tp + 1, std::vector<int>(o.ranks + 1, o.ranks));
    for (int tp = 1; tp <= max_tp; ++tp)
      for (int g = o.ranks - 1; g >= 0; --g) {
        const bool ok = o.node_run[g] >= tp;
        o.tp_fail[tp][g] = !ok ? g : (g + tp < o.ranks ? o.tp_fail[tp][g + tp] : o.ranks);
      }
    orders.push_back(std::move(o));
  } while (std::next_permutation(perm.begin(), perm.end()));

  const int R = cluster.num_devices();
  const int Q = std::min({L, R, opt_.max_stages});
  std::vector<int> ms;
  for (int m = opt_.gbs; m >= 1; --m)
    if (opt_.gbs % m == 0 && opt_.gbs / m <= opt_.max_micro_batch) ms.push_back(m);
  // Units also split by stage 0's layers where that keeps them few: one (p, m, first size) can
  // otherwise hold a fifth of the whole search, and the threads wait on it.
  double split_units = 0;
  for (int p = 2; p <= Q; ++p)
    split_units += static_cast<double>(ms.size()) * orders.size() * (R - p + 1) * (L - p + 1);
  const bool split_layers = split_units <= 2e6;
  std::vector<Unit> units;
  for (int p = 1; p <= Q; ++p)
    for (std::size_t mi = 0; mi < ms.size(); ++mi)
      for (const OrderContext& o : orders)
        for (int s0 = p == 1 ? R : 1; s0 <= R - (p - 1); ++s0) {
          const int bound_index = static_cast<int>(o.index * ms.size() + mi);
          if (p == 1 || !split_layers) {
            units.push_back(Unit{o.index, ms[mi], p, bound_index, s0, 0});
            continue;
          }
          for (int k0 = 1; k0 <= L - (p - 1); ++k0) units.push_back(Unit{o.index, ms[mi], p, bound_index, s0, k0});
        }

  // Suffix bounds, built once per (node order, m) by the first unit that needs one.
  std::vector<SuffixBound> bounds(orders.size() * ms.size());
  std::unique_ptr<std::once_flag[]> bound_once(new std::once_flag[bounds.size()]);
  bool full_params = true;  // every setup trains every parameter (accumulation is not scaled down)
  for (const TrainingSetup& st : setups) full_params = full_params && st.finetune == Finetune::kFull;
  auto build_bound = [&](const Unit& u, SuffixBound* h) {
    const OrderContext& o = orders[u.order];
    const int m = u.m, b = opt_.gbs / m;
    h->est = std::make_unique<StageEstimator>(profiles, cluster, *o.layout, b, sim_->options().max_profiled_bs, max_tp, full_params);
    const StageEstimator& est = *h->est;
    h->R = R;
    h->L = L;
    h->Q = Q;
    // Too large a table (hundreds of GPUs) or not used: 0 everywhere, a bound that never prunes.
    const double work = 0.25 * R * R * static_cast<double>(L) * L * Q;
    if (opt_.exhaustive || work > 4e9 || static_cast<double>(Q + 1) * (R + 1) * (L + 1) > 5e7) {
      h->h.clear();
      h->g.clear();
      h->R = R, h->L = L, h->Q = Q;
      return;
    }
    h->h.assign(static_cast<std::size_t>(Q + 1) * (R + 1) * (L + 1), kInf);
    h->g.assign(h->h.size(), kInf);
    auto g_at = [&](int q, int r, int l) -> double& {
      return h->g[(static_cast<std::size_t>(q) * (R + 1) + r) * (L + 1) + l];
    };
    for (int r = R - 1; r >= 0; --r)
      for (int s = 1; s <= R - r; ++s) {
        const bool homo = o.homogeneous(r, s);
        for (int tp = 1; tp <= std::min(s, max_tp); ++tp) {
          if (s % tp != 0 || s / tp > b || !o.tp_profiled(r, s, tp)) continue;
          if (!opt_.allow_cross_node_tp && !o.tp_inside_nodes(r, s, tp)) continue;
          for (int l = 0; l < L; ++l)
            for (int e = l + 1; e <= L; ++e) {
              const bool ends = r + s == R, all = e == L;
              if (ends != all) continue;
              double a;
              const double t = est.estimate(r, s, tp, l, e, homo, &a);
              if (!std::isfinite(t)) continue;
              const double busy = m * t + (m - 1) * a, csum = t + (m > 1 ? a : 0.0);
              if (ends) {
                h->at(1, r, l) = std::min(h->at(1, r, l), busy);
                g_at(1, r, l) = std::min(g_at(1, r, l), csum);
                continue;
              }
              const int q_max = std::min({Q, R - r, L - l});
              for (int q = 2; q <= q_max; ++q) {
                const double next = h->at(q - 1, r + s, e);
                if (!std::isfinite(next)) continue;
                const double next_sum = g_at(q - 1, r + s, e);
                double& cur = h->at(q, r, l);
                // The first of the q stages: all its work after micro-batch 0 arrives (m t), or the
                // path through it to micro-batch m - 1's forward, the stages after and back (a t + sum).
                cur = std::min(cur, std::max({busy, csum + next, (path_multiple(schedule, q - 1, m) - 1) * t + csum + next_sum}));
                double& sum = g_at(q, r, l);
                sum = std::min(sum, csum + next_sum);
              }
            }
        }
      }
  };
  auto finish_bound = [&](SuffixBound* h) {
    h->h_min = h->h;
    if (h->h.empty()) return;
    for (int q = 0; q <= Q; ++q)
      for (int r = 0; r <= R; ++r)
        for (int l = L - 1; l >= 0; --l) {
          double& cur = h->h_min[(static_cast<std::size_t>(q) * (R + 1) + r) * (L + 1) + l];
          cur = std::min(cur, h->h_min[(static_cast<std::size_t>(q) * (R + 1) + r) * (L + 1) + l + 1]);
        }
  };
  auto suffix_bound = [&](const Unit& u) -> const SuffixBound& {
    std::call_once(bound_once[u.bound], [&] {
      build_bound(u, &bounds[u.bound]);
      finish_bound(&bounds[u.bound]);
    });
    return bounds[u.bound];
  };

  SharedBound bound(opt_.top_k);
  std::atomic<bool> stop{false};
  std::atomic<int> stop_why{0};  // 1: time budget, 2: cancelled
  std::atomic<long long> units_done{0};
  std::atomic<long long> g_enumerated{0}, g_pruned{0}, g_costed{0};
  const bool use_bounds = !opt_.exhaustive;

  tbb::enumerable_thread_specific<Worker> workers([&] { return Worker(opt_.top_k, S); });
  std::optional<tbb::global_control> limit;
  if (opt_.threads > 0) limit.emplace(tbb::global_control::max_allowed_parallelism, opt_.threads);

  auto check_stop = [&]() {
    if (stop.load(std::memory_order_relaxed)) return true;
    if (opt_.cancel && opt_.cancel->load(std::memory_order_relaxed)) {
      stop_why.store(2);
      stop.store(true);
      return true;
    }
    if (opt_.time_budget_s > 0 &&
        std::chrono::duration<double>(Clock::now() - t0).count() > opt_.time_budget_s) {
      stop_why.store(1);
      stop.store(true);
      return true;
    }
    return false;
  };

  auto run_unit = [&](Worker& w, long long unit_index) {
    const Unit u = units[unit_index];
    const OrderContext& o = orders[u.order];
    const int p = u.p, m = u.m, b = opt_.gbs / m;
    w.stage_cost.resize(static_cast<std::size_t>(p) * S);
    w.fwd_prefix.assign(static_cast<std::size_t>(p + 1) * S, 0.0);
    w.c_prefix.assign(static_cast<std::size_t>(p + 1) * S, 0.0);
    w.lb.assign(static_cast<std::size_t>(p + 1) * S, 0.0);
    w.extra.assign(static_cast<std::size_t>(p + 1) * S, 0.0);
    w.mask.assign(p + 1, 0);
    w.choice.resize(p);
    w.leaf.resize(p);
    const unsigned all = S >= 32 ? 0xffffffffu : ((1u << S) - 1);
    w.mask[0] = all;
    long long since_check = 0;

    const SuffixBound& sb = suffix_bound(u);
    const bool cacheable = L < 1024 && max_tp < 256;
    const StageEstimator& est = *sb.est;

    auto leaf = [&]() {
      ++w.c.costed;
      double best = kInf;
      int best_setup = -1;
      const unsigned mk = w.mask[p];
      for (int k = 0; k < S; ++k) {
        if (!(mk & (1u << k))) continue;
        if (use_bounds && w.lb[static_cast<std::size_t>(p) * S + k] > std::min(best, bound.threshold())) continue;
        for (int i = 0; i < p; ++i) w.leaf[i] = w.stage_cost[static_cast<std::size_t>(i) * S + k];
        const double t = o.cost->iteration_ms(w.leaf.data(), p, m, schedule, &w.scratch);
        if (t < best) {
          best = t;
          best_setup = k;
        }
      }
      if (best_setup < 0) return;
      PlanKey key;
      key.cost = best;
      if (w.top.full() && best > w.top.kth().cost) return;
      key.order.reserve(3 + 3 * p);
      key.order.push_back(o.index);
      key.order.push_back(m);
      key.order.push_back(p);
      for (int i = 0; i < p; ++i) {
        key.order.push_back(w.choice[i].size);
        key.order.push_back(w.choice[i].st.dp);
        key.order.push_back(w.choice[i].layer_end - w.choice[i].layer_begin);
      }
      if (!w.top.wants(key)) return;
      SearchedPlan sp;
      PlanResult& pr = sp.plan;
      for (int t : o.sequence) pr.node_sequence.push_back(cluster.device_types()[t]);
      for (int i = 0; i < p; ++i) {
        pr.device_groups.push_back(w.choice[i].size);
        pr.strategies.push_back(w.choice[i].st);
        pr.layer_partition.push_back(w.choice[i].layer_begin);
      }
      pr.layer_partition.push_back(L);
      pr.batches = m;
      pr.num_repartition = 0;
      pr.cost = best;
      sp.setup = best_setup;
      w.top.insert(std::move(key), std::move(sp));
      bound.offer(best);
    };

    // Depth-first over stages: stage i starts at rank r and layer l.
    std::function<void(int, int, int)> dfs = [&](int i, int r, int l) {
      if (stop.load(std::memory_order_relaxed)) return;
      if (++since_check >= 1024) {
        since_check = 0;
        if (check_stop()) return;
      }
      if (i == p) {
        leaf();
        return;
      }
      const bool last = i == p - 1;
      const int rest = p - 1 - i;  // stages after this one
      const int s_max = i == 0 ? u.first_size : last ? R - r : R - r - rest;
      const int s_min = i == 0 ? u.first_size : last ? R - r : 1;
      const int k_max = i == 0 && u.first_layers > 0 ? u.first_layers : last ? L - l : L - l - rest;
      const int k_min = i == 0 && u.first_layers > 0 ? u.first_layers : last ? L - l : 1;
      // The prefix's bounds, the smallest over the settings still feasible.
      double c_min = kInf, lb_min = kInf, e_min = kInf;
      for (int q = 0; q < S; ++q)
        if (w.mask[i] & (1u << q)) {
          const std::size_t at = static_cast<std::size_t>(i) * S + q;
          c_min = std::min(c_min, w.c_prefix[at]);
          lb_min = std::min(lb_min, w.lb[at]);
          e_min = std::min(e_min, w.extra[at]);
        }
      const double own_path = path_multiple(schedule, rest, m);
      const int nb = before_last_backwards(rest, m);
      for (int s = s_min; s <= s_max; ++s) {
        // Whatever layers this stage takes, the ranks after it cannot finish in time.
        if (use_bounds && !last && c_min + sb.min_from(rest, r + s, l + k_min) > bound.threshold()) {
          ++w.c.enumerated;
          ++w.c.pruned;
          continue;
        }
        const bool homo = o.homogeneous(r, s);
        for (int tp = 1; tp <= std::min(s, max_tp); ++tp) {
          if (s % tp != 0) continue;
          const int dp = s / tp;
          if (dp > b) continue;  // every replica trains at least one sample
          if (!o.tp_profiled(r, s, tp)) continue;
          if (!opt_.allow_cross_node_tp && !o.tp_inside_nodes(r, s, tp)) continue;
          for (int k = k_min; k <= k_max; ++k) {
            ++w.c.enumerated;
            if (use_bounds) {
              const double thr = bound.threshold();
              double a;
              const double t = est.estimate(r, s, tp, l, l + k, homo, &a);
              const double csum = t + (m > 1 ? a : 0.0);
              // This stage's own compute only grows with k.
              if (std::max(lb_min, c_min + m * t + (m - 1) * a) > thr) {
                ++w.c.pruned;
                break;
              }
              if (!last && (c_min + csum + sb.at(rest, r + s, l + k) > thr ||
                            c_min + csum + std::max(e_min, (own_path - 1) * t) + sb.sum_at(rest, r + s, l + k) > thr)) {
                ++w.c.pruned;
                continue;
              }
            }
            StageChoice& c = w.choice[i];
            c.begin = r;
            c.size = s;
            c.st = Strategy{dp, tp};
            c.layer_begin = l;
            c.layer_end = l + k;
            FastStageCost* sc = &w.stage_cost[static_cast<std::size_t>(i) * S];
            std::string why;
            const StageCache::Key ck = cacheable ? StageCache::key(u.bound, r, s, tp, l, l + k, i == 0, last,
                                                                   in_flight_microbatches(schedule, p, i, m))
                                                 : StageCache::Key{};
            bool hit = false;
            FastStageCost* cached = cacheable ? w.cache.slot(ck, &hit) : nullptr;
            bool ok = true;
            if (hit) {
              std::copy(cached, cached + S, sc);
            } else {
              ok = o.cost->stage(c, i, p, m, b, sc, w.first_infeasible_unit < 0 ? &why : nullptr);
              if (cached) {
                if (ok) std::copy(sc, sc + S, cached);
                else *cached = FastStageCost(), w.cache.invalidate(ck);
              }
            }
            if (!ok) {
              ++w.c.infeasible;
              if (w.first_infeasible_unit < 0 || unit_index < w.first_infeasible_unit) {
                w.first_infeasible_unit = unit_index;
                w.first_infeasible_reason = why;
              }
              continue;
            }
            unsigned mk = w.mask[i];
            double bound_min = kInf;
            for (int q = 0; q < S; ++q) {
              if (!(mk & (1u << q))) continue;
              const FastStageCost& fc = sc[q];
              if (!fc.fits) {
                mk &= ~(1u << q);
                continue;
              }
              const std::size_t at = static_cast<std::size_t>(i) * S + q, next = at + S;
              const FastStageCost& first = i == 0 ? fc : w.stage_cost[q];
              const double tail0 = first.allreduce_ms + first.optimizer_ms;
              const double busy = fc.busy_ms(m);
              // Micro-batch 0 reaches this stage after the forward chain; the stage then runs all its
              // compute, then its all-reduce and optimizer; its last gradients go down the chain to
              // stage 0's all-reduce and optimizer.
              const double own = std::max(w.fwd_prefix[at] + busy + fc.allreduce_ms + fc.optimizer_ms,
                                          w.c_prefix[at] + fc.send_backward_ms + busy + tail0);
              double lb = std::max(w.lb[at], own);
              w.fwd_prefix[next] = w.fwd_prefix[at] + fc.forward_ms + fc.send_forward_ms;
              w.c_prefix[next] = w.c_prefix[at] + fc.forward_ms + fc.send_forward_ms + fc.backward_ms +
                                 (m > 1 ? fc.accumulation_ms : 0.0) + fc.send_backward_ms;
              // Micro-batch m - 1's path through this stage or one before it (see path_multiple).
              const double ex = schedule == Schedule::kGpipe
                                    ? (m - 1) * fc.forward_ms
                                    : (m - 1) * fc.forward_ms + nb * fc.backward_ms + std::max(0, nb - 1) * fc.accumulation_ms;
              w.extra[next] = std::max(w.extra[at], ex);
              if (!last && use_bounds)
                lb = std::max({lb, w.c_prefix[next] + sb.at(rest, r + s, l + k) + tail0,
                               w.c_prefix[next] + w.extra[next] + sb.sum_at(rest, r + s, l + k) + tail0});
              w.lb[next] = lb;
              bound_min = std::min(bound_min, lb);
            }
            if (mk == 0) {
              ++w.c.infeasible;
              if (w.first_infeasible_unit < 0 || unit_index < w.first_infeasible_unit) {
                for (int q = 0; q < S; ++q)
                  if ((w.mask[i] & (1u << q)) && sc[q].first_oom_rank >= 0) {
                    w.first_infeasible_unit = unit_index;
                    w.first_infeasible_reason =
                        "rank " + std::to_string(sc[q].first_oom_rank) + " runs out of memory (stage " +
                        std::to_string(i) + " of " + std::to_string(p) + ", " + std::to_string(m) +
                        " micro-batches)";
                    break;
                  }
              }
              continue;
            }
            if (use_bounds && bound_min > bound.threshold()) {
              ++w.c.pruned;
              continue;
            }
            w.mask[i + 1] = mk;
            dfs(i + 1, r + s, l + k);
            if (stop.load(std::memory_order_relaxed)) return;
          }
        }
      }
    };
    dfs(0, 0, 0);
  };

  // Progress from a side thread.
  Periodic reporter(opt_.progress ? std::function<void()>([&] {
    PlanSearchProgress pr;
    pr.units_done = units_done.load();
    pr.units_total = static_cast<long long>(units.size());
    pr.enumerated = g_enumerated.load();
    pr.pruned = g_pruned.load();
    pr.costed = g_costed.load();
    pr.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (pr.units_done > 0)
      pr.eta_s = pr.elapsed_s * static_cast<double>(pr.units_total - pr.units_done) / pr.units_done;
    const double thr = bound.threshold();
    pr.best_ms = std::isfinite(thr) ? thr : -1;
    opt_.progress(pr);
  }) : std::function<void()>());

  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, units.size(), 1), [&](const tbb::blocked_range<std::size_t>& range) {
    Worker& w = workers.local();
    for (std::size_t i = range.begin(); i != range.end(); ++i) {
      if (stop.load(std::memory_order_relaxed) || check_stop()) return;
      const Counters before = w.c;
      run_unit(w, static_cast<long long>(i));
      g_enumerated.fetch_add(w.c.enumerated - before.enumerated, std::memory_order_relaxed);
      g_pruned.fetch_add(w.c.pruned - before.pruned, std::memory_order_relaxed);
      g_costed.fetch_add(w.c.costed - before.costed, std::memory_order_relaxed);
      units_done.fetch_add(1, std::memory_order_relaxed);
    }
  });

  reporter.stop();

  PlanSearchResult result;
  TopPlans top(opt_.top_k);
  long long first_unit = -1;
  for (Worker& w : workers) {
    result.enumerated += w.c.enumerated;
    result.pruned += w.c.pruned;
    result.costed += w.c.costed;
    result.infeasible += w.c.infeasible;
    if (w.first_infeasible_unit >= 0 && (first_unit < 0 || w.first_infeasible_unit < first_unit)) {
      first_unit = w.first_infeasible_unit;
      result.first_infeasible_reason = w.first_infeasible_reason;
    }
    for (auto& e : w.top.items()) top.insert(std::move(e.key), std::move(e.item));
  }
  for (auto& e : top.items()) result.top.push_back(std::move(e.item));
  result.cut_short = stop.load();
  if (result.cut_short)
    result.cut_reason = stop_why.load() == 2 ? "interrupted" : "time budget of " + std::to_string(opt_.time_budget_s) + " s reached";
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

}  // namespace hetplan
