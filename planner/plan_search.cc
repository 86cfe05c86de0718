#include "planner/plan_search.h"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <type_traits>

#include "planner/search.h"
#include "planner/periodic.h"
#include "planner/spin_lock.h"
#include "planner/stage_estimator.h"
#include "planner/thread_limit.h"
#include "planner/top_k.h"
#include "planner/worker_start.h"
#include "sim/data_load_balancer.h"
#include "sim/input_error.h"
#include "sim/plan_cost.h"
#include "sim/rank_layout.h"

namespace hetplan {

namespace {

using namespace stage_estimates;

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
    std::lock_guard<SpinLock> lock(mu_);
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
  SpinLock mu_;  // taken where a plan is found: both threads find plans early in the search
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
  std::vector<double> block_capacity;  // [position in `sequence`]: the GPU memory of that type's ranks (bytes)
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
  // Rank r (0 <= r <= ranks) starts a node, or is the end of the ranks.
  bool node_start(int r) const { return r == 0 || r == ranks || node_run[r - 1] == 1; }
  // The least GPU memory of ranks [r, r + s).
  double capacity(int r, int s) const {
    double c = kInf;
    for (int k = block[r]; k <= block[r + s - 1]; ++k) c = std::min(c, block_capacity[k]);
    return c;
  }
};

// For one (node order, m): H[q][r][l], a lower bound on the longest of the
// paths below through the q stages covering ranks [r, R) and layers [l, L),
// each from micro-batch 0's arrival at the first of them to the last
// backward's send back out of it, minimised over every way to form those
// stages; infinity where none exists. The paths: for each stage j of them,
// the forward chain to j, then either all j's compute, or one of the two
// paths of PathCounts through j and the stages after it, then the backward
// chain back.
struct SuffixBound {
  std::unique_ptr<StageEstimator> est;  // this (node order, m)'s stage estimates
  int R = 0, L = 0, Q = 0;
  std::vector<double> h;
  std::vector<double> h_min;  // min over l' >= l of at(q, r, l'): the bound whatever layers the stage before takes
  // g[q][r][l]: a lower bound on micro-batch m - 1's round trip through the q stages (forwards, backwards
  // with accumulation, sends); g0 the same for micro-batch 0 (no accumulation). Infinity where none exists.
  std::vector<double> g, g0;
  // [r][l][q]: the dynamic program's inner loop runs over q, contiguous.
  std::size_t index(int q, int r, int l) const { return (static_cast<std::size_t>(r) * (L + 1) + l) * (Q + 1) + q; }
  // Entries q > Q are not in the table (it holds only the last stages where the whole one would be too
  // large): the throughput bound stands in for them.
  double sum_at(int q, int r, int l) const { return g.empty() || q == 0 || q > Q ? 0 : g[index(q, r, l)]; }
  double sum0_at(int q, int r, int l) const { return g0.empty() || q == 0 || q > Q ? 0 : g0[index(q, r, l)]; }
  double min_from(int q, int r, int l) const {
    if (h_min.empty() || q > Q) return capacity(r, std::max(l, L - q));  // each of the q stages takes a layer
    return h_min[index(q, r, l)];
  }
  double at(int q, int r, int l) const { return h.empty() || q > Q ? capacity(r, l) : h[index(q, r, l)]; }
  // A lower bound on at(q, r, l') for every l' <= l, non-increasing in l: the least k whose at(q, r, l + k)
  // can be small enough is found by bisection. The throughput bound is itself non-increasing in l; in the
  // table, h_env (built where only the last stages' entries are: a small table); else -infinity (no test).
  std::vector<double> h_env;
  double at_most_from_left(int q, int r, int l) const {
    if (h.empty() || q > Q) return cap_ranks.empty() ? -kInf : capacity(r, l);
    return h_env.empty() ? -kInf : h_env[index(q, r, l)];
  }
  // Without the table (too large): the throughput bound. Stage j's m forwards and backwards take at
  // least gbs x (its layers' least GPU-ms per sample) / (its ranks' GPUs); with each type's costs at
  // least kappa_type times a reference type's, layer by layer, the largest over the stages is at least
  // gbs x the reference's GPU-ms of layers [l, L) / (sum over ranks [r, R) of 1 / kappa): cap_layers
  // holds the reference's prefix sums, cap_ranks the suffix sums of 1 / kappa. 0 where not built.
  std::vector<double> cap_layers, cap_ranks;
  double cap_gbs = 0;
  double capacity(int r, int l) const {
    if (cap_ranks.empty() || l >= L) return 0;
    const double rate = cap_ranks[r];
    return rate > 0 && std::isfinite(rate) ? cap_gbs * (cap_layers[L] - cap_layers[l]) / rate : 0.0;
  }
  double& at(int q, int r, int l) { return h[index(q, r, l)]; }
  // Frees the tables and the estimator: once the group's units are done, the next group's tables reuse
  // the memory instead of faulting in fresh pages.
  void release() {
    for (std::vector<double>* v : {&h, &h_min, &h_env, &g, &g0}) std::vector<double>().swap(*v);
    est.reset();
  }
};

// Two paths through a stage j with `after` stages after it, each a chain of dependencies of the
// timeline (its ops in stage order, and the sends between stages), as counts of j's forwards,
// backwards and accumulations, and which micro-batch's round trip through the stages after j it takes:
//  * end: micro-batch 0 arrives, j runs its ops up to micro-batch m - 1's forward (under 1F1B: its m
//    forwards and the backwards its warm-up leaves before it), that forward crosses the stages after it
//    and its backward comes back (a round trip with accumulation), and j runs m - 1's backward;
//  * start: micro-batch 0 arrives, j runs its forward, it crosses the stages after and comes back (no
//    accumulation: micro-batch 0), and j runs every op from micro-batch 0's backward on: all m
//    backwards and the forwards its warm-up left after it (under GPipe the round trip can only start
//    after j's last forward, since every later stage also runs all its forwards first: all m).
struct PathCounts {
  int forwards = 0, backwards = 0, accumulations = 0;
};
PathCounts end_path(Schedule schedule, int after, int m) {
  if (schedule == Schedule::kGpipe) return {m, 1, m > 1 ? 1 : 0};
  const int nb = std::max(0, m - 1 - std::min(after, m));  // backwards before m - 1's forward
  return {m, nb + 1, nb >= 1 ? nb : (m > 1 ? 1 : 0)};
}
PathCounts start_path(Schedule schedule, int after, int m) {
  if (schedule == Schedule::kGpipe) return {m, m, m - 1};
  const int warmup = std::min(after, m);
  return {1 + m - std::min(warmup + 1, m), m, m - 1};
}

// x86-64 with glibc: also an AVX2 build of relax_row (4 doubles a vector instead of SSE2's 2; no FMA, so
// the same values), chosen by the CPU features glibc read at start-up. Not GCC's target_clones: its
// resolver runs libgcc's CPU detection in every process, a dozen CPUID instructions that cost about
// 10 us each in a VM (0.25 ms of each run's start-up, measured here).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__has_include)  // (clang 14 lacks _Bool in C++)
#if __has_include(<sys/platform/x86.h>)
#include <sys/platform/x86.h>
#define HETPLAN_AVX2_BUILD 1
#endif
#endif

// One step of the suffix bound's dynamic program (see SuffixBound) for a stage x with every q in
// [2, q_max]: hc/gc/g0c[q] are this stage's entries, hn/gn/g0n[q] the entries q - 1 of the stages after
// it (infinity where none exists, which leaves hc/gc/g0c alone). `coef` holds 8 rows of `stride` per-q
// coefficients: the end path's t, f, b, a, then the start path's. Written for the compiler to
// vectorise: distinct arrays, no branch (no value is NaN).
[[gnu::always_inline]] inline void relax_suffix(int q_max, const double* __restrict coef, int stride, StageEstimate x,
                                                double busy, double csum, double c0, double sends,
                                                const double* __restrict hn, const double* __restrict gn,
                                                const double* __restrict g0n, double* __restrict hc,
                                                double* __restrict gc, double* __restrict g0c) {
  const double* __restrict e_t = coef;
  const double* __restrict e_f = coef + stride;
  const double* __restrict e_b = coef + 2 * stride;
  const double* __restrict e_a = coef + 3 * stride;
  const double* __restrict s_t = coef + 4 * stride;
  const double* __restrict s_f = coef + 5 * stride;
  const double* __restrict s_b = coef + 6 * stride;
  const double* __restrict s_a = coef + 7 * stride;
  const double t = x.t, f = x.f, b = x.b, a = x.a;
  for (int q = 2; q <= q_max; ++q) {
    const double end = e_t[q] * t + e_f[q] * f + e_b[q] * b + e_a[q] * a + sends + gn[q];
    const double start = s_t[q] * t + s_f[q] * f + s_b[q] * b + s_a[q] * a + sends + g0n[q];
    const double via = csum + hn[q];
    const double m1 = busy < via ? via : busy;
    const double m2 = end < start ? start : end;
    const double v = m1 < m2 ? m2 : m1;
    hc[q] = v < hc[q] ? v : hc[q];
    const double gv = csum + gn[q];
    gc[q] = gv < gc[q] ? gv : gc[q];
    const double g0v = c0 + g0n[q];
    g0c[q] = g0v < g0c[q] ? g0v : g0c[q];
  }
}

// The steps of the suffix bound's dynamic program for a stage at one (dp, tp) starting at one layer l
// and ending at each layer e in [e_begin, e_end) in turn (xs[e - e_begin] its estimate; a stage with no
// stage after it is not here): H, G, G0 are the tables, `next0` the index of (q = -1, the rank after
// the stage, layer 0), so that the entries q - 1 after a stage ending at e start at next0 + e (Q + 1);
// hc/gc/g0c the stage's own entries. A stage whose busy time is above `threshold` ends the walk (its
// time and accumulation only grow with its layers); one with no estimate (a missing profile) is skipped.
// One call per row, so the dynamic program's inner loops are all in the AVX2 build.
[[gnu::always_inline]] inline void relax_row_body(const StageEstimate* xs, int e_begin, int e_end, int q_cap, int L,
                                                  int Q, int m, double sf, double sb, double threshold,
                                                  const double* coef, const double* H, const double* G,
                                                  const double* G0, std::size_t next0, double* hc, double* gc,
                                                  double* g0c) {
  const double md = m, m1 = m - 1, acc = m > 1 ? 1.0 : 0.0;
  for (int e = e_begin; e < e_end; ++e) {
    const StageEstimate x = xs[e - e_begin];
    if (!std::isfinite(x.t)) continue;
    const double busy = md * x.t + m1 * x.a + sb;
    if (busy > threshold) break;
    const double c0 = x.t + sf + sb, csum = c0 + acc * x.a;
    // (The stages after it number at most min(R - r - s, L - e).)
    const int q_max = std::min(q_cap, 1 + L - e);
    const std::size_t next = next0 + static_cast<std::size_t>(e) * (Q + 1);
    relax_suffix(q_max, coef, Q + 1, x, busy, csum, c0, sf + sb, H + next, G + next, G0 + next, hc, gc, g0c);
  }
}

using RelaxRow = decltype(&relax_row_body);
#define HETPLAN_RELAX_ROW_ARGS                                                                                   \
  const StageEstimate *xs, int e_begin, int e_end, int q_cap, int L, int Q, int m, double sf, double sb,       \
      double threshold, const double *coef, const double *H, const double *G, const double *G0, std::size_t next0, \
      double *hc, double *gc, double *g0c
void relax_row_plain(HETPLAN_RELAX_ROW_ARGS) {
  relax_row_body(xs, e_begin, e_end, q_cap, L, Q, m, sf, sb, threshold, coef, H, G, G0, next0, hc, gc, g0c);
}
#ifdef HETPLAN_AVX2_BUILD
__attribute__((target("avx2"))) void relax_row_avx2(HETPLAN_RELAX_ROW_ARGS) {
  relax_row_body(xs, e_begin, e_end, q_cap, L, Q, m, sf, sb, threshold, coef, H, G, G0, next0, hc, gc, g0c);
}
#endif
#undef HETPLAN_RELAX_ROW_ARGS
// The build of relax_row for this CPU.
RelaxRow pick_relax_row() {
#ifdef HETPLAN_AVX2_BUILD
  if (CPU_FEATURE_ACTIVE(AVX2)) return relax_row_avx2;
#endif
  return relax_row_plain;
}

// One (node order, m, p) unit.
struct Unit {
  int order = 0, m = 1, p = 1;
  int bound = 0;       // index of the (node order, m) suffix bound
  int first_size = 1;  // GPUs of stage 0 (units this small balance the threads)
  int first_layers = 0;  // layers of stage 0; 0: any
  long long ordinal = 0;  // place in the search's order of units
};

struct Counters {
  long long enumerated = 0, pruned = 0, costed = 0, infeasible = 0;
  long long units = 0;  // work units finished
};

// A worker's cache of stage costs. A stage's costs (every setup's) depend only on the (node order, m)
// unit group, its ranks, (dp, tp), layers, whether it is the first and the last stage, and its in-flight
// micro-batches (the memory of its activations): not on the stages around it, so the same stage met
// again under another pipeline depth or prefix is looked up. Direct-mapped, fixed size: a collision
// overwrites; no allocation after construction. Costs are a pure function of the key, so the cache
// never changes a result.
class StageCache {
 public:
  // Slots in zeroed memory from the system (calloc): a page is only backed once a stage is stored on
  // it, so a search that meets few stages does not pay for the whole table.
  StageCache(int setups, std::size_t bytes) : setups_(setups) {
    std::size_t n = 1024;
    while (n * 2 * (sizeof(Key) + setups * sizeof(FastStageCost)) <= bytes) n *= 2;
    mask_ = n - 1;
    keys_.reset(static_cast<Key*>(std::calloc(n, sizeof(Key))));
    vals_.reset(static_cast<FastStageCost*>(std::calloc(n * setups, sizeof(FastStageCost))));
    if (!keys_ || !vals_) throw std::bad_alloc();
  }
  // A stage's key; never all zero (s >= 1), the empty slot's.
  struct Key {
    unsigned long long a, b;
    bool operator==(const Key& o) const { return a == o.a && b == o.b; }
  };
  static_assert(std::is_trivially_copyable_v<Key> && std::is_trivially_copyable_v<FastStageCost>);
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
  void invalidate(const Key& k) { keys_[index(k)] = Key{0, 0}; }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  int setups_;
  std::size_t mask_ = 0;
  std::unique_ptr<Key[], Free> keys_;
  std::unique_ptr<FastStageCost[], Free> vals_;
};

struct Worker {
  Worker(int k, int setups) : cache(setups, static_cast<std::size_t>(2) << 20), top(k) {}
  StageCache cache;
  TopPlans top;
  Counters c;
  Counters published;     // the part of c added to the shared (progress) counters
  long long since_check = 0;  // units and enumerations since the stop flags and the clock were read
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
  std::vector<double> c0_prefix;            // c_prefix without accumulation (micro-batch 0's passes)
  std::vector<double> xstart;               // max over the stages before of their start path less c0_prefix
                                            // at the stage after them
  std::vector<unsigned> mask;               // [stage]: setups still feasible
  std::vector<StageChoice> choice;
  std::vector<FastStageCost> leaf;          // [stage] for one setup
};

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
  const auto t0 = Clock::now();
  // The time budget covers the set-up too (its tables grow with layers^2 x tp): past it, the set-up's
  // loops stop early and the phases below find the search stopped. Progress is reported meanwhile.
  auto out_of_time = [&] {
    return opt_.time_budget_s > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > opt_.time_budget_s;
  };
  auto setup_progress = std::make_unique<Periodic>(opt_.progress ? std::function<void()>([&] {
    PlanSearchProgress pr;  // units_total 0: still setting up
    pr.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
    opt_.progress(pr);
  }) : std::function<void()>());
  const RelaxRow relax_row = pick_relax_row();
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
    o.block_capacity.assign(n_types, kInf);
    for (int r = 0; r < o.ranks; ++r) o.block_capacity[o.block[r]] = o.cost->rank_capacity_bytes(r);
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

  // Without cross-node tp, no tp above the largest node can be used: the tables below stop there.
  if (!opt_.allow_cross_node_tp) {
    int largest_node = 1;
    for (int x : orders[0].node_run) largest_node = std::max(largest_node, x);
    max_tp = std::min(max_tp, largest_node);
  }
  const int R = cluster.num_devices();
  const bool whole_nodes = whole_node_stages(opt_.stage_boundaries, R);
  const int Q = std::min({L, whole_nodes ? static_cast<int>(cluster.nodes().size()) : R, opt_.max_stages});
  std::vector<int> ms;
  for (int m = opt_.gbs; m >= 1; --m)
    if (opt_.gbs % m == 0 && opt_.gbs / m <= opt_.max_micro_batch) ms.push_back(m);
  const int max_share = ms.empty() ? 1 : opt_.gbs / ms.back();
  // The slicings grow with the largest micro-batch: refuse, naming the input, what would exhaust memory.
  const double slicings = static_cast<double>(n_types) * (max_tp + 1) * (max_share + 1);
  if (slicings > 4194304.0)
    throw InputError("--gbs " + std::to_string(opt_.gbs) + ": the search keeps the profile slicings of every share of "
                     "a micro-batch of up to " + std::to_string(max_share) + " sequences for " +
                     std::to_string(n_types) + " GPU type(s) and tp up to " + std::to_string(max_tp) + ", " +
                     std::to_string(static_cast<long long>(slicings)) + " entries, past the 4194304 it can hold "
                     "(use a smaller --gbs)");
  // Units also split by stage 0's layers where that keeps them few: one (p, m, first size) can
  // otherwise hold a fifth of the whole search, and the threads wait on it.
  double split_units = 0;
  for (int p = 2; p <= Q; ++p)
    split_units += static_cast<double>(ms.size()) * orders.size() * (R - p + 1) * (L - p + 1);
  const bool split_layers = split_units <= 2e6;
  // Group (node order, m) g = order * ms.size() + m's index. A unit's place in the search's order of
  // units is by p, m, node order, stage 0's size and layers (the first infeasible one found gives the
  // reason reported).
  const int n_ms = static_cast<int>(ms.size()), n_orders = static_cast<int>(orders.size());
  // A group's units of p stages: stage 0's size (all ranks for p = 1), and its layers where split.
  auto units_per_group = [&](int p) -> long long {
    return p == 1 ? 1 : static_cast<long long>(R - p + 1) * (split_layers ? L - p + 1 : 1);
  };
  // The unit (p, m's index, node order, stage 0's size and layers; k0 = 0: any), with its place in the
  // search's order of units, by those fields in turn (the first infeasible one found gives the reason
  // reported). Group g = order * n_ms + m's index.
  auto make_unit = [&](int p, int mi, int order, int s0, int k0) {
    const long long base = ((static_cast<long long>(p) * n_ms + mi) * n_orders + order) * (R + 1) + s0;
    return Unit{order, ms[mi], p, order * n_ms + mi, s0, k0, base * (L + 1) + k0};
  };
  // Group g's units from its first of p stages on, in the search's order: unit j of them (j < the sum
  // of units_per_group over the p that follow). Made when run, never listed.
  auto group_unit = [&](int g, int p, long long j) {
    while (j >= units_per_group(p)) j -= units_per_group(p++);
    const int s0 = p == 1 ? R : 1 + static_cast<int>(split_layers ? j / (L - p + 1) : j);
    const int k0 = p == 1 || !split_layers ? 0 : 1 + static_cast<int>(j % (L - p + 1));
    return make_unit(p, g % n_ms, g / n_ms, s0, k0);
  };
  // The unit after u in its group's order (group_unit(g, p, j + 1) for u = group_unit(g, p, j)).
  auto next_in_group = [&](const Unit& u) {
    int p = u.p, s0 = u.first_size, k0 = u.first_layers;
    if (p > 1 && split_layers && k0 < L - p + 1) {
      ++k0;
    } else if (p > 1 && s0 < R - (p - 1)) {
      ++s0;
      k0 = split_layers ? 1 : 0;
    } else {
      ++p;
      s0 = 1;
      k0 = split_layers ? 1 : 0;
    }
    return make_unit(p, u.bound % n_ms, u.order, s0, k0);
  };
  auto group_unit_count = [&](int p_begin, int p_end) {
    long long n = 0;
    for (int p = p_begin; p <= std::min(p_end, Q); ++p) n += units_per_group(p);
    return n;
  };
  // Index in the search's order of the first unit of each p; the last entry is the number of units.
  std::vector<long long> p_first(Q + 2, 0);
  for (int p = 1; p <= Q; ++p) p_first[p + 1] = p_first[p] + static_cast<long long>(n_ms) * n_orders * units_per_group(p);
  const long long units_total = p_first[Q + 1];

  // [type][tp][l][e]: PlanCostModel::unmeasured_accumulation_ms of the type's profiles (any order's model:
  // it does not depend on the layout), for the estimates of replicas whose files do not measure it.
  // Filled with state_lb below, in parallel.
  std::vector<double> unmeasured_acc(static_cast<std::size_t>(n_types) * (max_tp + 1) * (L + 1) * (L + 1), 0.0);

  // The throughput bound's per-type data (SuffixBound::capacity): per type and layer, the least GPU-ms
  // per sample over its files (tp x time / bs: a replica of tp GPUs runs a share of its slices, each at
  // least its bs x that); kappa[type], the least ratio to type 0's over the layers; and type 0's prefix
  // sums. Built only where the per-rank table is too large.
  struct Throughput {
    std::vector<double> kappa, reference;
  } throughput;
  // Stage boundaries: ranks, or node starts only (the table's rows at other ranks are then never filled
  // nor read).
  const double positions = whole_nodes ? static_cast<double>(cluster.nodes().size()) : R;
  const double table_work = 0.25 * positions * positions * static_cast<double>(L) * L * Q;
  const bool table_fits = table_work <= opt_.suffix_table_limit && static_cast<double>(Q + 1) * (R + 1) * (L + 1) <= 5e7;
  if (!opt_.exhaustive && !opt_.allow_cross_node_tp && !table_fits) {
    std::vector<std::vector<double>> per_layer(n_types, std::vector<double>(L, kInf));
    for (int t = 0; t < n_types; ++t) {
      const int pt = profiles.type_index(cluster.device_types()[t]);
      for (const LayerProfile& e : profiles.entries()) {
        if (e.tp < 1 || e.tp > max_tp || e.bs < 1 || profiles.find(pt, e.tp, e.bs) != &e) continue;
        for (int l = 0; l < L; ++l) per_layer[t][l] = std::min(per_layer[t][l], e.tp * e.time(l, l + 1) / e.bs);
      }
    }
    bool known = true;
    for (int t = 0; t < n_types; ++t)
      for (int l = 0; l < L; ++l) known = known && std::isfinite(per_layer[t][l]);
    if (known) {
      throughput.kappa.assign(n_types, kInf);
      for (int t = 0; t < n_types; ++t)
        for (int l = 0; l < L; ++l)
          if (per_layer[0][l] > 0) throughput.kappa[t] = std::min(throughput.kappa[t], per_layer[t][l] / per_layer[0][l]);
      throughput.reference.assign(L + 1, 0.0);
      for (int l = 0; l < L; ++l) throughput.reference[l + 1] = throughput.reference[l] + per_layer[0][l];
      for (double& k : throughput.kappa)
        if (!std::isfinite(k)) k = 0;  // every layer free on type 0: no bound
    }
  }

  // The suffix tables leave out stages that cannot fit memory under any setup: state_lb[tp][j][l][e] is
  // PlanCostModel::state_bytes_lower_bound at dp = 2^j (any node order's model: it does not depend on
  // the layout), a lower bound for every dp <= 2^j since the states only shrink as dp grows.
  const int dp_buckets = [&] {
    int j = 0;
    while ((1 << j) < R) ++j;
    return j + 1;
  }();
  std::vector<double> state_lb;
  auto state_lb_at = [&](int tp, int dp, int l) {  // row over e of [tp][bucket of dp][l]
    int j = 0;
    while ((1 << j) < dp) ++j;
    return state_lb.data() + ((static_cast<std::size_t>(tp) * dp_buckets + j) * (L + 1) + l) * (L + 1);
  };
  if (opt_.on_parallel_start) opt_.on_parallel_start();  // the first parallel work follows
  if (!opt_.exhaustive) {
    // The two tables' rows, one task each: [type][tp] of unmeasured_acc, then [tp][dp bucket] of
    // state_lb (a few hundred microseconds in all, before any group can start). state_lb only prunes:
    // beyond 2^25 entries (256 MB; thousands of layers) it is left out, as the exhaustive search does.
    const double state_lb_entries = static_cast<double>(max_tp + 1) * dp_buckets * (L + 1) * (L + 1);
    if (state_lb_entries <= 33554432.0) state_lb.assign(static_cast<std::size_t>(state_lb_entries), 0.0);
    const int acc_rows = n_types * max_tp;
    tbb::parallel_for(0, acc_rows + (state_lb.empty() ? 0 : max_tp * dp_buckets), [&](int i) {
      if (i < acc_rows) {
        const int t = i / max_tp, tp = 1 + i % max_tp;
        const int pt = profiles.type_index(cluster.device_types()[t]);
        for (int l = 0; l < L && !out_of_time(); ++l)
          for (int e = l + 1; e <= L; ++e)
            unmeasured_acc[((static_cast<std::size_t>(t) * (max_tp + 1) + tp) * (L + 1) + l) * (L + 1) + e] =
                orders[0].cost->unmeasured_accumulation_ms(pt, tp, l, e);
        return;
      }
      const int tp = 1 + (i - acc_rows) / dp_buckets, j = (i - acc_rows) % dp_buckets;
      bool profiled = false;
      for (int t = 0; t < n_types; ++t) profiled = profiled || type_tp[t][tp];
      if (!profiled) return;
      for (int l = 0; l < L && !out_of_time(); ++l) {
        double* row = state_lb_at(tp, 1 << j, l);
        for (int e = l + 1; e <= L; ++e) row[e] = orders[0].cost->state_bytes_lower_bound(tp, 1 << j, l, e);
      }
    });
  }

  std::atomic<bool> stop{false};
  std::atomic<int> stop_why{0};  // 1: time budget, 2: cancelled
  std::atomic<long long> units_done{0};
  std::atomic<long long> g_enumerated{0}, g_pruned{0}, g_costed{0};
  const bool use_bounds = !opt_.exhaustive;

  tbb::enumerable_thread_specific<Worker> workers([&] { return Worker(opt_.top_k, S); });

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

  // Suffix bounds, one per (node order, m), built in two passes (see the phases below): first the
  // entries of one stage (q = 1: stages that end the ranks), then the deeper ones.
  SharedBound bound(opt_.top_k);
  std::vector<SuffixBound> bounds(orders.size() * ms.size());
  bool full_params = true;  // every setup trains every parameter (accumulation is not scaled down)
  for (const TrainingSetup& st : setups) full_params = full_params && st.finetune == Finetune::kFull;
  // Shared by the groups: slicings up to the largest micro-batch, and (for the tables' path) the estimates
  // of homogeneous stages and of mixed stages' replica lists, each within a memory budget.
  const ShareSlices share_slices(profiles, cluster, max_tp, max_share, sim_->options().max_profiled_bs);
  EstimateBudget estimate_budget(std::size_t{256} << 20);
  MixedLists mixed_lists(estimate_budget);
  std::optional<HomogeneousEstimates> homogeneous;
  if (!opt_.exhaustive && table_fits) homogeneous.emplace(n_types, max_tp, opt_.gbs, L, estimate_budget);
  // The estimates kept for stage [r, r + s) at (s / tp, tp) with micro-batch b, where its tp groups stay
  // inside nodes and the per-rank tables are built; else nullptr (callers compute their own).
  auto kept_estimates = [&](const OrderContext& o, const StageEstimator& est, int r, int s, int tp, int b, bool homo,
                            bool inside) -> const StageEstimate* {
    if (!homogeneous || !inside) return nullptr;
    return homo ? homogeneous->get(est, o.layout->type_of(r), r, s, tp, b)
                : mixed_lists.estimates(est.mixed_entry(r, s, tp), est, r, s, tp, L);
  };
  // `last_stages`: create the estimator and the table and fill its entries q = 1 (exact); else its
  // entries q >= 2. These leave out every stage whose own compute exceeds the pruning threshold at the
  // time: a plan with such a stage costs more than the threshold (which only falls), and the entries
  // stay lower bounds on every plan made of the stages kept, which is what pruning needs.
  auto build_bound = [&](int g, SuffixBound* h, bool last_stages) {
    const OrderContext& o = orders[g / n_ms];
    const int m = ms[g % n_ms], b = opt_.gbs / m;
    if (last_stages) {
      h->est = std::make_unique<StageEstimator>(profiles, cluster, *o.layout, *o.cost, share_slices, mixed_lists, b,
                                                max_tp, full_params, sim_->options().backward_share, unmeasured_acc, L,
                                                opt_.mixed_table_limit);
      h->R = R;
      h->L = L;
      h->Q = Q;
      if (opt_.exhaustive) return;
      // Too large a table (hundreds of GPUs): the throughput bound (SuffixBound::capacity) where it was
      // built stands in for the entries q >= 2 (not built: 0, a bound that never prunes); the entries
      // q = 1, one per (rank, layer), are still built below.
      if (!table_fits && !throughput.kappa.empty()) {
        h->cap_gbs = opt_.gbs;
        h->cap_layers = throughput.reference;
        h->cap_ranks.assign(R + 1, 0.0);
        for (int r = R - 1; r >= 0; --r) {
          const double k = throughput.kappa[o.layout->type_of(r)];
          h->cap_ranks[r] = h->cap_ranks[r + 1] + (k > 0 ? 1 / k : kInf);
        }
      }
      // Only the entries q <= 1 for now (a small table): the full one comes with the deeper entries.
      h->Q = std::min(Q, 1);
      h->h.assign(static_cast<std::size_t>(h->Q + 1) * (R + 1) * (L + 1), kInf);
      h->g.assign(h->h.size(), kInf);
      h->g0.assign(h->h.size(), kInf);
    } else if (h->h.empty()) {
      return;
    } else if (h->Q < Q) {
      // The full table, with the entries q <= 1 computed before.
      const int q_small = h->Q;
      std::vector<double> hs = std::move(h->h), gs = std::move(h->g), g0s = std::move(h->g0);
      h->Q = Q;
      h->h.assign(static_cast<std::size_t>(Q + 1) * (R + 1) * (L + 1), kInf);
      h->g.assign(h->h.size(), kInf);
      h->g0.assign(h->h.size(), kInf);
      for (int r = 0; r <= R; ++r)
        for (int l = 0; l <= L; ++l)
          for (int q = 0; q <= q_small; ++q) {
            const std::size_t from = (static_cast<std::size_t>(r) * (L + 1) + l) * (q_small + 1) + q, to = h->index(q, r, l);
            h->h[to] = hs[from];
            h->g[to] = gs[from];
            h->g0[to] = g0s[from];
          }
    }
    const StageEstimator& est = *h->est;
    // Per q (stages from this one to the last), each path's counts as coefficients of t, f, b and a
    // (StageEstimate::runs), so that the inner loop over q is straight-line arithmetic.
    std::vector<double> coef(static_cast<std::size_t>(8) * (Q + 1), 0.0);
    double* e_t = coef.data();  // see relax_suffix
    double* e_f = e_t + (Q + 1);
    double* e_b = e_f + (Q + 1);
    double* e_a = e_b + (Q + 1);
    double* s_t = e_a + (Q + 1);
    double* s_f = s_t + (Q + 1);
    double* s_b = s_f + (Q + 1);
    double* s_a = s_b + (Q + 1);
    auto set_coef = [](const PathCounts& c, double* t, double* f, double* b, double* a) {
      const int lo = std::min(c.forwards, c.backwards);
      *t = lo;
      *f = c.forwards - lo;
      *b = c.backwards - lo;
      *a = c.accumulations;
    };
    for (int q = 1; q <= Q; ++q) {
      set_coef(end_path(schedule, q - 1, m), &e_t[q], &e_f[q], &e_b[q], &e_a[q]);
      set_coef(start_path(schedule, q - 1, m), &s_t[q], &s_f[q], &s_b[q], &s_a[q]);
    }
    double* H = h->h.data();
    double* G = h->g.data();
    double* G0 = h->g0.data();
    std::vector<StageEstimate> row(L);  // one row of estimates where none are kept
    for (int r = R - 1; r >= 0; --r) {
      if (whole_nodes && !o.node_start(r)) continue;
      if (!last_stages && check_stop()) return;
      for (int s = last_stages ? R - r : 1; s <= (last_stages ? R - r : R - r - 1); ++s) {
        if (whole_nodes && !o.node_start(r + s)) continue;
        const bool homo = o.homogeneous(r, s);
        for (int tp = 1; tp <= std::min(s, max_tp); ++tp) {
          if (s % tp != 0 || s / tp > b || !o.tp_profiled(r, s, tp)) continue;
          const bool inside = o.tp_inside_nodes(r, s, tp);
          if (!opt_.allow_cross_node_tp && !inside) continue;
          double sf, sb;
          est.sends(r, s, tp, homo, &sf, &sb);
          const bool ends_ranks = r + s == R;
          const StageEstimate* cached = kept_estimates(o, est, r, s, tp, b, homo, inside);
          const double threshold = last_stages ? kInf : bound.threshold();
          const double capacity = o.capacity(r, s);
          for (int l = 0; l < L; ++l) {
            const std::size_t here = h->index(0, r, l);
            // Layers [l, e) fit the stage's ranks for e < e_fit only (their states grow with e).
            const double* states = state_lb.empty() ? nullptr : state_lb_at(tp, s / tp, l);
            int e_fit = L + 1;
            if (states)
              for (int e = l + 1; e <= L; ++e)
                if (states[e] > capacity) {
                  e_fit = e;
                  break;
                }
            if (e_fit == l + 1) continue;  // not even layer l alone fits
            if (ends_ranks) {  // the last stage: its entries q = 1
              if (e_fit <= L) continue;
              const StageEstimate x = cached ? cached[span_index(L, l, L)] : est.estimate(r, s, tp, l, L, homo, inside);
              if (!std::isfinite(x.t)) continue;
              const double busy = m * x.t + (m - 1) * x.a + sb;
              const double c0 = x.t + sf + sb, csum = c0 + (m > 1 ? x.a : 0.0);
              H[here + 1] = std::min(H[here + 1], busy);
              G[here + 1] = std::min(G[here + 1], csum);
              G0[here + 1] = std::min(G0[here + 1], c0);
              continue;
            }
            // Layers [l, e) for e < L (a stage follows), as one row of estimates.
            const int e_end = std::min(L, e_fit);
            const StageEstimate* xs = cached ? cached + span_index(L, l, l + 1) : row.data();
            if (!cached)
              for (int e = l + 1; e < e_end; ++e) row[e - l - 1] = est.estimate(r, s, tp, l, e, homo, inside);
            relax_row(xs, l + 1, e_end, std::min(Q, 1 + R - r - s), L, Q, m, sf, sb, threshold, coef.data(), H, G, G0,
                      h->index(0, r + s, 0) - 1, H + here, G + here, G0 + here);
          }
        }
      }
    }
  };
  // h_min from h.
  auto finish_bound = [&](SuffixBound* h) {
    h->h_min = h->h;
    if (h->h.empty()) return;
    if (!table_fits) {  // only the last stages' entries: small
      h->h_env = h->h;
      for (int r = 0; r <= R; ++r)
        for (int l = 1; l <= L; ++l)
          for (int q = 0; q <= h->Q; ++q) {
            double& cur = h->h_env[h->index(q, r, l)];
            cur = std::min(cur, h->h_env[h->index(q, r, l - 1)]);
          }
    }
    for (int r = 0; r <= R; ++r)
      for (int l = L - 1; l >= 0; --l)
        for (int q = 0; q <= h->Q; ++q) {
          double& cur = h->h_min[h->index(q, r, l)];
          cur = std::min(cur, h->h_min[h->index(q, r, l + 1)]);
        }
  };
  // The worker's counts into the shared (progress) counters: added to now and then, not per unit,
  // since the threads would contend on their cache line.
  auto publish = [&](Worker& w) {
    g_enumerated.fetch_add(w.c.enumerated - w.published.enumerated, std::memory_order_relaxed);
    g_pruned.fetch_add(w.c.pruned - w.published.pruned, std::memory_order_relaxed);
    g_costed.fetch_add(w.c.costed - w.published.costed, std::memory_order_relaxed);
    units_done.fetch_add(w.c.units - w.published.units, std::memory_order_relaxed);
    w.published = w.c;
  };
  // Every 1024 units or enumerations: publish, read the clock and the flags. True: stop.
  auto every_so_often = [&](Worker& w) {
    if (stop.load(std::memory_order_relaxed)) return true;
    if (++w.since_check < 1024) return false;
    w.since_check = 0;
    publish(w);
    return check_stop();
  };
  auto run_unit = [&](Worker& w, const Unit& u) {
    const long long unit_index = u.ordinal;
    if (whole_nodes && !orders[u.order].node_start(u.first_size)) return;  // not in the space: stage 0 ends inside a node
    // The depth-first search's first test below (stage 0's size is the unit's), before anything is set
    // up: most units end there.
    if (use_bounds && u.p > 1 &&
        bounds[u.bound].min_from(u.p - 1, u.first_size, u.first_layers > 0 ? u.first_layers : 1) > bound.threshold()) {
      ++w.c.enumerated;
      ++w.c.pruned;
      return;
    }
    const OrderContext& o = orders[u.order];
    const int p = u.p, m = u.m, b = opt_.gbs / m;
    // Stage i's entries are written when stage i - 1 is chosen: only stage 0's need a value.
    const std::size_t n = static_cast<std::size_t>(p + 1) * S;
    w.stage_cost.resize(static_cast<std::size_t>(p) * S);
    for (std::vector<double>* v : {&w.fwd_prefix, &w.c_prefix, &w.lb, &w.extra, &w.c0_prefix, &w.xstart}) {
      if (v->size() < n) v->resize(n);
      std::fill(v->begin(), v->begin() + S, v == &w.xstart ? -kInf : 0.0);
    }
    w.mask.resize(p + 1);
    w.choice.resize(p);
    w.leaf.resize(p);
    const unsigned all = S >= 32 ? 0xffffffffu : ((1u << S) - 1);
    w.mask[0] = all;
    const SuffixBound& sb = bounds[u.bound];
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
    // (A generic lambda that takes itself: no std::function, so no allocation per unit.)
    auto dfs = [&](auto& self, int i, int r, int l) -> void {
      if (stop.load(std::memory_order_relaxed)) return;
      if (every_so_often(w)) return;
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
      // The prefix's bounds, the smallest over the settings still feasible (each term's smallest: their
      // sum is at most every setting's).
      double c_min = kInf, c0_min = kInf, lb_min = kInf, e_min = kInf, xs_min = kInf, tail_min = i == 0 ? 0.0 : kInf;
      for (int q = 0; q < S; ++q)
        if (w.mask[i] & (1u << q)) {
          const std::size_t at = static_cast<std::size_t>(i) * S + q;
          c_min = std::min(c_min, w.c_prefix[at]);
          c0_min = std::min(c0_min, w.c0_prefix[at]);
          lb_min = std::min(lb_min, w.lb[at]);
          e_min = std::min(e_min, w.extra[at]);
          xs_min = std::min(xs_min, w.xstart[at]);
          if (i > 0) tail_min = std::min(tail_min, w.stage_cost[q].allreduce_ms + w.stage_cost[q].optimizer_ms);
        }
      const PathCounts pe = end_path(schedule, rest, m), ps = start_path(schedule, rest, m);
      const int nb = pe.backwards - 1;  // backwards before micro-batch m - 1's forward
      const int nf_start = ps.forwards;
      for (int s = s_min; s <= s_max; ++s) {
        if (whole_nodes && !o.node_start(r + s)) continue;
        // Whatever layers this stage takes, the ranks after it cannot finish in time.
        if (use_bounds && !last && c_min + sb.min_from(rest, r + s, l + k_min) + tail_min > bound.threshold()) {
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
          const bool inside = o.tp_inside_nodes(r, s, tp);
          if (!opt_.allow_cross_node_tp && !inside) continue;
          double sfw = 0, sbw = 0;
          const StageEstimate* kept = nullptr;
          // The least model-state bytes of layers [l, l + k) on these ranks, against their least memory.
          const double* states = state_lb.empty() ? nullptr : state_lb_at(tp, dp, l);
          const double capacity = states ? o.capacity(r, s) : kInf;
          if (use_bounds) {
            est.sends(r, s, tp, homo, &sfw, &sbw);
            kept = kept_estimates(o, est, r, s, tp, b, homo, inside);
          }
          int k_first = k_min;
          if (use_bounds && !last && k_max > k_min) {
            // Skip the layer counts that leave the stages after this one too much to do, by bisection on a
            // bound non-increasing in k (each skipped k would be pruned by `path` below: it is at least
            // c_min + that bound + tail_min).
            const double thr = bound.threshold();
            int lo = k_min, hi = k_max + 1;
            while (lo < hi) {
              const int mid = lo + (hi - lo) / 2;
              if (c_min + sb.at_most_from_left(rest, r + s, l + mid) + tail_min > thr) lo = mid + 1;
              else hi = mid;
            }
            w.c.enumerated += lo - k_min;
            w.c.pruned += lo - k_min;
            k_first = lo;
          }
          for (int k = k_first; k <= k_max; ++k) {
            ++w.c.enumerated;
            if (every_so_often(w)) return;
            if (states && states[l + k] > capacity) {
              // No setting fits, nor with more layers (the states only grow with them): the cheap test
              // before stage()'s per-rank memory.
              ++w.c.infeasible;
              if (w.first_infeasible_unit < 0 || unit_index < w.first_infeasible_unit) {
                int smallest = r;  // the rank with the least memory
                for (int q = r; q < r + s; ++q)
                  if (o.cost->rank_capacity_bytes(q) < o.cost->rank_capacity_bytes(smallest)) smallest = q;
                char gib[64];
                std::snprintf(gib, sizeof gib, "%.1f GiB of its %.1f GiB", states[l + k] / (1 << 30),
                              capacity / (1 << 30));
                w.first_infeasible_unit = unit_index;
                w.first_infeasible_reason = "rank " + std::to_string(smallest) + " runs out of memory (stage " +
                                            std::to_string(i) + " of " + std::to_string(p) + ", " + std::to_string(m) +
                                            " micro-batches): the model states of layers " + std::to_string(l) + "-" +
                                            std::to_string(l + k - 1) + " at tp " + std::to_string(tp) +
                                            " alone need " + gib;
              }
              break;
            }
            if (use_bounds) {
              const double thr = bound.threshold();
              const StageEstimate x = kept ? kept[span_index(L, l, l + k)]
                                           : est.estimate(r, s, tp, l, l + k, homo, inside);
              const double c0 = x.t + sfw + sbw, csum = c0 + (m > 1 ? x.a : 0.0);
              // This stage's own compute only grows with k.
              if (std::max(lb_min, c_min + sbw + m * x.t + (m - 1) * x.a + tail_min) > thr) {
                ++w.c.pruned;
                break;
              }
              const double g = sb.sum_at(rest, r + s, l + k), g0 = sb.sum0_at(rest, r + s, l + k);
              const double own_end = x.runs(pe.forwards, pe.backwards) + pe.accumulations * x.a + sfw + sbw;
              const double own_start = x.runs(ps.forwards, ps.backwards) + ps.accumulations * x.a + sfw + sbw;
              const double path = std::max({c_min + (last ? 0.0 : sb.at(rest, r + s, l + k)) + csum,
                                            c_min + std::max(e_min + csum, own_end) + g,
                                            c_min + own_start + g0, xs_min + c0_min + c0 + g0});
              if (path + tail_min > thr) {
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
              const double pass0 = fc.forward_ms + fc.send_forward_ms + fc.backward_ms + fc.send_backward_ms;
              w.fwd_prefix[next] = w.fwd_prefix[at] + fc.forward_ms + fc.send_forward_ms;
              w.c_prefix[next] = w.c_prefix[at] + pass0 + (m > 1 ? fc.accumulation_ms : 0.0);
              w.c0_prefix[next] = w.c0_prefix[at] + pass0;
              // The end path (end_path) through this stage or one before it: what it spends on that
              // stage beyond one pass; the stages after it up to the frontier are their passes.
              const double ex = (pe.forwards - 1) * fc.forward_ms + nb * fc.backward_ms +
                                std::max(0, pe.accumulations - (m > 1 ? 1 : 0)) * fc.accumulation_ms;
              w.extra[next] = std::max(w.extra[at], ex);
              // The start path (start_path) through this stage: all of it but the round trip after this
              // stage, less the passes of micro-batch 0 up to the frontier (added back at each frontier).
              const double xs = w.c_prefix[at] + nf_start * fc.forward_ms + m * fc.backward_ms +
                                (m - 1) * fc.accumulation_ms + fc.send_forward_ms + fc.send_backward_ms -
                                w.c0_prefix[next];
              w.xstart[next] = std::max(w.xstart[at], xs);
              if (use_bounds)
                lb = std::max({lb, w.c_prefix[next] + (last ? 0.0 : sb.at(rest, r + s, l + k)) + tail0,
                               w.c_prefix[next] + w.extra[next] + sb.sum_at(rest, r + s, l + k) + tail0,
                               w.xstart[next] + w.c0_prefix[next] + sb.sum0_at(rest, r + s, l + k) + tail0});
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
            self(self, i + 1, r + s, l + k);
            if (stop.load(std::memory_order_relaxed)) return;
          }
        }
      }
    };
    dfs(dfs, 0, 0, 0);
  };

  // Progress from a side thread.
  setup_progress.reset();
  Periodic reporter(opt_.progress ? std::function<void()>([&] {
    PlanSearchProgress pr;
    pr.units_done = units_done.load();
    pr.units_total = units_total;
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

  // The search in phases over the (node order, m) groups:
  //  1. every group's estimator and the one-stage entries of its suffix bound, the groups shared out
  //     among the threads;
  //  2. the units of one and two stages, which need no more of the tables, in group order, the threads
  //     taking a few at a time from the front: the first plans found set the threshold for the rest
  //     (threads that each started a group of their own would each search without one), and their best
  //     is often near the optimum, so the threshold is low before the costly part of the tables is built;
  //  3. per group, its deeper entries, leaving out stages whose own compute is already above that
  //     threshold, then its units of three stages and more, the groups shared out among the threads
  //     and the threads sharing each group's units.
  // With the per-rank tables, the phases are one pass with no wait between them (see below).
  // Groups are taken in order of decreasing micro-batch (more (dp, tp) options: the costlier tables),
  // each by the next free thread: none is left alone with a large table at the end. Two
  // micro-batches at a time, node order by node order (m1 o1, m2 o1, m1 o2, m2 o2, ...): groups taken
  // at once then mostly differ in their micro-batch, and so in the estimates they fill (shared by the
  // node orders of one micro-batch), so that two threads seldom compute the same estimate.
  std::vector<int> group_order(bounds.size());
  for (std::size_t g = 0; g < group_order.size(); ++g) group_order[g] = static_cast<int>(g);
  auto order_key = [&](int g) {
    const int rank = n_ms - 1 - g % n_ms;  // 0: the largest micro-batch (ms runs from the most micro-batches)
    return std::make_tuple(rank / 2, g / n_ms, rank % 2);
  };
  std::sort(group_order.begin(), group_order.end(), [&](int x, int y) { return order_key(x) < order_key(y); });
  // Every parallel task body below starts with start.enter(): a worker's first task runs the hook.
  WorkerStart start(opt_.on_worker_start);
  // The groups in group_order, each taken from `next` by the calling thread, until none is left, the
  // search stops, or body(g) returns false.
  auto take_groups = [&](std::atomic<std::size_t>& next, auto&& body) {
    for (std::size_t i = next.fetch_add(1); i < group_order.size() && !check_stop(); i = next.fetch_add(1))
      if (!body(group_order[i])) return;
  };
  auto for_each_group = [&](auto&& body) {
    std::atomic<std::size_t> next{0};
    const int lanes = std::max(1, tbb::this_task_arena::max_concurrency());
    tbb::parallel_for(0, lanes, [&](int) {
      start.enter();
      take_groups(next, [&](int g) {
        body(g);
        return true;
      });
    });
  };
  // Unit `index` of the search's order (by p, then group, then group_unit's order).
  auto unit_at = [&](long long index) {
    const int p = static_cast<int>(std::upper_bound(p_first.begin() + 1, p_first.end(), index) - p_first.begin()) - 1;
    const long long per_group = units_per_group(p);
    const long long rem = index - p_first[p], g_in_p = rem / per_group;
    return group_unit(static_cast<int>(g_in_p % n_orders) * n_ms + static_cast<int>(g_in_p / n_orders), p, rem % per_group);
  };
  if (!homogeneous) {
    // No per-rank tables (exhaustive, or too large a cluster): nothing gains from a threshold before
    // them, and the shallow plans of a large cluster are often out of memory, so the units run in the
    // search's order, the threads starting far apart in it (at different depths).
    for_each_group([&](int g) {
      build_bound(g, &bounds[g], true);
      finish_bound(&bounds[g]);
    });
    tbb::parallel_for(tbb::blocked_range<long long>(0, units_total, 1), [&](const tbb::blocked_range<long long>& range) {
      start.enter();
      Worker& w = workers.local();
      for (long long i = range.begin(); i != range.end() && !every_so_often(w); ++i, ++w.c.units) run_unit(w, unit_at(i));
    });
  } else {
    // The three phases as one pass of every thread, with no wait between them: a thread that finds no
    // work left in one phase goes on to the next (a thread that goes idle between phases can take
    // milliseconds to wake on a VM). A group's units wait only for its own one-stage entries, and its
    // deeper entries (which rebuild its table) for its units of one and two stages.
    const std::size_t n_groups = group_order.size();
    const long long per_group = group_unit_count(1, 2), n2 = per_group * static_cast<long long>(n_groups);
    std::unique_ptr<std::atomic<bool>[]> ready(new std::atomic<bool>[n_groups]);  // [g]: phase 1 done
    std::unique_ptr<std::atomic<long long>[]> left2(new std::atomic<long long>[n_groups]);  // [g]: phase 2 to do
    for (std::size_t g = 0; g < n_groups; ++g) {
      ready[g].store(false);
      left2[g].store(per_group);
    }
    // Waits until `done()`: work of an earlier phase, which running threads have taken (every item of a
    // phase is taken before any thread leaves it), and which waits only on work of a phase before its own
    // (phase 1 on nothing). No TBB wait runs inside a lane, so no thread holds such work below a wait
    // (REQUIRES, for whoever changes build_bound and run_unit: nothing in them waits in TBB). False where
    // the search stops first (cut short, or a thread's exception).
    auto wait_for = [&](auto&& done) {
      while (!done())
        if (stop.load(std::memory_order_relaxed)) return false;
        else std::this_thread::yield();
      return true;
    };
    std::atomic<std::size_t> next1{0}, next3{0};
    std::atomic<long long> next2{0};
    constexpr long long kChunk = 32;
    // Phase 3's units of group g: the next not taken (next3u[g]) and the number run (done3u[g]) of its
    // per_group3, once its deeper entries are built (open3[g]).
    const long long per_group3 = group_unit_count(3, Q);
    std::unique_ptr<std::atomic<long long>[]> next3u(new std::atomic<long long>[n_groups]);
    std::unique_ptr<std::atomic<long long>[]> done3u(new std::atomic<long long>[n_groups]);
    std::unique_ptr<std::atomic<bool>[]> open3(new std::atomic<bool>[n_groups]);
    for (std::size_t g = 0; g < n_groups; ++g) {
      next3u[g].store(0);
      done3u[g].store(0);
      open3[g].store(false);
    }
    // Runs group g's phase-3 units, a chunk at a time, until every one is taken; the thread that runs its
    // last frees its table. Any thread may join a group's units: the chunks shrink as they run out, so
    // that at the end of the search no thread is left alone with a long chunk (a few units take
    // milliseconds, most microseconds) while the other has nothing to do. False where the search stops.
    auto run_units3 = [&](Worker& w, int g) {
      for (;;) {
        const long long left = per_group3 - next3u[g].load(std::memory_order_relaxed);
        if (left <= 0) return true;
        const long long chunk = std::clamp<long long>(left / 64, 1, 64);
        const long long b = next3u[g].fetch_add(chunk, std::memory_order_relaxed);
        if (b >= per_group3) return true;
        const long long e = std::min(per_group3, b + chunk);
        long long i = b;
        bool stopped = false;
        for (Unit u = group_unit(g, 3, b); i < e; ++i, ++w.c.units, u = next_in_group(u)) {
          if ((stopped = every_so_often(w))) break;
          run_unit(w, u);
        }
        if (stopped) return false;  // (the table is left to the search's end)
        if (done3u[g].fetch_add(e - b, std::memory_order_acq_rel) + (e - b) == per_group3) bounds[g].release();
      }
    };
    auto lane = [&] {
      // 1. Every group's estimator and the one-stage entries of its suffix bound.
      take_groups(next1, [&](int g) {
        build_bound(g, &bounds[g], true);
        finish_bound(&bounds[g]);
        ready[g].store(true, std::memory_order_release);
        return true;
      });
      // 2. Every group's units of one and two stages, in group order, a few at a time: the threads stay
      //    near the front, where the plans found set the threshold for the rest.
      Worker& w = workers.local();
      bool stopped = false;
      for (long long b = next2.fetch_add(kChunk); b < n2 && !stopped; b = next2.fetch_add(kChunk))
        for (long long i = b, end = std::min(n2, b + kChunk); i < end && !stopped;) {
          const long long gi = i / per_group, group_end = std::min(end, (gi + 1) * per_group), from = i;
          const int g = group_order[gi];
          stopped = !wait_for([&] { return ready[g].load(std::memory_order_acquire); });
          for (; i < group_end && !stopped; ++i, ++w.c.units) {
            if ((stopped = every_so_often(w))) break;
            run_unit(w, group_unit(g, 1, i % per_group));
          }
          left2[g].fetch_sub(i - from, std::memory_order_release);
        }
      // 3. Per group, its deeper entries, then its units of three stages and more; then, with no group
      //    left to build, the units of the groups other threads are on (see run_units3).
      take_groups(next3, [&](int g) {
        if (!wait_for([&] { return left2[g].load(std::memory_order_acquire) == 0; })) return false;
        build_bound(g, &bounds[g], false);
        finish_bound(&bounds[g]);
        open3[g].store(true, std::memory_order_release);
        if (per_group3 == 0) bounds[g].release();  // no unit of three stages or more (Q < 3)
        return run_units3(w, g);
      });
      for (bool left = true; left && !stop.load(std::memory_order_relaxed);) {
        left = false;
        bool ran = false;
        for (int g : group_order) {
          if (next3u[g].load(std::memory_order_relaxed) >= per_group3) continue;
          left = true;
          if (!open3[g].load(std::memory_order_acquire)) continue;  // its table is being built
          ran = true;
          if (!run_units3(w, g)) break;
        }
        if (left && !ran) std::this_thread::yield();
      }
    };
    tbb::parallel_for(0, std::max(1, tbb::this_task_arena::max_concurrency()), [&](int) {
      start.enter();
      try {
        lane();
      } catch (...) {
        stop.store(true);  // (out of memory) no thread waits on this one's work for ever
        throw;
      }
    });
  }
  for (Worker& w : workers) publish(w);

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
