#include "planner/suffix_bound.h"

#include <algorithm>
#include <cmath>

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

// The steps of the dynamic program for a stage at one (dp, tp) starting at one layer l and ending at
// each layer e in [e_begin, e_end) in turn (xs[e - e_begin] its estimate; a stage with no stage after it
// is not here): paths, last_trips and first_trips are the tables, `next0` the index of (q = -1, the rank
// after the stage, layer 0), so that the entries q - 1 after a stage ending at e start at
// next0 + e (depth + 1); hc/gc/g0c the stage's own entries. A stage whose busy time is above `threshold`
// ends the walk (its time and accumulation only grow with its layers); one with no estimate (a missing
// profile) is skipped. One call per row, so the dynamic program's inner loops are all in the AVX2 build.
[[gnu::always_inline]] inline void relax_row_body(const StageEstimate* xs, int e_begin, int e_end, int q_cap,
                                                  int layers, int depth, int micro_batches, double sf, double sb,
                                                  double threshold, const double* coef, const double* paths,
                                                  const double* last_trips, const double* first_trips,
                                                  std::size_t next0, double* hc, double* gc, double* g0c) {
  const double md = micro_batches, m1 = micro_batches - 1, acc = micro_batches > 1 ? 1.0 : 0.0;
  for (int e = e_begin; e < e_end; ++e) {
    const StageEstimate x = xs[e - e_begin];
    if (!std::isfinite(x.t)) continue;
    const double busy = md * x.t + m1 * x.a + sb;
    if (busy > threshold) break;
    const double c0 = x.t + sf + sb, csum = c0 + acc * x.a;
    // (The stages after it number at most min(ranks - r - s, layers - e).)
    const int q_max = std::min(q_cap, 1 + layers - e);
    const std::size_t next = next0 + static_cast<std::size_t>(e) * (depth + 1);
    relax_suffix(q_max, coef, depth + 1, x, busy, csum, c0, sf + sb, paths + next, last_trips + next,
                 first_trips + next, hc, gc, g0c);
  }
}

#define HETPLAN_RELAX_ROW_ARGS                                                                                    \
  const StageEstimate *xs, int e_begin, int e_end, int q_cap, int layers, int depth, int micro_batches, double sf, \
      double sb, double threshold, const double *coef, const double *paths, const double *last_trips,            \
      const double *first_trips, std::size_t next0, double *hc, double *gc, double *g0c
#define HETPLAN_RELAX_ROW_CALL                                                                                    \
  relax_row_body(xs, e_begin, e_end, q_cap, layers, depth, micro_batches, sf, sb, threshold, coef, paths,        \
                 last_trips, first_trips, next0, hc, gc, g0c)
void relax_row_plain(HETPLAN_RELAX_ROW_ARGS) { HETPLAN_RELAX_ROW_CALL; }
#ifdef HETPLAN_AVX2_BUILD
__attribute__((target("avx2"))) void relax_row_avx2(HETPLAN_RELAX_ROW_ARGS) { HETPLAN_RELAX_ROW_CALL; }
#endif
#undef HETPLAN_RELAX_ROW_CALL
#undef HETPLAN_RELAX_ROW_ARGS

// The build of relax_row for this CPU.
SuffixBoundBuilder::RelaxRow pick_relax_row() {
#ifdef HETPLAN_AVX2_BUILD
  if (CPU_FEATURE_ACTIVE(AVX2)) return relax_row_avx2;
#endif
  return relax_row_plain;
}

// Per q (stages from this one to the last), each path's counts as coefficients of t, f, b and a
// (StageEstimate::runs), so that the inner loop over q is straight-line arithmetic: 8 rows of depth + 1,
// the end path's t, f, b, a, then the start path's (see relax_suffix).
std::vector<double> path_coefficients(Schedule schedule, int micro_batches, int depth) {
  std::vector<double> coef(static_cast<std::size_t>(8) * (depth + 1), 0.0);
  double* row[8];
  for (int i = 0; i < 8; ++i) row[i] = coef.data() + static_cast<std::size_t>(i) * (depth + 1);
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
  std::vector<double> hs = std::move(bound->paths), gs = std::move(bound->last_trips), g0s = std::move(bound->first_trips);
  bound->depth = depth;
  bound->paths.assign(static_cast<std::size_t>(depth + 1) * (bound->ranks + 1) * (bound->layers + 1), kInf);
  bound->last_trips.assign(bound->paths.size(), kInf);
  bound->first_trips.assign(bound->paths.size(), kInf);
  for (int r = 0; r <= bound->ranks; ++r)
    for (int l = 0; l <= bound->layers; ++l)
      for (int q = 0; q <= q_small; ++q) {
        const std::size_t from = (static_cast<std::size_t>(r) * (bound->layers + 1) + l) * (q_small + 1) + q,
                          to = bound->index(q, r, l);
        bound->paths[to] = hs[from];
        bound->last_trips[to] = gs[from];
        bound->first_trips[to] = g0s[from];
      }
}

}  // namespace

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
      relax_row_(pick_relax_row()) {}

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
            std::vector<StageEstimate>(space_.layers)};
  for (int r = gpus - 1; r >= 0; --r) {
    if (space_.whole_nodes && !o.node_start(r)) continue;
    if (!last_stages && control_.check_stop()) return;
    for (int s = last_stages ? gpus - r : 1; s <= (last_stages ? gpus - r : gpus - r - 1); ++s) {
      if (space_.whole_nodes && !o.node_start(r + s)) continue;
      for (int tp = 1; tp <= std::min(s, space_.max_tp); ++tp) {
        if (s % tp != 0 || s / tp > pass.micro_batch || !o.tp_profiled(r, s, tp)) continue;
        relax_stage(pass, r, s, tp);
      }
    }
  }
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
  for (int l = 0; l < layers; ++l) {
    const std::size_t here = bound->index(0, r, l);
    const int e_fit = first_layer_past_memory(tables_.states_row(tp, s / tp, l), capacity, l, layers);
    if (e_fit == l + 1) continue;  // not even layer l alone fits
    if (ends_ranks) {  // the last stage: its entries q = 1
      if (e_fit <= layers) continue;
      const StageEstimate x = cached ? cached[span_index(layers, l, layers)] : est.estimate(r, s, tp, l, layers, homo, inside);
      if (!std::isfinite(x.t)) continue;
      const double busy = micro_batches * x.t + (micro_batches - 1) * x.a + sb;
      const double c0 = x.t + sf + sb, csum = c0 + (micro_batches > 1 ? x.a : 0.0);
      path_data[here + 1] = std::min(path_data[here + 1], busy);
      last_trip_data[here + 1] = std::min(last_trip_data[here + 1], csum);
      first_trip_data[here + 1] = std::min(first_trip_data[here + 1], c0);
      continue;
    }
    // Layers [l, e) for e < L (a stage follows), as one row of estimates.
    const int e_end = std::min(layers, e_fit);
    const StageEstimate* xs = cached ? cached + span_index(layers, l, l + 1) : pass.row.data();
    if (!cached)
      for (int e = l + 1; e < e_end; ++e) pass.row[e - l - 1] = est.estimate(r, s, tp, l, e, homo, inside);
    relax_row_(xs, l + 1, e_end, std::min(depth, 1 + gpus - r - s), layers, depth, micro_batches, sf, sb, threshold, pass.coef.data(), path_data, last_trip_data, first_trip_data,
               bound->index(0, r + s, 0) - 1, path_data + here, last_trip_data + here, first_trip_data + here);
  }
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
