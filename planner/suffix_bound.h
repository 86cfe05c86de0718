// SuffixBound: for one (node order, m) group, a lower bound on the time the
// stages still to choose add to any plan (planner/plan_search.md, "the stages
// still to choose"); SuffixBoundBuilder: the dynamic program that fills it, in
// two passes: the entries of one stage (the last), then the deeper ones. Where
// the per-rank table would be too large (!suffix_table_fits), only the
// one-stage entries are built and the throughput bound stands in for the
// deeper ones.
// Thread-safety: a SuffixBound is written by one thread (a builder's call)
// and then only read; a builder's calls for different groups may run at once.
// REQUIRES: everything a builder is given outlives it and the bounds it builds.
#pragma once

#include <algorithm>
#include <atomic>
#include <utility>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "planner/kept_estimates.h"
#include "planner/plan_search.h"
#include "planner/search_control.h"
#include "planner/search_space.h"
#include "planner/shared_bound.h"
#include "planner/stage_estimator.h"

namespace hetplan {

// For one (node order, m): path[q][r][l], a lower bound on the longest of the paths below through the q
// stages covering ranks [r, ranks) and layers [l, layers), each from micro-batch 0's arrival at the first
// of them to the last backward's send back out of it, minimised over every way to form those stages;
// infinity where none exists. The paths: for each stage j of them, the forward chain to j, then either
// all j's compute, or one of the two paths of PathOpCounts (sim/schedule.h) through j and the stages after it, then the
// backward chain back.
struct SuffixBound {
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  std::unique_ptr<stage_estimates::StageEstimator> estimator;  // this (node order, m)'s stage estimates
  int ranks = 0, layers = 0, depth = 0;  // depth: the most stages q the table holds
  std::vector<double> paths;
  std::vector<double> paths_min;  // min over l' >= l of path(q, r, l'): whatever layers the stage before takes
  // last_trips[q][r][l]: a lower bound on micro-batch m - 1's round trip through the q stages (forwards,
  // backwards with accumulation, sends); first_trips the same for micro-batch 0 (no accumulation).
  // Infinity where none exists.
  std::vector<double> last_trips, first_trips;
  // tail_paths[q][r][l] (whole-node tables with tails_on, else empty): a lower bound, over every way to
  // form the q stages, on the time from micro-batch 0's arrival at the first of them to the end of the
  // iteration: for some stage j of them, the forward chain to j (its forwards and sends), then all j's
  // compute, then its gradient all-reduce and optimizer step (SuffixBoundBuilder::tail_rate).
  std::vector<double> tail_paths;
  // paths_env: see path_floor (built where only the last stages' entries are: a small table).
  std::vector<double> paths_env;
  // Without the table (too large): the throughput bound. Stage j's m forwards and backwards take at
  // least gbs x (its layers' least GPU-ms per sample) / (its ranks' GPUs); with each type's costs at
  // least kappa_type times a reference type's, layer by layer, the largest over the stages is at least
  // gbs x the reference's GPU-ms of layers [l, layers) / (sum over ranks [r, ranks) of 1 / kappa):
  // reference_ms holds the reference's prefix sums, inverse_kappa the suffix sums of 1 / kappa. Empty
  // where not built.
  std::vector<double> reference_ms, inverse_kappa;
  double gbs = 0;
  // The coupled entries (planner/plan_search.md, "Coupled entries"): with `with_pairs` (set before the
  // build; whole-node tables with tails only), per (q, node position of r, l) at most kPairs tuples
  // (path, last trip, first trip, tail path) such that every way to form those q stages that the scalar
  // entries range over has its own four values each at least those of one kept tuple. A tuple is each
  // value of one way to form the stages, or the componentwise least of several (when more than kPairs
  // are not dominated); the scalar entries are the componentwise least of all of them.
  struct Coupled {
    double h, g, g0, t;
  };
  static constexpr int kPairs = 6;
  bool with_pairs = false;
  int pair_depth = 0;
  std::vector<int> pair_pos;  // [rank]: its index among the node starts (the end included), or -1
  std::vector<Coupled> pairs;
  std::vector<unsigned char> pair_count;
  std::size_t pair_index(int q, int r, int l) const {
    return (static_cast<std::size_t>(pair_pos[r]) * (layers + 1) + l) * (pair_depth + 1) + q;
  }
  bool has_pairs() const { return with_pairs && !pairs.empty(); }
  // The kept tuples of (q, r, l) (q >= 1, r a node start); *n their number (0: no way exists).
  const Coupled* coupled(int q, int r, int l, int* n) const {
    const std::size_t i = pair_index(q, r, l);
    *n = pair_count[i];
    return pairs.data() + i * kPairs;
  }

  // [r][l][q]: the dynamic program's inner loop runs over q, contiguous.
  std::size_t index(int q, int r, int l) const {
    return (static_cast<std::size_t>(r) * (layers + 1) + l) * (depth + 1) + q;
  }
  // Entries q > depth are not in the table (it holds only the last stages where the whole one would be
  // too large): the throughput bound stands in for them.
  double last_trip(int q, int r, int l) const {
    return last_trips.empty() || q == 0 || q > depth ? 0 : last_trips[index(q, r, l)];
  }
  double first_trip(int q, int r, int l) const {
    return first_trips.empty() || q == 0 || q > depth ? 0 : first_trips[index(q, r, l)];
  }
  double least_path_from(int q, int r, int l) const {
    if (paths_min.empty() || q > depth) return throughput_bound(r, std::max(l, layers - q));  // each takes a layer
    return paths_min[index(q, r, l)];
  }
  double tail_path(int q, int r, int l) const {
    return tail_paths.empty() || q == 0 || q > depth ? 0 : tail_paths[index(q, r, l)];
  }
  double path(int q, int r, int l) const {
    return paths.empty() || q > depth ? throughput_bound(r, l) : paths[index(q, r, l)];
  }
  // A lower bound on path(q, r, l') for every l' <= l, non-increasing in l: the least k whose
  // path(q, r, l + k) can be small enough is found by bisection. The throughput bound is itself
  // non-increasing in l; in the table, paths_env; else -infinity (no test).
  double path_floor(int q, int r, int l) const {
    if (paths.empty() || q > depth) return inverse_kappa.empty() ? -kInf : throughput_bound(r, l);
    return paths_env.empty() ? -kInf : paths_env[index(q, r, l)];
  }
  double throughput_bound(int r, int l) const {
    if (inverse_kappa.empty() || l >= layers) return 0;
    const double rate = inverse_kappa[r];
    return rate > 0 && std::isfinite(rate) ? gbs * (reference_ms[layers] - reference_ms[l]) / rate : 0.0;
  }
  // Frees the tables and the estimator: once the group's units are done, the next group's tables reuse
  // the memory instead of faulting in fresh pages.
  void release() {
    for (std::vector<double>* v : {&paths, &paths_min, &paths_env, &last_trips, &first_trips, &tail_paths})
      std::vector<double>().swap(*v);
    std::vector<Coupled>().swap(pairs);
    std::vector<unsigned char>().swap(pair_count);
    std::vector<int>().swap(pair_pos);
    with_pairs = false;
    estimator.reset();
  }
};

// Adds candidate c to the kept tuples set[0, *n) of one coupled entry (SuffixBound::Coupled, at most
// kPairs): nothing where a kept tuple is at most c in all four values; else the kept tuples at least c in
// all four leave, and c joins; where kPairs are kept already, c is merged (the componentwise least) into
// the kept tuple nearest it. Every tuple covered before (at least some kept tuple in all four) stays
// covered, and c is covered after. REQUIRES: set has room for kPairs; *n <= kPairs.
void add_coupled(SuffixBound::Coupled* set, unsigned char* n, const SuffixBound::Coupled& c);

// The throughput bound's per-type data: kappa[type], the least ratio over the layers of the type's least
// GPU-ms per sample to type 0's, and type 0's prefix sums of it. Empty where a type has a layer with no
// profile.
struct ThroughputRates {
  std::vector<double> kappa, reference;
};
// [type][layer]: the least GPU-ms per sample of the layer on the type over its profiles (infinity where
// it has none).
std::vector<std::vector<double>> least_gpu_ms_per_sample(const SearchSpace& space, const ProfileSet& profiles,
                                                          const Cluster& cluster);
ThroughputRates throughput_rates(const SearchSpace& space, const ProfileSet& profiles, const Cluster& cluster);

// The data-parallel synchronisation a stage's setting costs, coupled over the settings (planner/plan_search.md,
// "Settings coupled in the tails"). `c` holds PlanCostModel::stage's costs of one stage for every setting of
// `cost` (`setups` of them).
// zero_pass_sync_ms: the ZeRO collectives that setting k puts into one micro-batch's forward and backward
// (ZeRO-2's reduce-scatter, ZeRO-3's gathers): its forward + backward less that of a setting with ZeRO 0 or
// 1 and the same recomputation (whose passes hold no collective; the setups differ in nothing else), or 0
// where the settings hold no such partner.
double zero_pass_sync_ms(const PlanCostModel& cost, const FastStageCost* c, int setups, int k);
// The least over the settings (those that fit, with `fitting_only`) of the all-reduce, the optimizer step
// and zero_pass_sync_ms: under every setting, a stage runs at least that much data-parallel work beyond
// its compute without collectives, the ZeRO-2/3 part once per micro-batch (counted once here), the rest
// after its last backward. Infinity where no setting is left.
double least_sync_ms(const PlanCostModel& cost, const FastStageCost* c, int setups, bool fitting_only);

// A lower bound on a stage's all-reduce, collectives and optimizer step (SuffixBoundBuilder::tail_rate), as
// rates per parameter on a rank and per parameter byte, for the settings without ZeRO (index 0) and with
// ZeRO (index 1): at(params, bytes) is the least of the two (a class without settings copies the other).
struct TailRates {
  double sync[2] = {0, 0}, step[2] = {0, 0};
  double at(double params, double bytes) const {
    return std::min(sync[0] * params + step[0] * bytes, sync[1] * params + step[1] * bytes);
  }
};

// Whether the per-rank table of every group fits suffix_table_limit.
bool suffix_table_fits(const SearchSpace& space, const Cluster& cluster, double suffix_table_limit);

class SuffixBoundBuilder {
 public:
  // `throughput` may be empty (no throughput bound).
  SuffixBoundBuilder(const SearchSpace& space, const FeasibilityTables& tables, KeptEstimates& kept,
                     const ThroughputRates& throughput, const SharedBound& shared, SearchControl& control,
                     const ProfileSet& profiles, const Cluster& cluster, const PlanSimulator& simulator,
                     const PlanSearchOptions& options, bool table_fits);

  bool cross_node_tp() const { return options_.allow_cross_node_tp; }
  Schedule schedule() const { return simulator_.options().schedule; }
  // Creates the group's estimator and its table, and fills the entries of one stage (exact).
  void build_last_stages(int group, SuffixBound* bound) const;
  // Fills the group's entries of two stages and more. These leave out every stage whose own compute
  // exceeds the pruning threshold at the time: a plan with such a stage costs more than the threshold
  // (which only falls), and the entries stay lower bounds on every plan made of the stages kept.
  void build_deeper(int group, SuffixBound* bound) const;
  // The minima over the layers (paths_min, paths_env) from the entries.
  void finish(SuffixBound* bound) const;

  // The stages of a way to form the q stages from rank r and layer l that attains the table's path(q, r,
  // l) (the dynamic program's argmin, followed stage by stage: at each step the stage, (dp, tp) and last
  // layer whose step gives the least value, read from the finished entries after it), appended to
  // `out` in rank order. Each stage is one the table admits (its layers' model states fit its ranks, its
  // estimate is known). False where path(q, r, l) is infinite or the table is not built that deep.
  // REQUIRES: build_deeper (or build_last_stages for q = 1) and the estimator still held.
  bool argmin_stages(int group, const SuffixBound& bound, int q, int r, int l, std::vector<StageChoice>* out) const;

  // Whether the tables carry tail_paths: whole-node stages, every setting's all-reduce and optimizer step
  // of the plain kind tail_rate bounds (no overlap, DDP, DeepSpeed buffers, offload or LoRA).
  bool tails_on() const { return tails_on_; }
  // A lower bound on the all-reduce, ZeRO collectives and optimizer step (ms) under every setting of stage
  // [r, r + s) at (s / tp, tp) with layers [l, e) of a pipeline of two stages or more (`l`, `e` not 0 and the
  // layers both): rates.at(its parameters on a rank, its layers' parameter bytes). Per class of settings
  // (without ZeRO; with it), the rates are the least over the class of the stage's costs with every layer
  // (PlanCostModel::stage; the sync part least_sync_ms's, without the step, and of a ZeRO-3 setting only
  // the all-gather and reduce-scatter every stage's passes hold at least) over those two sizes: each
  // collective's time is the slowest of its tp slices of the least of ring, tree and hierarchical, each
  // made of affine functions of the bytes with non-negative terms, so its time per byte only falls as the
  // bytes grow, and it is at least its value at the whole model's bytes scaled down; the step's time is
  // proportional to the layers' bytes (planner/plan_search.md). Computed once per (node order, r, s, tp).
  // Thread-safe. REQUIRES: tails_on().
  TailRates tail_rate(const NodeOrder& o, int r, int s, int tp) const;
  double tail_ms(const TailRates& rates, int tp, int l, int e) const {
    return rates.at(tail_params(tp, l, e), tail_bytes(l, e));
  }
  // Parameters on a rank of layers [l, e) at tp in a pipeline of two or more stages; their bytes.
  double tail_params(int tp, int l, int e) const { return tail_params_[tp][e] - tail_params_[tp][l]; }
  double tail_bytes(int l, int e) const { return tail_bytes_[e] - tail_bytes_[l]; }

  // The builds of the dynamic program's rows (relax_row in suffix_bound.cc): one for this CPU.
  using RelaxRow = void (*)(const stage_estimates::StageEstimate*, int, int, int, int, int, int, double, double,
                            double, const double*, const double*, const double*, const double*, std::size_t, double*,
                            double*, double*, const double*, const double*, double*);

 private:
  struct Pass;
  void relax(int group, SuffixBound* bound, bool last_stages) const;
  void relax_stage(Pass& pass, int r, int s, int tp) const;
  void relax_coupled(Pass& pass, int r, int s, int l, const stage_estimates::StageEstimate* xs, int e_stop, double sf,
                     double sb, double threshold) const;
  int estimate_row(Pass& pass, int r, int s, int tp, int l, int e_end, bool homo, bool inside, double sb,
                   double threshold) const;

  const SearchSpace& space_;
  const FeasibilityTables& tables_;
  KeptEstimates& kept_;
  const ThroughputRates& throughput_;
  const SharedBound& shared_;
  SearchControl& control_;
  const ProfileSet& profiles_;
  const Cluster& cluster_;
  const PlanSimulator& simulator_;
  const PlanSearchOptions& options_;
  const bool table_fits_;
  const bool full_params_;  // every setup trains every parameter (accumulation is not scaled down)
  const bool tails_on_;
  const RelaxRow relax_row_;
  // tail_rate's data: [tp][layer] prefix sums of a rank's parameters (pipeline of two stages or more),
  // the prefix sums of the layers' bytes, their whole-model values (one stage), and per node order the
  // rates by (position of r, position of r + s, tp), kRateFields each, NaN until computed.
  std::vector<std::vector<double>> tail_params_;
  std::vector<double> tail_bytes_, full_params_on_rank_;
  double full_bytes_ = 0;
  std::vector<std::vector<int>> position_;  // [order][rank]: its index among the order's stage starts, or -1
  std::vector<int> positions_;              // [order]: stage starts (the end included)
  static constexpr int kRateFields = 4;  // TailRates: sync[0], sync[1], step[0], step[1]
  std::vector<std::unique_ptr<std::atomic<double>[]>> rates_;
};

}  // namespace hetplan
