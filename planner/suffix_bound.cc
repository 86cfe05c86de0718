#include "planner/suffix_bound.h"

#include <algorithm>
#include <cmath>

#include "sim/memory_model.h"
#include "sim/schedule.h"

// x86-64 with glibc: also an AVX2 build of relax_row (4 doubles a vector instead of SSE2's 2; no FMA, so
// the same values), chosen by the CPU features glibc read at start-up. Not GCC's target_clones: its
// resolver runs libgcc's CPU detection in every process, a dozen CPUID instructions that cost about
// 10 us each in a VM (0.25 ms of each run's start-up, measured here). GCC only: clang 14 (scripts/fuzz.sh)
// cannot compile <sys/platform/x86.h> in C++ (it uses C's _Bool).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__has_include)
#if __has_include(<sys/platform/x86.h>)
#include <sys/platform/x86.h>
#define HETPLAN_AVX2_BUILD 1
#endif
#endif

namespace hetplan {

namespace {

using stage_estimates::span_index;
using stage_estimates::StageEstimate;
using stage_estimates::StageEstimator;
constexpr double kInf = std::numeric_limits<double>::infinity();

// One step of the dynamic program (see SuffixBound) for a stage x with every q in [2, q_max]:
// hc/gc/g0c[q] are this stage's entries of paths, last_trips and first_trips, hn/gn/g0n[q] the entries
// q - 1 of the stages after it (infinity where none exists, which leaves hc/gc/g0c alone). `coef` holds
// 8 rows of `stride` per-q coefficients: the end path's t, f, b, a, then the start path's. Written for
// the compiler to vectorise: distinct arrays, no branch (no value is NaN).
// With kTails (the whole-node tables), tn/tc are the tail_paths entries: tc[q] takes the least of max(v +
// own, fwd + tn[q]) (v: the path value just computed, to the stage's last backward and its send; own: the
// stage's tail less that send; fwd: its forward and send), and the paths take the multi-trip chain too.
template <bool kTails>
[[gnu::always_inline]] inline void relax_suffix(int q_max, const double* __restrict coef, int stride, StageEstimate x,
                                                double busy, double csum, double c0, double sf, double sb,
                                                const double* __restrict hn, const double* __restrict gn,
                                                const double* __restrict g0n, double* __restrict hc,
                                                double* __restrict gc, double* __restrict g0c, double own, double fwd,
                                                const double* __restrict tn, double* __restrict tc) {
  const double* __restrict e_t = coef;
  const double* __restrict e_f = coef + stride;
  const double* __restrict e_b = coef + 2 * stride;
  const double* __restrict e_a = coef + 3 * stride;
  const double* __restrict s_t = coef + 4 * stride;
  const double* __restrict s_f = coef + 5 * stride;
  const double* __restrict s_b = coef + 6 * stride;
  const double* __restrict s_a = coef + 7 * stride;
  const double* __restrict h_t = coef + 8 * stride;
  const double* __restrict h_b = coef + 9 * stride;
  const double* __restrict h_a = coef + 10 * stride;
  const double* __restrict h_n = coef + 11 * stride;
  const double* __restrict h_0 = coef + 12 * stride;
  const double* __restrict h_1 = coef + 13 * stride;
  const double* __restrict k_t = coef + 14 * stride;  // the same chain with two trips (0 and m - 1)
  const double* __restrict k_b = coef + 15 * stride;
  const double* __restrict k_a = coef + 16 * stride;
  const double* __restrict k_n = coef + 17 * stride;
  const double* __restrict k_0 = coef + 18 * stride;
  const double* __restrict k_1 = coef + 19 * stride;
  const double t = x.t, f = x.f, b = x.b, a = x.a, sends = sf + sb;
  for (int q = 2; q <= q_max; ++q) {
    const double end = e_t[q] * t + e_f[q] * f + e_b[q] * b + e_a[q] * a + sends + gn[q];
    const double start = s_t[q] * t + s_f[q] * f + s_b[q] * b + s_a[q] * a + sends + g0n[q];
    const double via = csum + hn[q];
    // The multi-trip chains (multi_trip_counts), with the most trips and with two: h_n[q] trips, each after
    // a forward send, the first micro-batch 0's (h_0 = 1), h_1 = h_n - 1 more; k_* the same with two. (NaN
    // where the suffix is infinite and a coefficient is 0: v is then infinite and stays; all zero under
    // GPipe: at most sb, below busy.)
    const double m1 = busy < via ? via : busy;
    const double m2 = end < start ? start : end;
    double v = m1 < m2 ? m2 : m1;
    if constexpr (kTails) {  // (the whole-node tables only: a few percent of the inner loop elsewhere)
      const double trips = h_t[q] * t + h_b[q] * b + h_a[q] * a + h_n[q] * sf + sb + h_0[q] * g0n[q] + h_1[q] * gn[q];
      const double pair = k_t[q] * t + k_b[q] * b + k_a[q] * a + k_n[q] * sf + sb + k_0[q] * g0n[q] + k_1[q] * gn[q];
      v = trips > v ? trips : v;
      v = pair > v ? pair : v;
    }
    hc[q] = v < hc[q] ? v : hc[q];
    const double gv = csum + gn[q];
    gc[q] = gv < gc[q] ? gv : gc[q];
    const double g0v = c0 + g0n[q];
    g0c[q] = g0v < g0c[q] ? g0v : g0c[q];
    if constexpr (kTails) {
      const double tf = fwd + tn[q], to = v + own;
      const double tv = to < tf ? tf : to;
      tc[q] = tv < tc[q] ? tv : tc[q];
    }
  }
}

// The steps of the dynamic program for a stage at one (dp, tp) starting at one layer l and ending at
// each layer e in [e_begin, e_end) in turn (xs[e - e_begin] its estimate; a stage with no stage after it
// is not here): paths, last_trips and first_trips are the tables, `next0` the index of (q = -1, the rank
// after the stage, layer 0), so that the entries q - 1 after a stage ending at e start at
// next0 + e (depth + 1); hc/gc/g0c the stage's own entries. A stage whose busy time (with kTails: or its
// busy time less its last send plus its tail) is above `threshold` ends the walk (its time, accumulation
// and tail only grow with its layers); one with no estimate (a missing
// profile) is skipped. One call per row, so the dynamic program's inner loops are all in the AVX2 build.
// With kTails, tail_row[e] is the stage's tail with layers up to e, tails the tail_paths table and tc the
// stage's own entries of it.
template <bool kTails>
[[gnu::always_inline]] inline void relax_row_body(const StageEstimate* xs, int e_begin, int e_end, int q_cap,
                                                  int layers, int depth, int micro_batches, double sf, double sb,
                                                  double threshold, const double* coef, const double* paths,
                                                  const double* last_trips, const double* first_trips,
                                                  std::size_t next0, double* hc, double* gc, double* g0c,
                                                  const double* tail_row, const double* tails, double* tc) {
  const double md = micro_batches, m1 = micro_batches - 1, acc = micro_batches > 1 ? 1.0 : 0.0;
  for (int e = e_begin; e < e_end; ++e) {
    const StageEstimate x = xs[e - e_begin];
    if (!std::isfinite(x.t)) continue;
    const double busy = md * x.t + m1 * x.a + sb;
    if (busy > threshold) break;
    // With the tails: the stage's compute then its all-reduce and step are a chain of every plan with it
    // (tail_paths), and both only grow with its layers.
    if constexpr (kTails)
      if (busy - sb + tail_row[e] > threshold) break;
    const double c0 = x.t + sf + sb, csum = c0 + acc * x.a;
    // (The stages after it number at most min(ranks - r - s, layers - e).)
    const int q_max = std::min(q_cap, 1 + layers - e);
    const std::size_t next = next0 + static_cast<std::size_t>(e) * (depth + 1);
    if constexpr (kTails)
      relax_suffix<true>(q_max, coef, depth + 1, x, busy, csum, c0, sf, sb, paths + next, last_trips + next,
                         first_trips + next, hc, gc, g0c, tail_row[e] - sb, x.f + sf, tails + next, tc);
    else
      relax_suffix<false>(q_max, coef, depth + 1, x, busy, csum, c0, sf, sb, paths + next, last_trips + next,
                          first_trips + next, hc, gc, g0c, 0, 0, nullptr, nullptr);
  }
}

#define HETPLAN_RELAX_ROW_ARGS                                                                                    \
  const StageEstimate *xs, int e_begin, int e_end, int q_cap, int layers, int depth, int micro_batches, double sf, \
      double sb, double threshold, const double *coef, const double *paths, const double *last_trips,            \
      const double *first_trips, std::size_t next0, double *hc, double *gc, double *g0c, const double *tail_row, \
      const double *tails, double *tc
#define HETPLAN_RELAX_ROW_CALL(T)                                                                                 \
  relax_row_body<T>(xs, e_begin, e_end, q_cap, layers, depth, micro_batches, sf, sb, threshold, coef, paths,     \
                    last_trips, first_trips, next0, hc, gc, g0c, tail_row, tails, tc)
void relax_row_plain(HETPLAN_RELAX_ROW_ARGS) { HETPLAN_RELAX_ROW_CALL(false); }
void relax_row_plain_tails(HETPLAN_RELAX_ROW_ARGS) { HETPLAN_RELAX_ROW_CALL(true); }
#ifdef HETPLAN_AVX2_BUILD
__attribute__((target("avx2"))) void relax_row_avx2(HETPLAN_RELAX_ROW_ARGS) { HETPLAN_RELAX_ROW_CALL(false); }
__attribute__((target("avx2"))) void relax_row_avx2_tails(HETPLAN_RELAX_ROW_ARGS) { HETPLAN_RELAX_ROW_CALL(true); }
#endif
#undef HETPLAN_RELAX_ROW_CALL
#undef HETPLAN_RELAX_ROW_ARGS

// The build of relax_row for this CPU, with or without the tails.
SuffixBoundBuilder::RelaxRow pick_relax_row(bool tails) {
#ifdef HETPLAN_AVX2_BUILD
  if (CPU_FEATURE_ACTIVE(AVX2)) return tails ? relax_row_avx2_tails : relax_row_avx2;
#endif
  return tails ? relax_row_plain_tails : relax_row_plain;
}

// Whether tail_rate's argument holds for every setting: the all-reduce is the plain one (no overlap with
// compute, no DDP buckets, no DeepSpeed buffers), the step runs on the GPU, every parameter trains.
bool plain_tails(const SearchSpace& space, const PlanSearchOptions& options) {
  if (options.exhaustive || !space.whole_nodes) return false;
  for (const TrainingSetup& st : space.setups)
    if (st.finetune != Finetune::kFull || st.offload_optimizer || st.offload_params || st.deepspeed.model ||
        st.ddp.model || st.overlap.any())
      return false;
  return true;
}

// Per q (stages from this one to the last), each path's counts as coefficients of t, f, b and a
// (StageEstimate::runs), so that the inner loop over q is straight-line arithmetic: 20 rows of depth + 1,
// the end path's t, f, b, a, then the start path's, then the multi-trip chain's t, b, a, trips, and the
// coefficients of the first and the later trips (see relax_suffix), with the most trips, then the same six
// with two trips (0 and m - 1). The chain's length is affine in its trips, so these two are its longest.
constexpr int kCoefRows = 20;
std::vector<double> path_coefficients(Schedule schedule, int micro_batches, int depth) {
  std::vector<double> coef(static_cast<std::size_t>(kCoefRows) * (depth + 1), 0.0);
  double* row[kCoefRows];
  for (int i = 0; i < kCoefRows; ++i) row[i] = coef.data() + static_cast<std::size_t>(i) * (depth + 1);
  auto set_coef = [](const PathOpCounts& c, double* t, double* f, double* b, double* a) {
    const int lo = std::min(c.forwards, c.backwards);
    *t = lo;
    *f = c.forwards - lo;
    *b = c.backwards - lo;
    *a = c.accumulations;
  };
  for (int q = 1; q <= depth; ++q) {
    set_coef(end_path_counts(schedule, q - 1, micro_batches), &row[0][q], &row[1][q], &row[2][q], &row[3][q]);
    set_coef(start_path_counts(schedule, q - 1, micro_batches), &row[4][q], &row[5][q], &row[6][q], &row[7][q]);
    for (int k = 0; k < 2; ++k) {
      const MultiTripCounts h = multi_trip_counts(schedule, q - 1, micro_batches, k == 0 ? 0 : 2);
      if (h.trips < 1) continue;  // (all zero)
      // forwards <= backwards: the forwards at t, the other backwards at b.
      double* const* r = row + 8 + 6 * k;
      r[0][q] = h.forwards;
      r[1][q] = h.backwards - h.forwards;
      r[2][q] = h.accumulations;
      r[3][q] = h.trips;
      r[4][q] = 1;
      r[5][q] = h.trips - 1;
    }
  }
  return coef;
}

// Layers [l, e) fit a stage's ranks for e < the returned layer only (their states grow with e); the
// layers + 1 where every e fits or no states are known.
int first_layer_past_memory(const double* states, double capacity, int l, int layers) {
  if (states)
    for (int e = l + 1; e <= layers; ++e)
      if (states[e] > capacity) return e;
  return layers + 1;
}

// The table grown from its entries q <= 1 (computed before) to every q <= depth.
void widen_table(SuffixBound* bound, int depth) {
  const int q_small = bound->depth;
  std::vector<double> hs = std::move(bound->paths), gs = std::move(bound->last_trips), g0s = std::move(bound->first_trips),
                      ts = std::move(bound->tail_paths);
  bound->depth = depth;
  bound->paths.assign(static_cast<std::size_t>(depth + 1) * (bound->ranks + 1) * (bound->layers + 1), kInf);
  bound->last_trips.assign(bound->paths.size(), kInf);
  bound->first_trips.assign(bound->paths.size(), kInf);
  if (!ts.empty()) bound->tail_paths.assign(bound->paths.size(), kInf);
  for (int r = 0; r <= bound->ranks; ++r)
    for (int l = 0; l <= bound->layers; ++l)
      for (int q = 0; q <= q_small; ++q) {
        const std::size_t from = (static_cast<std::size_t>(r) * (bound->layers + 1) + l) * (q_small + 1) + q,
                          to = bound->index(q, r, l);
        bound->paths[to] = hs[from];
        bound->last_trips[to] = gs[from];
        bound->first_trips[to] = g0s[from];
        if (!ts.empty()) bound->tail_paths[to] = ts[from];
      }
}

}  // namespace

namespace {
bool coupled_at_most(const SuffixBound::Coupled& a, const SuffixBound::Coupled& b) {
  return a.h <= b.h && a.g <= b.g && a.g0 <= b.g0 && a.t <= b.t;
}
}  // namespace

void add_coupled(SuffixBound::Coupled* set, unsigned char* n, const SuffixBound::Coupled& c) {
  int k = *n;
  for (int i = 0; i < k; ++i)
    if (coupled_at_most(set[i], c)) return;
  int kept = 0;
  for (int i = 0; i < k; ++i)
    if (!coupled_at_most(c, set[i])) set[kept++] = set[i];
  if (kept < SuffixBound::kPairs) {
    set[kept++] = c;
    *n = static_cast<unsigned char>(kept);
    return;
  }
  int nearest = 0;
  double least = kInf;
  for (int i = 0; i < kept; ++i) {
    const double d = std::abs(set[i].h - c.h) / std::max(set[i].h, c.h) + std::abs(set[i].g - c.g) / std::max(set[i].g, c.g);
    if (d < least) least = d, nearest = i;
  }
  SuffixBound::Coupled& m = set[nearest];
  m = {std::min(m.h, c.h), std::min(m.g, c.g), std::min(m.g0, c.g0), std::min(m.t, c.t)};
  *n = static_cast<unsigned char>(kept);
}

std::vector<std::vector<double>> least_gpu_ms_per_sample(const SearchSpace& space, const ProfileSet& profiles,
                                                          const Cluster& cluster) {
  // Per type and layer, the least GPU-ms per sample over its files (tp x time / bs: a replica of tp GPUs
  // runs a share of its slices, each at least its bs x that), with what every setting's recomputation
  // adds (PlanCostModel::least_recompute_ms: 0 where a setting does not recompute).
  const int n_types = space.device_types, layers = space.layers;
  const PlanCostModel& cost = *space.orders[0].cost;
  std::vector<std::vector<double>> per_layer(n_types, std::vector<double>(layers, kInf));
  for (int t = 0; t < n_types; ++t) {
    const int pt = profiles.type_index(cluster.device_types()[t]);
    for (const LayerProfile& e : profiles.entries()) {
      if (e.tp < 1 || e.tp > space.max_tp || e.bs < 1 || profiles.find(pt, e.tp, e.bs) != &e) continue;
      for (int l = 0; l < layers; ++l)
        per_layer[t][l] = std::min(per_layer[t][l], e.tp * (e.time(l, l + 1) + cost.least_recompute_ms(e, l)) / e.bs);
    }
  }
  return per_layer;
}

ThroughputRates throughput_rates(const SearchSpace& space, const ProfileSet& profiles, const Cluster& cluster) {
  const int n_types = space.device_types, layers = space.layers;
  const std::vector<std::vector<double>> per_layer = least_gpu_ms_per_sample(space, profiles, cluster);
  bool known = true;
  for (int t = 0; t < n_types; ++t)
    for (int l = 0; l < layers; ++l) known = known && std::isfinite(per_layer[t][l]);
  ThroughputRates rates;
  if (!known) return rates;
  rates.kappa.assign(n_types, kInf);
  for (int t = 0; t < n_types; ++t)
    for (int l = 0; l < layers; ++l)
      if (per_layer[0][l] > 0) rates.kappa[t] = std::min(rates.kappa[t], per_layer[t][l] / per_layer[0][l]);
  rates.reference.assign(layers + 1, 0.0);
  for (int l = 0; l < layers; ++l) rates.reference[l + 1] = rates.reference[l] + per_layer[0][l];
  for (double& k : rates.kappa)
    if (!std::isfinite(k)) k = 0;  // every layer free on type 0: no bound
  return rates;
}

double zero_pass_sync_ms(const PlanCostModel& cost, const FastStageCost* c, int setups, int k) {
  if (cost.setup(k).zero_stage < 2) return 0.0;
  for (int j = 0; j < setups; ++j)
    if (cost.setup(j).zero_stage < 2 && cost.recompute_fraction(j) == cost.recompute_fraction(k))
      return std::max(0.0, (c[k].forward_ms + c[k].backward_ms) - (c[j].forward_ms + c[j].backward_ms));
  return 0.0;
}

// Setting k's sync (all-reduce and the collectives in its passes) on the whole model, in a form that scales
// down to any stage by its parameters (tail_rate): ZeRO-3's passes gather the weights ag x (forward share
// + backward share) (PlanCostModel's Zero3Gathers: at least 1 and at most 3 in all; the whole model's
// shares need not be a stage's), so a ZeRO-3 setting counts only ag + rs, which a ZeRO-1 or 2 setting of
// the same gradient bytes has exactly (it is then left to that setting), else its passes over 3.
static double scalable_sync_ms(const PlanCostModel& cost, const FastStageCost* c, int setups, int k) {
  const TrainingSetup& st = cost.setup(k);
  if (st.zero_stage < 3) return c[k].allreduce_ms + zero_pass_sync_ms(cost, c, setups, k);
  for (int j = 0; j < setups; ++j) {
    const TrainingSetup& sj = cost.setup(j);
    if ((sj.zero_stage == 1 || sj.zero_stage == 2) && reduced_gradient_bytes(sj) == reduced_gradient_bytes(st))
      return kInf;  // at least setting j's on every stage
  }
  return c[k].allreduce_ms + zero_pass_sync_ms(cost, c, setups, k) / 3;
}

double least_sync_ms(const PlanCostModel& cost, const FastStageCost* c, int setups, bool fitting_only) {
  double least = kInf;
  for (int k = 0; k < setups; ++k)
    if (!fitting_only || c[k].fits)
      least = std::min(least, c[k].allreduce_ms + c[k].optimizer_ms + zero_pass_sync_ms(cost, c, setups, k));
  return least;
}

bool suffix_table_fits(const SearchSpace& space, const Cluster& cluster, double suffix_table_limit) {
  // Stage boundaries: ranks, or node starts only (the table's rows at other ranks are then never filled
  // nor read).
  const double positions = space.stage_positions(cluster);
  const double layers = space.layers, depth = space.max_stages;
  const double table_work = 0.25 * positions * positions * layers * layers * depth;
  return table_work <= suffix_table_limit &&
         static_cast<double>(space.max_stages + 1) * (space.gpus + 1) * (space.layers + 1) <= 5e7;
}

// One pass of the dynamic program over one group's table.
struct SuffixBoundBuilder::Pass {
  SuffixBound* bound;
  const NodeOrder& order;
  const StageEstimator& estimator;
  int micro_batches, micro_batch;
  bool last_stages;
  std::vector<double> coef;          // path_coefficients
  std::vector<StageEstimate> row;    // one row of estimates where none are kept
  std::vector<double> tail_row;      // [e]: the stage's tail with layers [l, e) (tails_on)
};

SuffixBoundBuilder::SuffixBoundBuilder(const SearchSpace& space, const FeasibilityTables& tables, KeptEstimates& kept,
                                       const ThroughputRates& throughput, const SharedBound& shared,
                                       SearchControl& control, const ProfileSet& profiles, const Cluster& cluster,
                                       const PlanSimulator& simulator, const PlanSearchOptions& options,
                                       bool table_fits)
    : space_(space),
      tables_(tables),
      kept_(kept),
      throughput_(throughput),
      shared_(shared),
      control_(control),
      profiles_(profiles),
      cluster_(cluster),
      simulator_(simulator),
      options_(options),
      table_fits_(table_fits),
      full_params_(std::all_of(space.setups.begin(), space.setups.end(),
                               [](const TrainingSetup& st) { return st.finetune == Finetune::kFull; })),
      tails_on_(plain_tails(space, options)),
      relax_row_(pick_relax_row(tails_on_)) {
  if (!tails_on_) return;
  const ModelShape& shape = simulator.shape();
  const int layers = space.layers;
  const TrainingSetup& setup = space.setups.front();
  tail_params_.assign(space.max_tp + 1, std::vector<double>(layers + 1, 0.0));
  full_params_on_rank_.assign(space.max_tp + 1, 0.0);
  const ShardParams whole = shard_params(shape, 0, layers, 1, setup);
  for (int tp = 1; tp <= space.max_tp; ++tp) full_params_on_rank_[tp] = whole.on_rank(tp);
  tail_bytes_.assign(layers + 1, 0.0);
  const std::vector<double>& bytes = profiles.model().parameters_per_layer_bytes;
  for (int l = 0; l < layers; ++l) {
    const ShardParams one = shard_params(shape, l, l + 1, 2, setup);
    for (int tp = 1; tp <= space.max_tp; ++tp) tail_params_[tp][l + 1] = tail_params_[tp][l] + one.on_rank(tp);
    tail_bytes_[l + 1] = tail_bytes_[l] + (l < static_cast<int>(bytes.size()) ? bytes[l] : 0.0);
  }
  full_bytes_ = tail_bytes_[layers];
  for (const NodeOrder& o : space.orders) {
    std::vector<int> pos(space.gpus + 1, -1);
    int n = 0;
    for (int r = 0; r <= space.gpus; ++r)
      if (o.node_start(r)) pos[r] = n++;
    position_.push_back(std::move(pos));
    positions_.push_back(n);
    const std::size_t cells = static_cast<std::size_t>(n) * n * (space.max_tp + 1) * kRateFields;
    rates_.emplace_back(new std::atomic<double>[cells]);
    for (std::size_t i = 0; i < cells; ++i) rates_.back()[i].store(std::numeric_limits<double>::quiet_NaN());
  }
}

TailRates SuffixBoundBuilder::tail_rate(const NodeOrder& o, int r, int s, int tp) const {
  const int n = positions_[o.index];
  const std::size_t cell =
      ((static_cast<std::size_t>(position_[o.index][r]) * n + position_[o.index][r + s]) * (space_.max_tp + 1) + tp) *
      kRateFields;
  std::atomic<double>* stored = rates_[o.index].get() + cell;
  TailRates rates;
  double* fields[kRateFields] = {&rates.sync[0], &rates.sync[1], &rates.step[0], &rates.step[1]};
  bool known = true;
  for (int i = 0; i < kRateFields; ++i) known = !std::isnan(*fields[i] = stored[i].load(std::memory_order_relaxed)) && known;
  if (known) return rates;
  // (Racing threads compute the same values.)
  StageChoice c;
  c.begin = r;
  c.size = s;
  c.st = Strategy{s / tp, tp};
  c.layer_begin = 0;
  c.layer_end = space_.layers;
  const int setups = space_.num_setups();
  std::vector<FastStageCost> costs(setups);
  rates = TailRates();
  if (full_params_on_rank_[tp] > 0 && full_bytes_ > 0 && o.cost->stage(c, 0, 1, 1, space_.gbs, costs.data())) {
    double sync[2] = {kInf, kInf}, step[2] = {kInf, kInf};
    for (int k = 0; k < setups; ++k) {
      const int z = o.cost->setup(k).zero_stage >= 1 ? 1 : 0;
      sync[z] = std::min(sync[z], scalable_sync_ms(*o.cost, costs.data(), setups, k));
      step[z] = std::min(step[z], costs[k].optimizer_ms);
    }
    for (int z = 0; z < 2; ++z) {
      const int from = std::isfinite(sync[z]) && std::isfinite(step[z]) ? z : 1 - z;  // an empty class: the other
      rates.sync[z] = std::isfinite(sync[from]) ? std::max(0.0, sync[from]) / full_params_on_rank_[tp] : 0.0;
      rates.step[z] = std::isfinite(step[from]) ? std::max(0.0, step[from]) / full_bytes_ : 0.0;
    }
  }
  for (int i = 0; i < kRateFields; ++i) stored[i].store(*fields[i], std::memory_order_relaxed);
  return rates;
}

void SuffixBoundBuilder::build_last_stages(int group, SuffixBound* bound) const {
  const NodeOrder& o = space_.order_of_group(group);
  const int b = space_.gbs / space_.micro_batches_of_group(group);
  bound->estimator = std::make_unique<StageEstimator>(
      profiles_, cluster_, *o.layout, *o.cost, kept_.slices(), kept_.mixed_lists(), b, space_.max_tp, full_params_,
      simulator_.options().backward_share, tables_.unmeasured_accumulation(), space_.layers,
      options_.mixed_table_limit);
  bound->ranks = space_.gpus;
  bound->layers = space_.layers;
  bound->depth = space_.max_stages;
  if (options_.exhaustive) return;
  // Too large a table (hundreds of GPUs): the throughput bound (SuffixBound::throughput_bound) where it
  // was built stands in for the entries q >= 2 (not built: 0, a bound that never prunes); the entries
  // q = 1, one per (rank, layer), are still built below.
  if (!table_fits_ && !throughput_.kappa.empty()) {
    bound->gbs = space_.gbs;
    bound->reference_ms = throughput_.reference;
    bound->inverse_kappa.assign(space_.gpus + 1, 0.0);
    for (int r = space_.gpus - 1; r >= 0; --r) {
      const double k = throughput_.kappa[o.layout->type_of(r)];
      bound->inverse_kappa[r] = bound->inverse_kappa[r + 1] + (k > 0 ? 1 / k : kInf);
    }
  }
  // Only the entries q <= 1 for now (a small table): the full one comes with the deeper entries.
  bound->depth = std::min(space_.max_stages, 1);
  bound->paths.assign(static_cast<std::size_t>(bound->depth + 1) * (space_.gpus + 1) * (space_.layers + 1), kInf);
  bound->last_trips.assign(bound->paths.size(), kInf);
  bound->first_trips.assign(bound->paths.size(), kInf);
  if (tails_on_) bound->tail_paths.assign(bound->paths.size(), kInf);
  bound->with_pairs = bound->with_pairs && tails_on_ && table_fits_;
  if (bound->with_pairs) {
    bound->pair_depth = space_.max_stages;
    bound->pair_pos.assign(space_.gpus + 1, -1);
    int n = 0;
    for (int r = 0; r <= space_.gpus; ++r)
      if (o.node_start(r)) bound->pair_pos[r] = n++;
    const std::size_t cells = static_cast<std::size_t>(n) * (space_.layers + 1) * (bound->pair_depth + 1);
    bound->pairs.assign(cells * SuffixBound::kPairs, SuffixBound::Coupled{kInf, kInf, kInf, kInf});
    bound->pair_count.assign(cells, 0);
  }
  relax(group, bound, true);
}

void SuffixBoundBuilder::build_deeper(int group, SuffixBound* bound) const {
  if (bound->paths.empty()) return;
  if (bound->depth < space_.max_stages) widen_table(bound, space_.max_stages);
  relax(group, bound, false);
}

// `last_stages`: the entries q = 1 (stages that end the ranks); else the entries q >= 2.
void SuffixBoundBuilder::relax(int group, SuffixBound* bound, bool last_stages) const {
  const NodeOrder& o = space_.order_of_group(group);
  const int micro_batches = space_.micro_batches_of_group(group), gpus = space_.gpus;
  Pass pass{bound,           o, *bound->estimator, micro_batches, space_.gbs / micro_batches, last_stages,
            path_coefficients(simulator_.options().schedule, micro_batches, space_.max_stages),
            std::vector<StageEstimate>(space_.layers), std::vector<double>(space_.layers + 1, 0.0)};
  for (int r = gpus - 1; r >= 0; --r) {
    if (space_.whole_nodes && !o.node_start(r)) continue;
    if (!last_stages && control_.check_stop()) return;
    for (int s = last_stages ? gpus - r : 1; s <= (last_stages ? gpus - r : gpus - r - 1); ++s) {
      if (space_.whole_nodes && !o.node_start(r + s)) continue;
      for (int tp = 1; tp <= std::min(s, space_.max_tp); ++tp) {
        if (s % tp != 0 || !space_.splits_micro_batch(s / tp, pass.micro_batch) || !o.tp_profiled(r, s, tp)) continue;
        relax_stage(pass, r, s, tp);
      }
    }
  }
}

// The estimates of stage [r, r + s) at (s / tp, tp) with layers [l, e) for e = l + 1 .. e_end - 1, into
// pass.row, up to the first whose busy time (with the tails: or its busy time less its last send plus its
// tail) is above `threshold` (relax_row's walk ends there: both only grow with the layers, so the estimates after it are
// never read); returns the end of the walk. REQUIRES (tails_on_): pass.tail_row holds this l's tails.
int SuffixBoundBuilder::estimate_row(Pass& pass, int r, int s, int tp, int l, int e_end, bool homo, bool inside,
                                     double sb, double threshold) const {
  const double md = pass.micro_batches, m1 = pass.micro_batches - 1;
  for (int e = l + 1; e < e_end; ++e) {
    const StageEstimate x = pass.estimator.estimate(r, s, tp, l, e, homo, inside);
    pass.row[e - l - 1] = x;
    if (std::isfinite(x.t) && md * x.t + m1 * x.a + (tails_on_ ? std::max(sb, pass.tail_row[e]) : sb) > threshold)
      return e + 1;
  }
  return e_end;
}

// The entries of the stages [r, r + s) at (s / tp, tp): every first layer, every last layer.
void SuffixBoundBuilder::relax_stage(Pass& pass, int r, int s, int tp) const {
  const NodeOrder& o = pass.order;
  const StageEstimator& est = pass.estimator;
  SuffixBound* bound = pass.bound;
  const int layers = space_.layers, depth = space_.max_stages, gpus = space_.gpus, micro_batches = pass.micro_batches;
  const bool homo = o.homogeneous(r, s);
  const bool inside = o.tp_inside_nodes(r, s, tp);
  if (!options_.allow_cross_node_tp && !inside) return;
  double sf, sb;
  est.sends(r, s, tp, homo, &sf, &sb);
  const bool ends_ranks = r + s == gpus;
  const StageEstimate* cached = kept_.get(o, est, r, s, tp, pass.micro_batch, homo, inside);
  const double threshold = pass.last_stages ? kInf : shared_.threshold();
  const double capacity = o.capacity(r, s);
  double* path_data = bound->paths.data();
  double* last_trip_data = bound->last_trips.data();
  double* first_trip_data = bound->first_trips.data();
  double* tail_data = tails_on_ ? bound->tail_paths.data() : nullptr;
  TailRates rate;
  if (tails_on_) rate = tail_rate(o, r, s, tp);
  for (int l = 0; l < layers; ++l) {
    const std::size_t here = bound->index(0, r, l);
    const int e_fit = first_layer_past_memory(tables_.states_row(tp, s / tp, l), capacity, l, layers);
    if (e_fit == l + 1) continue;  // not even layer l alone fits
    if (tails_on_)
      for (int e = l + 1; e <= layers; ++e)
        pass.tail_row[e] = tail_ms(rate, tp, l, e);
    if (ends_ranks) {  // the last stage: its entries q = 1
      if (e_fit <= layers) continue;
      const StageEstimate x = cached ? cached[span_index(layers, l, layers)] : est.estimate(r, s, tp, l, layers, homo, inside);
      if (!std::isfinite(x.t)) continue;
      const double busy = micro_batches * x.t + (micro_batches - 1) * x.a + sb;
      const double c0 = x.t + sf + sb, csum = c0 + (micro_batches > 1 ? x.a : 0.0);
      path_data[here + 1] = std::min(path_data[here + 1], busy);
      last_trip_data[here + 1] = std::min(last_trip_data[here + 1], csum);
      first_trip_data[here + 1] = std::min(first_trip_data[here + 1], c0);
      // (A pipeline of this one stage: its parameters differ (tied embeddings); the root's exact tail covers it.)
      if (tail_data)
        tail_data[here + 1] = std::min(tail_data[here + 1], busy - sb + (r == 0 && l == 0 ? 0.0 : pass.tail_row[layers]));
      if (bound->has_pairs()) {
        const std::size_t i = bound->pair_index(1, r, l);
        add_coupled(bound->pairs.data() + i * SuffixBound::kPairs, bound->pair_count.data() + i,
                    {busy, csum, c0, busy - sb + (r == 0 && l == 0 ? 0.0 : pass.tail_row[layers])});
      }
      continue;
    }
    // Layers [l, e) for e < L (a stage follows), as one row of estimates.
    const int e_end = std::min(layers, e_fit);
    const StageEstimate* xs = cached ? cached + span_index(layers, l, l + 1) : pass.row.data();
    const int e_stop = cached ? e_end : estimate_row(pass, r, s, tp, l, e_end, homo, inside, sb, threshold);
    relax_row_(xs, l + 1, e_stop, std::min(depth, 1 + gpus - r - s), layers, depth, micro_batches, sf, sb, threshold,
               pass.coef.data(), path_data, last_trip_data, first_trip_data,
               bound->index(0, r + s, 0) - 1, path_data + here, last_trip_data + here, first_trip_data + here,
               pass.tail_row.data(), tail_data, tail_data ? tail_data + here : nullptr);
    if (bound->has_pairs()) relax_coupled(pass, r, s, l, xs, e_stop, sf, sb, threshold);
  }
}

namespace {
// The longest of a stage's chains that relax_suffix steps through, outside its inner loop: the stage
// (estimate x, sends sf and sb, busy time `busy`, compute and accumulation `csum`) followed by q - 1 stages
// whose entries are the path h, the first trip g0 and the last trip g: its busy time, the path, the end and
// start paths and the multi-trip chains, from path_coefficients' rows (stride = depth + 1). A multi-trip
// row with no trips is skipped (0 x an infinite entry). Allocates nothing.
double stage_chains(const double* coef, int stride, int q, const StageEstimate& x, double sf, double sb, double busy,
                    double csum, double h, double g0, double g) {
  auto c = [&](int i) { return coef[static_cast<std::size_t>(i) * stride + q]; };
  const double end = c(0) * x.t + c(1) * x.f + c(2) * x.b + c(3) * x.a + sf + sb + g;
  const double start = c(4) * x.t + c(5) * x.f + c(6) * x.b + c(7) * x.a + sf + sb + g0;
  double v = std::max({busy, csum + h, end, start});
  for (int k = 8; k <= 14; k += 6)
    if (c(k + 3) > 0)
      v = std::max(v, c(k) * x.t + c(k + 1) * x.b + c(k + 2) * x.a + c(k + 3) * sf + sb + c(k + 4) * g0 + c(k + 5) * g);
  return v;
}
}  // namespace

// The coupled entries (SuffixBound::Coupled) of the stage [r, r + s) with layers [l, e) for e in
// [l + 1, e_stop), xs[e - l - 1] its estimate: the same steps as relax_suffix (the same stages left out),
// each applied to every kept tuple of the stages after it, so that a way to form the stages keeps its
// own path, trips and tail together.
void SuffixBoundBuilder::relax_coupled(Pass& pass, int r, int s, int l, const StageEstimate* xs, int e_stop, double sf,
                                       double sb, double threshold) const {
  SuffixBound* bound = pass.bound;
  const int layers = space_.layers, depth = space_.max_stages, stride = depth + 1;
  const double md = pass.micro_batches, m1 = pass.micro_batches - 1, acc = pass.micro_batches > 1 ? 1.0 : 0.0;
  const double* coef = pass.coef.data();
  const int q_cap = std::min(depth, 1 + space_.gpus - r - s);
  for (int e = l + 1; e < e_stop; ++e) {
    const StageEstimate x = xs[e - l - 1];
    if (!std::isfinite(x.t)) continue;
    const double busy = md * x.t + m1 * x.a + sb;
    if (busy > threshold || busy - sb + pass.tail_row[e] > threshold) break;
    const double c0 = x.t + sf + sb, csum = c0 + acc * x.a, own = pass.tail_row[e] - sb, fwd = x.f + sf;
    const int q_max = std::min(q_cap, 1 + layers - e);
    for (int q = 2; q <= q_max; ++q) {
      int n = 0;
      const SuffixBound::Coupled* next = bound->coupled(q - 1, r + s, e, &n);
      const std::size_t here = bound->pair_index(q, r, l);
      for (int i = 0; i < n; ++i) {
        const SuffixBound::Coupled& p = next[i];
        const double v = stage_chains(coef, stride, q, x, sf, sb, busy, csum, p.h, p.g0, p.g);
        add_coupled(bound->pairs.data() + here * SuffixBound::kPairs, bound->pair_count.data() + here,
                    {v, csum + p.g, c0 + p.g0, std::max(fwd + p.t, v + own)});
      }
    }
  }
}

bool SuffixBoundBuilder::argmin_stages(int group, const SuffixBound& bound, int q, int r, int l,
                                       std::vector<StageChoice>* out) const {
  if (bound.paths.empty() || !bound.estimator || q < 1 || q > bound.depth) return false;
  const NodeOrder& o = space_.order_of_group(group);
  const StageEstimator& est = *bound.estimator;
  const int micro_batches = space_.micro_batches_of_group(group), micro_batch = space_.gbs / micro_batches;
  const int gpus = space_.gpus, layers = space_.layers;
  const std::vector<double> coef = path_coefficients(simulator_.options().schedule, micro_batches, bound.depth);
  const int stride = bound.depth + 1;
  for (int k = q; k >= 1; --k) {
    if (!std::isfinite(bound.paths[bound.index(k, r, l)])) return false;
    double best = kInf;
    StageChoice pick;
    for (int s = k == 1 ? gpus - r : 1; s <= (k == 1 ? gpus - r : gpus - r - 1); ++s) {
      if (space_.whole_nodes && !o.node_start(r + s)) continue;
      const bool homo = o.homogeneous(r, s);
      for (int tp = 1; tp <= std::min(s, space_.max_tp); ++tp) {
        if (s % tp != 0 || !space_.splits_micro_batch(s / tp, micro_batch) || !o.tp_profiled(r, s, tp)) continue;
        const bool inside = o.tp_inside_nodes(r, s, tp);
        if (!options_.allow_cross_node_tp && !inside) continue;
        double sf, sb;
        est.sends(r, s, tp, homo, &sf, &sb);
        const int e_fit = first_layer_past_memory(tables_.states_row(tp, s / tp, l), o.capacity(r, s), l, layers);
        const int e_lo = k == 1 ? layers : l + 1, e_hi = k == 1 ? layers : std::min(layers - (k - 1), e_fit - 1);
        if (k == 1 && e_fit <= layers) continue;
        const TailRates rate = tails_on_ ? tail_rate(o, r, s, tp) : TailRates();
        for (int e = e_lo; e <= e_hi; ++e) {
          const StageEstimate x = est.estimate(r, s, tp, l, e, homo, inside);
          if (!std::isfinite(x.t)) continue;
          const double busy = micro_batches * x.t + (micro_batches - 1) * x.a + sb;
          double v = busy;
          if (k > 1) {
            const std::size_t next = bound.index(k - 1, r + s, e);
            const double c0 = x.t + sf + sb, csum = c0 + (micro_batches > 1 ? x.a : 0.0);
            v = stage_chains(coef.data(), stride, k, x, sf, sb, busy, csum, bound.paths[next], bound.first_trips[next],
                             bound.last_trips[next]);
            if (!bound.tail_paths.empty())
              v = std::max({v, x.f + sf + bound.tail_paths[next], v - sb + tail_ms(rate, tp, l, e)});
          }
          if (v < best) {
            best = v;
            pick.begin = r;
            pick.size = s;
            pick.st = Strategy{s / tp, tp};
            pick.layer_begin = l;
            pick.layer_end = e;
          }
        }
      }
    }
    if (!std::isfinite(best)) return false;
    out->push_back(pick);
    r += pick.size;
    l = pick.layer_end;
  }
  return r == gpus && l == layers;
}

void SuffixBoundBuilder::finish(SuffixBound* bound) const {
  bound->paths_min = bound->paths;
  if (bound->paths.empty()) return;
  if (!table_fits_) {  // only the last stages' entries: small
    bound->paths_env = bound->paths;
    for (int r = 0; r <= bound->ranks; ++r)
      for (int l = 1; l <= bound->layers; ++l)
        for (int q = 0; q <= bound->depth; ++q) {
          double& cur = bound->paths_env[bound->index(q, r, l)];
          cur = std::min(cur, bound->paths_env[bound->index(q, r, l - 1)]);
        }
  }
  for (int r = 0; r <= bound->ranks; ++r)
    for (int l = bound->layers - 1; l >= 0; --l)
      for (int q = 0; q <= bound->depth; ++q) {
        double& cur = bound->paths_min[bound->index(q, r, l)];
        cur = std::min(cur, bound->paths_min[bound->index(q, r, l + 1)]);
      }
}

}  // namespace hetplan
