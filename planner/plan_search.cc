#include "planner/plan_search.h"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

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

struct Ranked {
  PlanKey key;
  SearchedPlan plan;
};

// The K best plans seen, sorted.
class TopK {
 public:
  explicit TopK(int k) : k_(k) {}
  bool full() const { return static_cast<int>(items_.size()) >= k_; }
  double kth_cost() const { return full() ? items_.back().key.cost : kInf; }
  bool wants(const PlanKey& key) const { return !full() || key < items_.back().key; }
  void insert(Ranked r) {
    auto it = std::upper_bound(items_.begin(), items_.end(), r.key,
                               [](const PlanKey& k, const Ranked& x) { return k < x.key; });
    items_.insert(it, std::move(r));
    if (static_cast<int>(items_.size()) > k_) items_.pop_back();
  }
  std::vector<Ranked>& items() { return items_; }

 private:
  int k_;
  std::vector<Ranked> items_;
};

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
    if (static_cast<int>(costs_.size()) == k_) threshold_.store(costs_.back(), std::memory_order_relaxed);
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
  // min_work[k][l]: sum over layers >= l of the cheapest GPU-milliseconds per
  // sample of any device type at sequence positions >= k (any profiled tp, bs).
  std::vector<std::vector<double>> suffix_work;
  std::vector<std::vector<char>> tp_ok;  // [block][tp]: every type from block on has tp profiles
};

// One (node order, m, p) unit.
struct Unit {
  int order = 0, m = 1, p = 1;
};

struct Counters {
  long long enumerated = 0, pruned = 0, costed = 0, infeasible = 0;
};

struct Worker {
  explicit Worker(int k) : top(k) {}
  TopK top;
  Counters c;
  long long first_infeasible_unit = -1;
  std::string first_infeasible_reason;
  PipelineScratch scratch;
  // DFS state, indexed [stage][setup].
  std::vector<FastStageCost> stage_cost;    // [stage * setups + k]
  std::vector<double> fwd_prefix;           // [stage * setups + k]: forward chain to reach `stage`
  std::vector<double> bwd_prefix;           // backward chain from `stage` down to stage 0's end
  std::vector<double> lb;                   // best lower bound so far along the path
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
    if (profiles.type_index(name) < 0) {
      std::string found;
      for (const auto& n : profiles.device_types()) found += (found.empty() ? "" : ", ") + n;
      throw InputError(cluster.clusterfile_path() + ": unknown device type '" + name + "': expected profiles DeviceType." +
                       name + "_tp<T>_bs<B>.json in " + profiles.dir() + ", which has types: " + found);
    }
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

  // Per device type: the cheapest GPU-milliseconds per sample of each layer,
  // over every profiled (tp, bs), and which tp degrees have profiles.
  int max_tp = 0;
  for (const auto& e : profiles.entries()) max_tp = std::max(max_tp, e.tp);
  max_tp = std::min(max_tp, opt_.max_tp);
  std::vector<std::vector<double>> type_work(n_types, std::vector<double>(L, kInf));
  std::vector<std::vector<char>> type_tp(n_types, std::vector<char>(max_tp + 1, 0));
  for (int t = 0; t < n_types; ++t) {
    const int pt = profiles.type_index(cluster.device_types()[t]);
    for (const LayerProfile& e : profiles.entries()) {
      if (e.tp < 1 || e.tp > max_tp || e.bs < 1 || profiles.find(pt, e.tp, e.bs) != &e) continue;
      type_tp[t][e.tp] = 1;
      for (int l = 0; l < L && l < static_cast<int>(e.layer_ms.size()); ++l)
        type_work[t][l] = std::min(type_work[t][l], e.layer_ms[l] * e.tp / e.bs);
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
    o.suffix_work.assign(n_types + 1, std::vector<double>(L + 1, 0.0));
    o.tp_ok.assign(n_types + 1, std::vector<char>(max_tp + 1, 1));
    for (int k = n_types - 1; k >= 0; --k) {
      for (int l = L - 1; l >= 0; --l) {
        double w = kInf;
        for (int j = k; j < n_types; ++j) w = std::min(w, type_work[perm[j]][l]);
        o.suffix_work[k][l] = o.suffix_work[k][l + 1] + (std::isfinite(w) ? w : 0.0);
      }
      for (int tp = 1; tp <= max_tp; ++tp) o.tp_ok[k][tp] = o.tp_ok[k + 1][tp] && type_tp[perm[k]][tp];
    }
    orders.push_back(std::move(o));
  } while (std::next_permutation(perm.begin(), perm.end()));

  const int R = cluster.num_devices();
  std::vector<Unit> units;
  for (int p = 1; p <= std::min({L, R, opt_.max_stages}); ++p)
    for (int m = opt_.gbs; m >= 1; --m) {
      if (opt_.gbs % m != 0 || opt_.gbs / m > opt_.max_micro_batch) continue;
      for (const OrderContext& o : orders) units.push_back(Unit{o.index, m, p});
    }

  SharedBound bound(opt_.top_k);
  std::atomic<bool> stop{false};
  std::atomic<int> stop_why{0};  // 1: time budget, 2: cancelled
  std::atomic<long long> units_done{0};
  std::atomic<long long> g_enumerated{0}, g_pruned{0}, g_costed{0};
  const bool use_bounds = !opt_.exhaustive;

  tbb::enumerable_thread_specific<Worker> workers([&] { return Worker(opt_.top_k); });
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
    const int stride = S;
    w.stage_cost.resize(static_cast<std::size_t>(p) * S);
    w.fwd_prefix.assign(static_cast<std::size_t>(p + 1) * S, 0.0);
    w.bwd_prefix.assign(static_cast<std::size_t>(p + 1) * S, 0.0);
    w.lb.assign(static_cast<std::size_t>(p + 1) * S, 0.0);
    w.mask.assign(p + 1, 0);
    w.choice.resize(p);
    w.leaf.resize(p);
    const unsigned all = S >= 32 ? 0xffffffffu : ((1u << S) - 1);
    w.mask[0] = all;
    long long since_check = 0;

    // The cheapest time per micro-batch any ranks [r, R) could spend on layers [l, L).
    auto rest_bound = [&](int r, int l) {
      if (r >= R) return kInf;
      return static_cast<double>(b) * o.suffix_work[o.block[r]][l] / (R - r);
    };
    auto stage_work = [&](int r, int s, int l, int k) {
      return static_cast<double>(b) * (o.suffix_work[o.block[r]][l] - o.suffix_work[o.block[r]][l + k]) / s;
    };

    auto leaf = [&]() {
      ++w.c.costed;
      double best = kInf;
      int best_setup = -1;
      const unsigned mk = w.mask[p];
      for (int k = 0; k < S; ++k) {
        if (!(mk & (1u << k))) continue;
        if (use_bounds && w.lb[static_cast<std::size_t>(p) * stride + k] > std::min(best, bound.threshold())) continue;
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
      if (w.top.full() && best > w.top.kth_cost()) return;
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
      Ranked r;
      r.key = std::move(key);
      PlanResult& pr = r.plan.plan;
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
      r.plan.setup = best_setup;
      w.top.insert(std::move(r));
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
      const int rest_stages = p - 1 - i;
      const int s_max = last ? R - r : R - r - rest_stages;
      const int s_min = last ? R - r : 1;
      const int k_max = last ? L - l : L - l - rest_stages;
      const int k_min = last ? L - l : 1;
      const double thr0 = use_bounds ? bound.threshold() : kInf;
      // The forward chain to this stage, the smallest over the feasible settings.
      double fwd_min = kInf;
      for (int k = 0; k < S; ++k)
        if (w.mask[i] & (1u << k)) fwd_min = std::min(fwd_min, w.fwd_prefix[static_cast<std::size_t>(i) * S + k]);
      for (int s = s_min; s <= s_max; ++s) {
        // Work bound on the ranks after this stage (grows with s).
        // The ranks after this stage get fewer as s grows: once even the most
        // layers this stage can take leave them too much work, stop.
        if (use_bounds && !last && fwd_min + m * rest_bound(r + s, l + k_max) > thr0) {
          ++w.c.pruned;
          break;
        }
        for (int tp = 1; tp <= std::min(s, max_tp); ++tp) {
          if (s % tp != 0) continue;
          const int dp = s / tp;
          if (dp > b) continue;  // every replica trains at least one sample
          if (!o.tp_ok[o.block[r]][tp]) continue;
          if (!opt_.allow_cross_node_tp) {
            bool inside = true;
            for (int g = r; g < r + s && inside; g += tp) inside = o.node_run[g] >= tp;
            if (!inside) continue;
          }
          for (int k = k_min; k <= k_max; ++k) {
            ++w.c.enumerated;
            if (use_bounds) {
              const double thr = bound.threshold();
              // This stage's own work only grows with k.
              if (fwd_min + m * stage_work(r, s, l, k) > thr) {
                ++w.c.pruned;
                break;
              }
              // The rest's work shrinks with k.
              if (!last && fwd_min + m * rest_bound(r + s, l + k) > thr) {
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
            if (!o.cost->stage(c, i, p, m, b, sc, w.first_infeasible_unit < 0 ? &why : nullptr)) {
              ++w.c.infeasible;
              if (w.first_infeasible_unit < 0 || unit_index < w.first_infeasible_unit) {
                w.first_infeasible_unit = unit_index;
                w.first_infeasible_reason = why;
              }
              continue;
            }
            unsigned mk = w.mask[i];
            double lb_min = kInf;
            for (int q = 0; q < S; ++q) {
              if (!(mk & (1u << q))) continue;
              const FastStageCost& fc = sc[q];
              if (!fc.fits) {
                mk &= ~(1u << q);
                continue;
              }
              const std::size_t at = static_cast<std::size_t>(i) * S + q, next = at + S;
              const double fwd = w.fwd_prefix[at];
              const double busy = fc.busy_ms(m);
              // Stage 0's tail: its all-reduce and optimizer after the backward chain reaches it.
              const double tail0 = i == 0 ? fc.allreduce_ms + fc.optimizer_ms
                                          : w.stage_cost[q].allreduce_ms + w.stage_cost[q].optimizer_ms;
              const double down = w.bwd_prefix[at];  // backward chain below this stage
              const double own =
                  fwd + busy + std::max(fc.allreduce_ms + fc.optimizer_ms, fc.send_backward_ms + down + tail0);
              double lb = std::max(w.lb[at], own);
              w.fwd_prefix[next] = fwd + fc.forward_ms + fc.send_forward_ms;
              w.bwd_prefix[next] = down + fc.send_backward_ms + fc.backward_ms + (m > 1 ? fc.accumulation_ms : 0.0);
              if (!last) lb = std::max(lb, w.fwd_prefix[next] + m * rest_bound(r + s, l + k));
              w.lb[next] = lb;
              lb_min = std::min(lb_min, lb);
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
            if (use_bounds && lb_min > bound.threshold()) {
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
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::thread reporter;
  if (opt_.progress) {
    reporter = std::thread([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (!cv.wait_for(lock, std::chrono::seconds(1), [&] { return finished; })) {
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
      }
    });
  }

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

  if (reporter.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      finished = true;
    }
    cv.notify_all();
    reporter.join();
  }

  PlanSearchResult result;
  TopK top(opt_.top_k);
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
    for (Ranked& r : w.top.items()) top.insert(std::move(r));
  }
  for (Ranked& r : top.items()) result.top.push_back(std::move(r.plan));
  result.cut_short = stop.load();
  if (result.cut_short)
    result.cut_reason = stop_why.load() == 2 ? "interrupted" : "time budget of " + std::to_string(opt_.time_budget_s) + " s reached";
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

}  // namespace hetplan
