#include "planner/seed_plans.h"

#include "planner/export_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace hetplan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One seed: node order, micro-batch count, stage sizes, each stage's tp and layer starts (p + 1 entries); its cost
// (infinity where out of memory) and, out of memory, the least over the settings of the bytes by which
// its ranks overflow.
struct Seed {
  int order = 0, micro_batches = 1;
  std::vector<int> sizes, tps, starts;
  double cost = kInf, overflow = kInf;
  int setup = -1;
  // Better: fits and costs less, or overflows less.
  bool better_than(const Seed& o) const { return cost != o.cost ? cost < o.cost : overflow < o.overflow; }
};

class Seeder {
 public:
  Seeder(const SearchSpace& space, const std::vector<std::vector<double>>& layer_cost, const Cluster& cluster,
         const PlanSearchOptions& options, Schedule schedule, double time_limit_s, SearchControl& control,
         SharedBound& shared, TopPlans* top)
      : space_(space),
        layer_cost_(layer_cost),
        cluster_(cluster),
        options_(options),
        schedule_(schedule),
        deadline_s_(control.elapsed_s() + time_limit_s),
        control_(control),
        shared_(shared),
        top_(top) {}

  SeedStats run() {
    const double start = control_.elapsed_s();
    std::vector<Seed> grid;
    for (int p = 1; p <= space_.max_stages && !out_of_time(); ++p)
      for (const NodeOrder& o : space_.orders) {
        std::vector<int> sizes;
        if (!stage_sizes(o, p, &sizes)) continue;
        for (int tp = 1; tp <= space_.max_tp && !out_of_time(); ++tp)
          for (int m : space_.micro_batch_counts) {
            Seed s{o.index, m, sizes, std::vector<int>(sizes.size(), tp), {}};
            if (!valid_shape(o, s) || !balanced_layers(o, &s)) continue;
            if (!cost(&s)) continue;
            stats_.feasible += std::isfinite(s.cost);
            keep(s);
            grid.push_back(std::move(s));
          }
      }
    // The best few, improved a boundary at a time.
    std::sort(grid.begin(), grid.end(), [](const Seed& a, const Seed& b) { return a.better_than(b); });
    if (grid.size() > kClimbed) grid.resize(kClimbed);
    for (Seed& s : grid) {
      if (out_of_time()) break;
      climb(&s);
    }
    stats_.seconds = control_.elapsed_s() - start;
    return stats_;
  }

 private:
  static constexpr std::size_t kClimbed = 8;

  bool out_of_time() { return control_.elapsed_s() > deadline_s_ || control_.check_stop(); }

  // p stages of (nearly) equal whole-node runs, or, where stages may start on any rank and p exceeds the
  // nodes, p equal runs of ranks. False where there is no such split.
  bool stage_sizes(const NodeOrder& o, int p, std::vector<int>* sizes) const {
    std::vector<int> node_starts;
    for (int r = 0; r < o.ranks; ++r)
      if (o.node_start(r)) node_starts.push_back(r);
    const int nodes = static_cast<int>(node_starts.size());
    node_starts.push_back(o.ranks);
    sizes->clear();
    if (p <= nodes) {
      for (int j = 0; j < p; ++j) {
        const int a = static_cast<int>(static_cast<long long>(nodes) * j / p),
                  b = static_cast<int>(static_cast<long long>(nodes) * (j + 1) / p);
        sizes->push_back(node_starts[b] - node_starts[a]);
      }
      return true;
    }
    if (space_.whole_nodes || o.ranks % p != 0) return false;
    sizes->assign(p, o.ranks / p);
    return true;
  }

  // Every stage of the seed is a shape of the search space: tp divides its size, dp at most the
  // micro-batch, tp profiled on its types and (unless allowed otherwise) inside its nodes.
  bool valid_shape(const NodeOrder& o, const Seed& s) const {
    const int b = space_.gbs / s.micro_batches;
    int r = 0;
    for (std::size_t i = 0; i < s.sizes.size(); ++i) {
      const int size = s.sizes[i], tp = s.tps[i];
      if (tp < 1 || tp > space_.max_tp || size % tp != 0 || !space_.splits_micro_batch(size / tp, b) || tp > size)
        return false;
      // --uniform: every stage at stage 0's (dp, tp), dp dividing the micro-batch (planner/export_plan.h).
      if (options_.uniform && (!exporter_micro_batch_splits(b, size / tp / space_.cp) ||
                               !exporter_grid_matches(Strategy{s.sizes[0] / s.tps[0], s.tps[0]}, Strategy{size / tp, tp})))
        return false;
      if (!o.tp_profiled(r, size, tp)) return false;
      if (!options_.allow_cross_node_tp && !o.tp_inside_nodes(r, size, tp)) return false;
      r += size;
    }
    return true;
  }

  // Layer starts that balance the stages' compute: the least T by bisection such that taking layers in
  // order, each stage while its per-sample time stays within T (leaving a layer for each stage after
  // it), covers every layer; a stage's time per layer is that layer's GPU-ms per sample over the sum of
  // its GPUs' speeds.
  bool balanced_layers(const NodeOrder& o, Seed* s) const {
    const int p = static_cast<int>(s->sizes.size()), layers = space_.layers;
    if (p > layers) return false;
    std::vector<double>& w = weights_;
    w.assign(static_cast<std::size_t>(p) * layers, 0.0);
    int r = 0;
    double total = 0;
    for (int j = 0; j < p; ++j) {
      for (int l = 0; l < layers; ++l) {
        double speed = 0;
        for (int x = r; x < r + s->sizes[j]; ++x) speed += 1 / layer_cost_[o.layout->type_of(x)][l];
        if (!(speed > 0)) return false;  // a layer no GPU of the stage has a profile for
        w[static_cast<std::size_t>(j) * layers + l] = 1 / speed;
        total = std::max(total, w[static_cast<std::size_t>(j) * layers + l]);
      }
      r += s->sizes[j];
    }
    double lo = 0, hi = total * layers;
    for (int it = 0; it < 60; ++it) {
      const double mid = 0.5 * (lo + hi);
      if (fill(w, p, mid, nullptr)) hi = mid;
      else lo = mid;
    }
    s->starts.assign(p + 1, 0);
    return fill(w, p, hi, &s->starts);
  }

  // Greedy fill of p stages within time T each; writes the layer starts where `starts` is set.
  bool fill(const std::vector<double>& w, int p, double t, std::vector<int>* starts) const {
    const int layers = space_.layers;
    int l = 0;
    for (int j = 0; j < p; ++j) {
      if (starts) (*starts)[j] = l;
      const int last_allowed = layers - (p - 1 - j);  // leave one layer for each stage after
      if (l >= last_allowed) return false;
      double sum = w[static_cast<std::size_t>(j) * layers + l++];
      if (sum > t) return false;
      if (j == p - 1) {
        while (l < layers) sum += w[static_cast<std::size_t>(j) * layers + l++];
        if (sum > t) return false;
        break;
      }
      while (l < last_allowed && sum + w[static_cast<std::size_t>(j) * layers + l] <= t)
        sum += w[static_cast<std::size_t>(j) * layers + l++];
    }
    if (starts) (*starts)[p] = layers;
    return l == layers;
  }

  // The seed's cost at its fastest setting that fits, as the depth-first search's leaf finds it; else
  // its overflow. False where a profile is missing.
  bool cost(Seed* s) {
    const NodeOrder& o = space_.orders[s->order];
    const int p = static_cast<int>(s->sizes.size()), setups = space_.num_setups(), b = space_.gbs / s->micro_batches;
    costs_.resize(static_cast<std::size_t>(p) * setups);
    int r = 0;
    for (int i = 0; i < p; ++i) {
      StageChoice c;
      c.begin = r;
      c.size = s->sizes[i];
      c.st = Strategy{s->sizes[i] / s->tps[i], s->tps[i]};
      c.layer_begin = s->starts[i];
      c.layer_end = s->starts[i + 1];
      if (!o.cost->stage(c, i, p, s->micro_batches, b, &costs_[static_cast<std::size_t>(i) * setups])) return false;
      r += c.size;
    }
    ++stats_.costed;
    double ms = kInf;
    s->setup = options_.uniform ? uniform_best_setup(o, p, s->micro_batches, &ms)
                                : o.cost->best_setup(costs_.data(), p, s->micro_batches, schedule_, &scratch_, &ms);
    s->cost = s->setup >= 0 ? ms : kInf;
    s->overflow = 0;
    if (s->setup < 0) {
      s->overflow = kInf;
      for (int k = 0; k < setups; ++k) {
        double over = 0;
        for (int i = 0; i < p; ++i) over += std::max(0.0, -costs_[static_cast<std::size_t>(i) * setups + k].min_headroom_bytes);
        s->overflow = std::min(s->overflow, over);
      }
    }
    return true;
  }

  // best_setup over the settings --uniform allows (ZeRO 0 or 1 on a pipeline of several stages), the
  // leaf's way: the least iteration time of the settings that fit every stage, the first on ties.
  int uniform_best_setup(const NodeOrder& o, int p, int micro_batches, double* ms) {
    const int setups = space_.num_setups();
    one_.resize(p);
    int best = -1;
    *ms = kInf;
    for (int k = 0; k < setups; ++k) {
      if (!deepspeed_pipeline_zero_ok(p, o.cost->setup(k).zero_stage)) continue;
      bool fits = true;
      for (int i = 0; i < p; ++i) {
        one_[i] = costs_[static_cast<std::size_t>(i) * setups + k];
        fits = fits && one_[i].fits;
      }
      if (!fits) continue;
      const double t = o.cost->iteration_ms(one_.data(), p, micro_batches, schedule_, &scratch_);
      if (t < *ms) {
        *ms = t;
        best = k;
      }
    }
    return best;
  }

  // Moves one layer boundary by one layer at a time (and, with `change_tp`, one stage's tp to another of
  // the space's), the best such move while it improves the seed; where none does, moves a run of two or
  // more adjacent boundaries by one layer together (a stage's layers shifted along the pipeline, which a
  // single move cannot reach when each half alone unbalances a stage), the best such move if it improves.
  void climb(Seed* s, bool change_tp = false) {
    const int p = static_cast<int>(s->sizes.size());
    const NodeOrder& o = space_.orders[s->order];
    for (int round = 0; round < 4 * space_.layers && !out_of_time(); ++round) {
      Seed best = *s;
      for (int i = 1; i < p; ++i)
        for (int d : {-1, 1}) {
          Seed n = *s;
          n.starts[i] += d;
          if (n.starts[i] <= n.starts[i - 1] || n.starts[i] >= n.starts[i + 1]) continue;
          if (!cost(&n)) continue;
          if (n.better_than(best)) best = std::move(n);
        }
      for (int i = 0; change_tp && i < p; ++i)
        for (int tp = 1; tp <= space_.max_tp; ++tp) {
          if (tp == s->tps[i]) continue;
          Seed n = *s;
          n.tps[i] = tp;
          if (!valid_shape(o, n) || !cost(&n)) continue;
          if (n.better_than(best)) best = std::move(n);
        }
      for (int i = 1; !best.better_than(*s) && i < p; ++i)
        for (int j = i + 1; j < p; ++j)
          for (int d : {-1, 1}) {
            Seed n = *s;
            for (int k = i; k <= j; ++k) n.starts[k] += d;
            if (n.starts[i] <= n.starts[i - 1] || n.starts[j] >= n.starts[j + 1]) continue;
            if (!cost(&n)) continue;
            if (n.better_than(best)) best = std::move(n);
          }
      if (!best.better_than(*s)) return;
      *s = std::move(best);
      keep(*s);
    }
  }

 public:
  // One plan given stage by stage: costed, kept, then improved by climbing (layer boundaries and tp).
  double polish(Seed s) {
    if (!valid_shape(space_.orders[s.order], s) || !cost(&s)) return kInf;
    keep(s);
    climb(&s, true);
    return s.cost;
  }

 private:

  void keep(const Seed& s) {
    if (!std::isfinite(s.cost)) return;
    const NodeOrder& o = space_.orders[s.order];
    const int p = static_cast<int>(s.sizes.size());
    PlanKey key;
    key.cost = s.cost;
    key.order = {o.index, s.micro_batches, p};
    SearchedPlan sp;
    PlanResult& pr = sp.plan;
    for (int t : o.sequence) pr.node_sequence.push_back(cluster_.device_types()[t]);
    for (int i = 0; i < p; ++i) {
      key.order.push_back(s.sizes[i]);
      key.order.push_back(s.sizes[i] / s.tps[i]);
      key.order.push_back(s.starts[i + 1] - s.starts[i]);
      pr.device_groups.push_back(s.sizes[i]);
      pr.strategies.push_back(Strategy{s.sizes[i] / s.tps[i], s.tps[i]});
      pr.layer_partition.push_back(s.starts[i]);
    }
    pr.layer_partition.push_back(space_.layers);
    pr.batches = s.micro_batches;
    pr.num_repartition = 0;
    pr.cost = s.cost;
    sp.setup = s.setup;
    const unsigned long long id = plan_id(key.order);
    if (insert_unique(top_, std::move(key), std::move(sp))) shared_.offer(s.cost, id);
  }

  const SearchSpace& space_;
  const std::vector<std::vector<double>>& layer_cost_;
  const Cluster& cluster_;
  const PlanSearchOptions& options_;
  const Schedule schedule_;
  const double deadline_s_;
  SearchControl& control_;
  SharedBound& shared_;
  TopPlans* top_;
  SeedStats stats_;
  std::vector<FastStageCost> costs_, one_;
  PipelineScratch scratch_;
  mutable std::vector<double> weights_;
};

}  // namespace

bool insert_unique(TopPlans* top, PlanKey key, SearchedPlan plan) {
  if (!top->wants(key)) return false;
  for (const auto& e : top->items())
    if (e.key.cost == key.cost && e.key.order == key.order) return false;
  top->insert(std::move(key), std::move(plan));
  return true;
}

double polish_plan(const SearchSpace& space, const Cluster& cluster, const PlanSearchOptions& options,
                   Schedule schedule, int order, int micro_batches, const std::vector<StageChoice>& stages,
                   double time_limit_s, SearchControl& control, SharedBound& shared, TopPlans* top) {
  if (stages.empty()) return kInf;
  Seed s;
  s.order = order;
  s.micro_batches = micro_batches;
  for (const StageChoice& c : stages) {
    s.sizes.push_back(c.size);
    s.tps.push_back(c.st.tp);
    s.starts.push_back(c.layer_begin);
  }
  s.starts.push_back(space.layers);
  const std::vector<std::vector<double>> no_layer_cost;  // (only the grid's layer split reads it)
  return Seeder(space, no_layer_cost, cluster, options, schedule, time_limit_s, control, shared, top).polish(std::move(s));
}

SeedStats seed_plans(const SearchSpace& space, const std::vector<std::vector<double>>& layer_cost,
                     const Cluster& cluster, const PlanSearchOptions& options, Schedule schedule,
                     double time_limit_s, SearchControl& control, SharedBound& shared, TopPlans* top) {
  return Seeder(space, layer_cost, cluster, options, schedule, time_limit_s, control, shared, top).run();
}

}  // namespace hetplan
