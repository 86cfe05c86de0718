#include "planner/stage_search.h"

#include "planner/export_plan.h"
#include "planner/seed_plans.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "sim/schedule.h"

namespace hetplan {

using stage_estimates::span_index;
using stage_estimates::StageEstimate;
using stage_estimates::StageEstimator;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPolishS = 0.1;  // time limit of one polish of a new best plan
}  // namespace

StageCache::StageCache(int setups, std::size_t bytes) : setups_(setups) {
  std::size_t n = 1024;
  while (n * 2 * (sizeof(Key) + setups * sizeof(FastStageCost)) <= bytes) n *= 2;
  mask_ = n - 1;
  keys_.reset(static_cast<Key*>(std::calloc(n, sizeof(Key))));
  vals_.reset(static_cast<FastStageCost*>(std::calloc(n * setups, sizeof(FastStageCost))));
  if (!keys_ || !vals_) throw std::bad_alloc();
}

// The depth-first search of one unit on one worker: stage i starts at rank r and layer l.
class UnitSearch {
 public:
  UnitSearch(const StageSearch& search, Worker& w, const Unit& u)
      : s_(search),
        control_(search.control_),
        shared_(search.shared_),
        tables_(search.tables_),
        kept_(search.kept_),
        w_(w),
        count_(w.counters.own),
        u_(u),
        o_(search.space_.orders[u.order]),
        sb_(search.bounds_[u.group]),
        est_(*search.bounds_[u.group].estimator),
        use_bounds_(search.use_bounds_),
        schedule_(search.schedule_),
        v_(search.schedule_ == Schedule::kInterleaved1F1B ? search.virtual_stages_ : 1),
        chain_bounds_(use_bounds_ && v_ == 1),
        busy_bound_(use_bounds_ && (v_ == 1 || !any_offload(search.space_))),
        stages_(u.stages),
        micro_batches_(u.micro_batches),
        micro_batch_(search.space_.gbs / u.micro_batches),
        setups_(search.space_.num_setups()),
        layers_(search.space_.layers),
        gpus_(search.space_.gpus),
        max_tp_(search.space_.max_tp),
        cacheable_(search.space_.layers < 1024 && search.space_.max_tp < 256),
        whole_nodes_(search.space_.whole_nodes),
        allow_cross_node_tp_(search.options_.allow_cross_node_tp),
        trip_slots_(chain_bounds_ ? std::clamp(most_trips(schedule_, 1, micro_batches_), 0, int{Worker::kTripSlots}) : 0) {}

  void run() {
    // Interleaving (Megatron's rule, sim/schedule.h): pp >= 2 and the micro-batches a multiple of pp.
    if (v_ > 1 && (stages_ < 2 || micro_batches_ % stages_ != 0)) return;
    start_state();
    descend(0, 0, 0);
  }

  // Offloading's exposed copies are not additive over a stage's chunks (sim/offload.h).
  static bool any_offload(const SearchSpace& space) {
    for (const TrainingSetup& q : space.setups)
      if (q.offload_optimizer || q.offload_params) return true;
    return false;
  }

 private:
  // What stage i's choices share: where it starts, its sizes and layer counts, and the prefix's bounds,
  // each the least over the settings still feasible (each term's least: their sum is at most every
  // setting's).
  struct Frame {
    int i, r, l;
    bool last;
    int rest;  // stages after this one
    int s_min, s_max, k_min, k_max;
    double passes = kInf, first_passes = kInf, lower_bound = kInf, end_extra = kInf, start_extra = kInf, tail;
    PathOpCounts end, start;
    MultiTripCounts trips[2];  // the stage's multi-trip chains (sim/schedule.h): the most trips, and two
    int backwards_before_last;  // backwards before micro-batch m - 1's forward
  };
  // Stage i at one (dp, tp) on ranks [r, r + s): what its layer counts share.
  struct Shape {
    int s, tp, dp;
    bool homo, inside;
    double send_fw = 0, send_bw = 0;
    const StageEstimate* kept = nullptr;
    const double* states = nullptr;  // least model-state bytes per last layer, or nullptr
    double capacity = kInf;
  };
  enum class Next { kContinue, kBreak, kStop };  // the next layer count, the next shape, or stop
  enum class Verdict { kKeep, kPrune, kPruneMoreLayers };  // kPruneMoreLayers: and every larger layer count

  void start_state();
  void descend(int i, int r, int l);
  Frame frame(int i, int r, int l) const;
  bool try_shape(const Frame& f, int s, int tp, bool homo);
  // --uniform: stage i at (dp, tp) as Megatron-LM and DeepSpeed run it (planner/export_plan.h).
  bool uniform_grid(int i, int dp, int tp) const {
    return exporter_micro_batch_splits(micro_batch_, dp / s_.space_.cp) &&
           (i == 0 || exporter_grid_matches(w_.choices[0].st, Strategy{dp, tp}));
  }
  int first_layer_count(const Frame& f, const Shape& sh);
  Next try_layers(const Frame& f, const Shape& sh, int k);
  Verdict test_bounds(const Frame& f, const Shape& sh, int k);
  bool cost_stage(const Frame& f, const Shape& sh, int k);
  unsigned advance(const Frame& f, const Shape& sh, int k, double* bound_min);
  void note_states_out_of_memory(const Frame& f, const Shape& sh, int k);
  void note_out_of_memory(const Frame& f, const FastStageCost* sc);
  void leaf();
  void keep_plan(double cost, int setup);

  const StageSearch& s_;
  SearchControl& control_;
  SharedBound& shared_;
  const FeasibilityTables& tables_;
  KeptEstimates& kept_;
  Worker& w_;
  Counters& count_;
  const Unit& u_;
  const NodeOrder& o_;
  const SuffixBound& sb_;
  const StageEstimator& est_;
  const bool use_bounds_;
  const Schedule schedule_;
  // Interleaved 1F1B (v_ > 1): the chains the bounds follow (micro-batch 0's passes through whole
  // stages, the suffix bound's paths) are not the interleaved pipeline's, whose micro-batches cross a
  // stage chunk by chunk: those bounds are off (chain_bounds_). What stays is that a stage runs all its
  // chunks' compute, then its all-reduce and optimizer: a chunk costs as a stage of its layers, and a
  // stage's costs add up over layers (its slowest replica's over chunks at least its slowest over the
  // whole stage), so its whole-stage busy time is a lower bound (busy_bound_; less a relative 1e-9 for
  // the sums' rounding).
  const int v_;
  const bool chain_bounds_, busy_bound_;
  const int stages_, micro_batches_, micro_batch_, setups_, layers_, gpus_, max_tp_;
  const bool cacheable_, whole_nodes_, allow_cross_node_tp_;
  // The multi-trip chains' slots in trip_extra: h from 1 to the most trips of the stage before the last
  // (the most of any stage), at most Worker::kTripSlots of them (chains of more trips are left out: a
  // bound without them is still a bound); 0 without the chain bounds.
  const int trip_slots_;
};

// Stage i's entries are written when stage i - 1 is chosen: only stage 0's need a value.
void UnitSearch::start_state() {
  const std::size_t n = static_cast<std::size_t>(stages_ + 1) * setups_;
  w_.stage_costs.resize(static_cast<std::size_t>(stages_) * setups_);
  for (std::vector<double>* v :
       {&w_.forward_chain, &w_.passes, &w_.lower_bound, &w_.end_extra, &w_.first_passes, &w_.start_extra}) {
    if (v->size() < n) v->resize(n);
    std::fill(v->begin(), v->begin() + setups_, v == &w_.start_extra ? -kInf : 0.0);
  }
  w_.feasible_setups.resize(stages_ + 1);
  if (w_.trip_extra.size() < n * Worker::kTripSlots) w_.trip_extra.resize(n * Worker::kTripSlots);
  std::fill(w_.trip_extra.begin(), w_.trip_extra.begin() + static_cast<std::size_t>(setups_) * Worker::kTripSlots, -kInf);
  w_.choices.resize(stages_);
  w_.leaf_costs.resize(stages_);
  if (v_ > 1) {
    w_.chunk_costs.resize(static_cast<std::size_t>(stages_) * v_ * setups_);
    w_.leaf_chunks.resize(static_cast<std::size_t>(stages_) * v_);
  }
  w_.feasible_setups[0] = setups_ >= 32 ? 0xffffffffu : ((1u << setups_) - 1);
}

[[gnu::always_inline]] inline UnitSearch::Frame UnitSearch::frame(int i, int r, int l) const {
  Frame f;
  f.i = i;
  f.r = r;
  f.l = l;
  f.last = i == stages_ - 1;
  f.rest = stages_ - 1 - i;
  f.s_max = i == 0 ? u_.first_size : f.last ? gpus_ - r : gpus_ - r - f.rest;
  f.s_min = i == 0 ? u_.first_size : f.last ? gpus_ - r : 1;
  f.k_max = i == 0 && u_.first_layers > 0 ? u_.first_layers : f.last ? layers_ - l : layers_ - l - f.rest;
  f.k_min = i == 0 && u_.first_layers > 0 ? u_.first_layers : f.last ? layers_ - l : 1;
  if (v_ > 1) {
    // Interleaved: every stage at least v blocks (stage_blocks, sim/schedule.h), the head's stage one
    // layer more; none to try where the fixed counts fall short.
    if (!f.last) f.k_max = std::min(f.k_max, layers_ - l - f.rest * v_ - 1);
    if (!(i == 0 && u_.first_layers > 0) && !f.last) f.k_min = std::max(f.k_min, v_ + (l == 0 ? 1 : 0));
    if (stage_blocks(l, l + f.k_min, layers_) < v_ || (f.last && stage_blocks(l, layers_, layers_) < v_))
      f.k_max = f.k_min - 1;
  }
  f.tail = i == 0 ? 0.0 : kInf;
  for (int q = 0; q < setups_; ++q)
    if (w_.feasible_setups[i] & (1u << q)) {
      const std::size_t at = static_cast<std::size_t>(i) * setups_ + q;
      f.passes = std::min(f.passes, w_.passes[at]);
      f.first_passes = std::min(f.first_passes, w_.first_passes[at]);
      f.lower_bound = std::min(f.lower_bound, w_.lower_bound[at]);
      f.end_extra = std::min(f.end_extra, w_.end_extra[at]);
      f.start_extra = std::min(f.start_extra, w_.start_extra[at]);
      if (i > 0) f.tail = std::min(f.tail, w_.stage_costs[q].allreduce_ms + w_.stage_costs[q].optimizer_ms);
    }
  f.end = end_path_counts(schedule_, f.rest, micro_batches_);
  f.start = start_path_counts(schedule_, f.rest, micro_batches_);
  f.backwards_before_last = f.end.backwards - 1;
  f.trips[0] = multi_trip_counts(schedule_, f.rest, micro_batches_, 0);
  f.trips[1] = multi_trip_counts(schedule_, f.rest, micro_batches_, 2);
  return f;
}

void UnitSearch::descend(int i, int r, int l) {
  if (control_.stopped()) return;
  if (control_.every_so_often(w_.counters)) return;
  if (i == stages_) {
    leaf();
    return;
  }
  const Frame f = frame(i, r, l);
  for (int s = f.s_min; s <= f.s_max; ++s) {
    if (whole_nodes_ && !o_.node_start(r + s)) continue;
    // Whatever layers this stage takes, the ranks after it cannot finish in time.
    if (chain_bounds_ && !f.last &&
        f.passes + sb_.least_path_from(f.rest, r + s, l + f.k_min) + f.tail > shared_.threshold()) {
      ++count_.enumerated;
      ++count_.pruned;
      continue;
    }
    const bool homo = o_.homogeneous(r, s);
    for (int tp = 1; tp <= std::min(s, max_tp_); ++tp)
      if (!try_shape(f, s, tp, homo)) return;
  }
}

// Stage i on ranks [r, r + s) at tp, every layer count. False: the search stops.
[[gnu::always_inline]] inline bool UnitSearch::try_shape(const Frame& f, int s, int tp, bool homo) {
  if (s % tp != 0) return true;
  const int dp = s / tp;
  if (!s_.space_.splits_micro_batch(dp, micro_batch_)) return true;  // every (cp group of) replica(s) trains a sample
  if (!o_.tp_profiled(f.r, s, tp)) return true;
  const bool inside = o_.tp_inside_nodes(f.r, s, tp);
  if (!allow_cross_node_tp_ && !inside) return true;
  if (s_.options_.uniform && !uniform_grid(f.i, dp, tp)) return true;
  Shape sh{s, tp, dp, homo, inside};
  // The least model-state bytes of layers [l, l + k) on these ranks, against their least memory.
  sh.states = tables_.states_row(tp, dp, f.l);
  sh.capacity = sh.states ? o_.capacity(f.r, s) : kInf;
  if (chain_bounds_) {
    est_.sends(f.r, s, tp, homo, &sh.send_fw, &sh.send_bw);
    sh.kept = kept_.get(o_, est_, f.r, s, tp, micro_batch_, homo, inside);
  }
  for (int k = first_layer_count(f, sh); k <= f.k_max; ++k) {
    const Next next = try_layers(f, sh, k);
    if (next == Next::kStop) return false;
    if (next == Next::kBreak) break;
  }
  return true;
}

// The least layer count worth trying: skips the layer counts that leave the stages after this one too
// much to do, by bisection on a bound non-increasing in k (each skipped k would be pruned by
// test_bounds: it is at least passes + that bound + tail).
[[gnu::always_inline]] inline int UnitSearch::first_layer_count(const Frame& f, const Shape& sh) {
  if (!chain_bounds_ || f.last || f.k_max <= f.k_min) return f.k_min;
  const double thr = shared_.threshold();
  int lo = f.k_min, hi = f.k_max + 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (f.passes + sb_.path_floor(f.rest, f.r + sh.s, f.l + mid) + f.tail > thr) lo = mid + 1;
    else hi = mid;
  }
  count_.enumerated += lo - f.k_min;
  count_.pruned += lo - f.k_min;
  return lo;
}

// Stage i with layers [l, l + k).
[[gnu::always_inline]] inline UnitSearch::Next UnitSearch::try_layers(const Frame& f, const Shape& sh, int k) {
  ++count_.enumerated;
  if (control_.every_so_often(w_.counters)) return Next::kStop;
  if (sh.states && sh.states[f.l + k] > sh.capacity) {
    // No setting fits, nor with more layers (the states only grow with them): the cheap test before
    // the cost model's per-rank memory.
    note_states_out_of_memory(f, sh, k);
    return Next::kBreak;
  }
  if (chain_bounds_) {
    const Verdict verdict = test_bounds(f, sh, k);
    if (verdict == Verdict::kPruneMoreLayers) return Next::kBreak;
    if (verdict == Verdict::kPrune) return Next::kContinue;
  }
  if (!cost_stage(f, sh, k)) return Next::kContinue;
  double bound_min = kInf;
  const unsigned feasible = advance(f, sh, k, &bound_min);
  if (feasible == 0) {
    note_out_of_memory(f, &w_.stage_costs[static_cast<std::size_t>(f.i) * setups_]);
    return Next::kContinue;
  }
  if (use_bounds_ && bound_min > shared_.threshold()) {
    ++count_.pruned;
    return Next::kContinue;
  }
  w_.feasible_setups[f.i + 1] = feasible;
  descend(f.i + 1, f.r + sh.s, f.l + k);
  if (control_.stopped()) return Next::kStop;
  return Next::kContinue;
}

// The bounds on every plan with stage i of layers [l, l + k), on the stage's estimate.
[[gnu::always_inline]] inline UnitSearch::Verdict UnitSearch::test_bounds(const Frame& f, const Shape& sh, int k) {
  const int micro_batches = micro_batches_, rest = f.rest, r = f.r, s = sh.s, l = f.l;
  const double thr = shared_.threshold();
  const StageEstimate x = sh.kept ? sh.kept[span_index(layers_, l, l + k)]
                                  : est_.estimate(r, s, sh.tp, l, l + k, sh.homo, sh.inside);
  const double c0 = x.t + sh.send_fw + sh.send_bw, csum = c0 + (micro_batches > 1 ? x.a : 0.0);
  // This stage's own compute only grows with k.
  if (std::max(f.lower_bound, f.passes + sh.send_bw + micro_batches * x.t + (micro_batches - 1) * x.a + f.tail) > thr) {
    ++count_.pruned;
    return Verdict::kPruneMoreLayers;
  }
  const double last_trip = sb_.last_trip(rest, r + s, l + k), first_trip = sb_.first_trip(rest, r + s, l + k);
  const double own_end = x.runs(f.end.forwards, f.end.backwards) + f.end.accumulations * x.a + sh.send_fw + sh.send_bw;
  const double own_start =
      x.runs(f.start.forwards, f.start.backwards) + f.start.accumulations * x.a + sh.send_fw + sh.send_bw;
  const double path = std::max({f.passes + (f.last ? 0.0 : sb_.path(rest, r + s, l + k)) + csum,
                                f.passes + std::max(f.end_extra + csum, own_end) + last_trip, f.passes + own_start + first_trip,
                                f.start_extra + f.first_passes + c0 + first_trip});
  if (path + f.tail > thr) {
    ++count_.pruned;
    return Verdict::kPrune;
  }
  return Verdict::kKeep;
}

// Stage i's choice and its costs (every setup's) into the worker's state, from the cache where it
// holds them. False: the stage is infeasible (noted).
[[gnu::always_inline]] inline bool UnitSearch::cost_stage(const Frame& f, const Shape& sh, int k) {
  const int i = f.i;
  StageChoice& c = w_.choices[i];
  c.begin = f.r;
  c.size = sh.s;
  c.st = Strategy{sh.dp, sh.tp};
  c.layer_begin = f.l;
  c.layer_end = f.l + k;
  FastStageCost* sc = &w_.stage_costs[static_cast<std::size_t>(i) * setups_];
  std::string why;
  const StageCache::Key ck = cacheable_ ? StageCache::key(u_.group, f.r, sh.s, sh.tp, f.l, f.l + k, i == 0, f.last,
                                                          in_flight_microbatches(schedule_, stages_, i, micro_batches_, v_),
                                                          v_ > 1 ? stages_ : 0)
                                        : StageCache::Key{};
  bool hit = false;
  FastStageCost* cached = cacheable_ ? w_.cache.slot(ck, &hit) : nullptr;
  bool ok = true;
  if (hit) {
    std::copy(cached, cached + setups_, sc);
  } else {
    ok = o_.cost->stage(c, i, stages_, micro_batches_, micro_batch_, sc, w_.first_infeasible_unit < 0 ? &why : nullptr);
    if (cached) {
      if (ok) std::copy(sc, sc + setups_, cached);
      else *cached = FastStageCost(), w_.cache.invalidate(ck);
    }
  }
  if (!ok) {
    ++count_.infeasible;
    if (w_.first_infeasible_unit < 0 || u_.ordinal < w_.first_infeasible_unit) {
      w_.first_infeasible_unit = u_.ordinal;
      w_.first_infeasible_reason = why;
    }
  }
  return ok;
}

// The prefix's state after stage i, per setup still feasible: returns the setups that fit, and the
// least of their lower bounds in *bound_min.
[[gnu::always_inline]] inline unsigned UnitSearch::advance(const Frame& f, const Shape& sh, int k, double* bound_min) {
  const int i = f.i, micro_batches = micro_batches_;
  const FastStageCost* sc = &w_.stage_costs[static_cast<std::size_t>(i) * setups_];
  unsigned mk = w_.feasible_setups[i];
  for (int q = 0; q < setups_; ++q) {
    if (!(mk & (1u << q))) continue;
    const FastStageCost& fc = sc[q];
    if (!fc.fits) {
      mk &= ~(1u << q);
      continue;
    }
    const std::size_t at = static_cast<std::size_t>(i) * setups_ + q, next = at + setups_;
    const FastStageCost& first = i == 0 ? fc : w_.stage_costs[q];
    const double tail0 = first.allreduce_ms + first.optimizer_ms;
    const double busy = fc.busy_ms(micro_batches);
    // Micro-batch 0 reaches this stage after the forward chain; the stage then runs all its compute,
    // then its all-reduce and optimizer; its last gradients go down the chain to stage 0's all-reduce
    // and optimizer.
    const double own = !chain_bounds_ ? (busy_bound_ ? busy * (1 - 1e-9) + fc.allreduce_ms + fc.optimizer_ms : 0.0)
                                      : std::max(w_.forward_chain[at] + busy + fc.allreduce_ms + fc.optimizer_ms,
                                                 w_.passes[at] + fc.send_backward_ms + busy + tail0);
    double lb = std::max(w_.lower_bound[at], own);
    const double pass0 = fc.forward_ms + fc.send_forward_ms + fc.backward_ms + fc.send_backward_ms;
    w_.forward_chain[next] = w_.forward_chain[at] + fc.forward_ms + fc.send_forward_ms;
    w_.passes[next] = w_.passes[at] + pass0 + (micro_batches > 1 ? fc.accumulation_ms : 0.0);
    w_.first_passes[next] = w_.first_passes[at] + pass0;
    // The end path (end_path) through this stage or one before it: what it spends on that stage
    // beyond one pass; the stages after it up to the frontier are their passes.
    const double ex = (f.end.forwards - 1) * fc.forward_ms + f.backwards_before_last * fc.backward_ms +
                      std::max(0, f.end.accumulations - (micro_batches > 1 ? 1 : 0)) * fc.accumulation_ms;
    w_.end_extra[next] = std::max(w_.end_extra[at], ex);
    // The start path (start_path) through this stage: all of it but the round trip after this stage,
    // less the passes of micro-batch 0 up to the frontier (added back at each frontier).
    const double xs = w_.passes[at] + f.start.forwards * fc.forward_ms + micro_batches * fc.backward_ms +
                      (micro_batches - 1) * fc.accumulation_ms + fc.send_forward_ms + fc.send_backward_ms -
                      w_.first_passes[next];
    w_.start_extra[next] = std::max(w_.start_extra[at], xs);
    if (chain_bounds_) {
      const int rest = f.rest, r = f.r + sh.s, l = f.l + k;
      const double first_trip = sb_.first_trip(rest, r, l), last_trip = sb_.last_trip(rest, r, l);
      lb = std::max({lb, w_.passes[next] + (f.last ? 0.0 : sb_.path(rest, r, l)) + tail0,
                     w_.passes[next] + w_.end_extra[next] + last_trip + tail0,
                     w_.start_extra[next] + w_.first_passes[next] + first_trip + tail0,
                     // micro-batch 0 reaches the next stage, then some stage of the rest ends with its tail
                     w_.forward_chain[next] + sb_.tail_path(rest, r, l)});
      // The multi-trip chains of this stage and of each stage x before it (stage_trip_chain_ms): x's own
      // part at its exact costs (kept in trip_extra less the passes up to x), the trips through the stages
      // after x exact up to this one, and through the rest from the table.
      const double* from = &w_.trip_extra[at * Worker::kTripSlots];
      double* to = &w_.trip_extra[next * Worker::kTripSlots];
      std::copy(from, from + trip_slots_, to);
      for (const MultiTripCounts& h : f.trips)
        if (h.trips >= 1 && h.trips <= trip_slots_) {
          const double chain = stage_trip_chain_ms(h, fc, w_.forward_chain[at], 0, 0,
                                                   w_.passes[at] - w_.forward_chain[at], tail0);
          to[h.trips - 1] =
              std::max(to[h.trips - 1], trip_chain_offset(chain, h.trips, w_.first_passes[next], w_.passes[next]));
        }
      for (int t = 0; t < trip_slots_; ++t)
        lb = std::max(lb, trip_chain_at(to[t], t + 1, w_.first_passes[next], w_.passes[next], first_trip, last_trip));
    }
    w_.lower_bound[next] = lb;
    *bound_min = std::min(*bound_min, lb);
  }
  return mk;
}

// Layers [l, l + k) alone need more model-state bytes than the stage's least memory.
[[gnu::cold]] void UnitSearch::note_states_out_of_memory(const Frame& f, const Shape& sh, int k) {
  ++count_.infeasible;
  if (w_.first_infeasible_unit >= 0 && u_.ordinal >= w_.first_infeasible_unit) return;
  int smallest = f.r;  // the rank with the least memory
  for (int q = f.r; q < f.r + sh.s; ++q)
    if (o_.cost->rank_capacity_bytes(q) < o_.cost->rank_capacity_bytes(smallest)) smallest = q;
  char gib[64];
  std::snprintf(gib, sizeof gib, "%.1f GiB of its %.1f GiB", sh.states[f.l + k] / (1 << 30), sh.capacity / (1 << 30));
  w_.first_infeasible_unit = u_.ordinal;
  w_.first_infeasible_reason = "rank " + std::to_string(smallest) + " runs out of memory (stage " +
                               std::to_string(f.i) + " of " + std::to_string(stages_) + ", " + std::to_string(micro_batches_) +
                               " micro-batches): the model states of layers " + std::to_string(f.l) + "-" +
                               std::to_string(f.l + k - 1) + " at tp " + std::to_string(sh.tp) + " alone need " + gib;
}

// No setup still feasible fits stage i's costs `sc`.
[[gnu::cold]] void UnitSearch::note_out_of_memory(const Frame& f, const FastStageCost* sc) {
  ++count_.infeasible;
  if (w_.first_infeasible_unit >= 0 && u_.ordinal >= w_.first_infeasible_unit) return;
  for (int q = 0; q < setups_; ++q)
    if ((w_.feasible_setups[f.i] & (1u << q)) && sc[q].first_oom_rank >= 0) {
      w_.first_infeasible_unit = u_.ordinal;
      w_.first_infeasible_reason = "rank " + std::to_string(sc[q].first_oom_rank) + " runs out of memory (stage " +
                                   std::to_string(f.i) + " of " + std::to_string(stages_) + ", " +
                                   std::to_string(micro_batches_) + " micro-batches)";
      break;
    }
}

// A complete plan: its cheapest setup that fits, kept if among the worker's K best.
void UnitSearch::leaf() {
  ++count_.costed;
  double best = kInf;
  int best_setup = -1;
  const unsigned mk = w_.feasible_setups[stages_];
  bool chunks_costed = false;
  for (int k = 0; k < setups_; ++k) {
    if (!(mk & (1u << k))) continue;
    if (s_.options_.uniform && !deepspeed_pipeline_zero_ok(stages_, o_.cost->setup(k).zero_stage)) continue;
    if (use_bounds_ && w_.lower_bound[static_cast<std::size_t>(stages_) * setups_ + k] >
                           std::min(best, shared_.threshold()))
      continue;
    for (int i = 0; i < stages_; ++i) w_.leaf_costs[i] = w_.stage_costs[static_cast<std::size_t>(i) * setups_ + k];
    if (v_ > 1 && !chunks_costed) {
      // Interleaved: the chunks' costs, every setup at once, once per plan.
      if (!o_.cost->chunk_costs(w_.choices.data(), stages_, micro_batches_, micro_batch_, v_, w_.chunk_costs.data())) {
        ++count_.infeasible;
        return;
      }
      chunks_costed = true;
    }
    if (v_ > 1)
      for (int c = 0; c < stages_ * v_; ++c) w_.leaf_chunks[c] = w_.chunk_costs[static_cast<std::size_t>(c) * setups_ + k];
    const double t = o_.cost->iteration_ms(w_.leaf_costs.data(), stages_, micro_batches_, schedule_, &w_.scratch,
                                           v_ > 1 ? w_.leaf_chunks.data() : nullptr, v_);
    if (t < best) {
      best = t;
      best_setup = k;
    }
  }
  if (best_setup < 0) return;
  keep_plan(best, best_setup);
}

void UnitSearch::keep_plan(double cost, int setup) {
  PlanKey key;
  key.cost = cost;
  if (w_.top.full() && cost > w_.top.kth().cost) return;
  key.order.reserve(3 + 3 * stages_);
  key.order.push_back(o_.index);
  key.order.push_back(micro_batches_);
  key.order.push_back(stages_);
  for (int i = 0; i < stages_; ++i) {
    key.order.push_back(w_.choices[i].size);
    key.order.push_back(w_.choices[i].st.dp);
    key.order.push_back(w_.choices[i].layer_end - w_.choices[i].layer_begin);
  }
  if (!w_.top.wants(key)) return;
  const bool improves = cost < shared_.best();
  const unsigned long long id = plan_id(key.order);
  SearchedPlan sp;
  PlanResult& pr = sp.plan;
  for (int t : o_.sequence) pr.node_sequence.push_back(s_.cluster_.device_types()[t]);
  for (int i = 0; i < stages_; ++i) {
    pr.device_groups.push_back(w_.choices[i].size);
    pr.strategies.push_back(w_.choices[i].st);
    pr.layer_partition.push_back(w_.choices[i].layer_begin);
  }
  pr.layer_partition.push_back(layers_);
  pr.batches = micro_batches_;
  pr.num_repartition = 0;
  pr.cost = cost;
  sp.setup = setup;
  w_.top.insert(std::move(key), std::move(sp));
  shared_.offer(cost, id);
  if (improves && s_.polish_incumbents_) {
    // A new best plan: its neighbours by a layer boundary, a run of them or a tp (polish_plan; allocates,
    // but a search finds few new best plans). With a gap, the bounds prune plans within the gap of the
    // best, so a better plan next to it would otherwise go unseen and the threshold stay higher.
    const std::vector<StageChoice> stages(w_.choices.begin(), w_.choices.begin() + stages_);
    polish_plan(s_.space_, s_.cluster_, s_.options_, schedule_, o_.index, micro_batches_, stages, kPolishS, control_,
                shared_, &w_.polished);
  }
}

StageSearch::StageSearch(const SearchSpace& space, const FeasibilityTables& tables,
                         const std::vector<SuffixBound>& bounds, KeptEstimates& kept, SharedBound& shared,
                         SearchControl& control, const Cluster& cluster, const PlanSearchOptions& options,
                         Schedule schedule, int virtual_stages)
    : space_(space),
      tables_(tables),
      bounds_(bounds),
      kept_(kept),
      shared_(shared),
      control_(control),
      cluster_(cluster),
      options_(options),
      schedule_(schedule),
      virtual_stages_(virtual_stages),
      use_bounds_(!options.exhaustive),
      polish_incumbents_(use_bounds_ && virtual_stages == 1 && space.whole_nodes &&
                         space.gpus > options.bounds_pass_above_gpus) {}

void StageSearch::run_unit(Worker& w, const Unit& u) const {
  if (space_.whole_nodes && !space_.orders[u.order].node_start(u.first_size)) return;  // stage 0 ends inside a node
  // The depth-first search's first test (stage 0's size is the unit's), before anything is set up: most
  // units end there.
  if (use_bounds_ && virtual_stages_ == 1 && u.stages > 1 &&
      bounds_[u.group].least_path_from(u.stages - 1, u.first_size, u.first_layers > 0 ? u.first_layers : 1) >
          shared_.threshold()) {
    ++w.counters.own.enumerated;
    ++w.counters.own.pruned;
    return;
  }
  UnitSearch(*this, w, u).run();
}

}  // namespace hetplan
