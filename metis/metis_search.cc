#include "metis/metis_search.h"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

#include "metis/inter_stage.h"
#include "metis/intra_stage.h"
#include "metis/layer_balancer.h"
#include "base/periodic.h"
#include "base/top_k.h"
#include "base/input_error.h"
#include "metis/metis_cost.h"
#include "sim/rank_layout.h"

namespace hetplan {

namespace {

// A candidate's place in the reference's result list: ties in cost keep the
// earlier one.
struct RankKey {
  double cost;
  long long plan;
  int candidate;
  bool operator<(const RankKey& o) const {
    if (cost != o.cost) return cost < o.cost;
    if (plan != o.plan) return plan < o.plan;
    return candidate < o.candidate;
  }
};

using TopPlans = TopK<RankKey, PlanResult>;

struct Worker {
  Worker(const ProfileSet& profiles, const IntraStageOptions& o, int k) : search(profiles, o), top(k) {}
  IntraStageSearch search;
  TopPlans top;
  long long count = 0, candidates = 0, skipped = 0, dropped_layers = 0;
  long long first_skip_plan = -1;
  std::string first_skip_reason;
  long long first_error_plan = -1;
  std::string first_error;

  // Keeps the input problem of inter-stage plan `i` if it comes before the ones kept so far.
  void note_error(long long i, const char* what) {
    if (first_error_plan >= 0 && i >= first_error_plan) return;
    first_error_plan = i;
    first_error = what;
  }
};

}  // namespace

MetisSearch::MetisSearch(const Cluster& cluster, const ProfileSet& profiles, SearchOptions options)
    : cluster_(&cluster), profiles_(&profiles), opt_(std::move(options)) {
  if (opt_.gbs <= 0) throw InputError("--gbs: expected a positive global batch size");
  if (opt_.model.num_layers < 2) throw InputError("--num_layers: expected at least 2 (embedding and head)");
  if (opt_.max_permute_len <= 0) throw InputError("--max_permute_len: expected a positive integer");
  if (opt_.top_k <= 0) throw InputError("--top: expected a positive integer");
  for (std::size_t t = 0; t < cluster.device_types().size(); ++t) {
    const std::string& name = cluster.device_types()[t];
    const int p = profiles.type_index(name);
    if (p < 0) throw unknown_device_type(cluster, profiles, name);
    profile_type_.push_back(p);
  }
  if (profiles.num_layers() != opt_.model.num_layers)
    throw InputError(profiles.model().path + ": profiles have " + std::to_string(profiles.num_layers()) +
                     " layers, but --num_layers is " + std::to_string(opt_.model.num_layers));
}

InterStageOptions metis_inter_stage_options(const Cluster& cluster, int gbs, int num_layers, double variance,
                                            int max_permute_len) {
  InterStageOptions io;
  io.num_device_types = static_cast<int>(cluster.device_types().size());
  io.num_devices = cluster.num_devices();
  io.gbs = gbs;
  io.num_layers = num_layers;
  io.variance = variance;
  io.max_permute_len = max_permute_len;
  return io;
}

SearchResult MetisSearch::run() const {
  const auto t0 = std::chrono::steady_clock::now();
  const Cluster& cluster = *cluster_;
  const ProfileSet& profiles = *profiles_;

  InterStagePlanGenerator generator(metis_inter_stage_options(cluster, opt_.gbs, opt_.model.num_layers,
                                                              opt_.min_group_scale_variance, opt_.max_permute_len));
  const std::vector<InterStagePlan> plans = generator.all();

  // Per node sequence: where each rank sits, and its profile type.
  std::vector<RankLayout> layouts;
  std::vector<std::vector<int>> rank_ptypes;
  for (const auto& ns : generator.node_sequences()) {
    layouts.emplace_back(cluster, ns);
    std::vector<int> pt;
    for (int t : layouts.back().rank_types()) pt.push_back(profile_type_[t]);
    rank_ptypes.push_back(std::move(pt));
  }

  const MetisCostModel cost_model(profiles, opt_.model, profile_type_, opt_.max_profiled_bs);
  IntraStageOptions so{opt_.max_profiled_tp, opt_.max_profiled_bs, opt_.use_strat};
  tbb::enumerable_thread_specific<Worker> workers([&] { return Worker(profiles, so, opt_.top_k); });

  std::optional<tbb::global_control> limit;
  if (opt_.threads > 0) limit.emplace(tbb::global_control::max_allowed_parallelism, opt_.threads);

  // Optional progress reporting from a side thread.
  std::atomic<long long> done{0};
  Periodic reporter(opt_.progress ? std::function<void()>([&] {
    opt_.progress(done.load(), static_cast<long long>(plans.size()));
  }) : std::function<void()>());

  // Only the inputs' problems (a profile a plan needs is missing) stop the search as the reference stops:
  // at the first plan in order that has one. Any other exception is a bug, and propagates as it is.
  std::atomic<long long> first_error_plan{-1};
  auto note_input_error = [&first_error_plan](Worker& w, long long i, const char* what) {
    w.note_error(i, what);
    long long cur = first_error_plan.load();
    while ((cur < 0 || i < cur) && !first_error_plan.compare_exchange_weak(cur, i)) {
    }
  };
  auto body = [&](const tbb::blocked_range<std::size_t>& range) {
    Worker& w = workers.local();
    for (std::size_t i = range.begin(); i != range.end(); ++i) {
      const long long fe = first_error_plan.load(std::memory_order_relaxed);
      if (fe >= 0 && static_cast<long long>(i) > fe) break;  // the reference would have stopped
      const InterStagePlan& plan = plans[i];
      const RankLayout& layout = layouts[plan.ns_idx];
      int candidate = 0;
      try {
        w.search.run(plan, layout, rank_ptypes[plan.ns_idx], [&](const IntraStageCandidate& c) {
          w.count += c.count;
          ++w.candidates;
          CostTerms terms;
          SkippedPlan skip;
          const int idx = candidate++;
          if (c.partition->layer_partition.back() != opt_.model.num_layers) {
            ++w.dropped_layers;
            if (opt_.reject_dropped_layers) return;
          }
          if (!cost_model.cost(plan, layout, c.strategies->data(), c.partition->layer_partition.data(), &terms,
                               &skip)) {
            ++w.skipped;
            if (w.first_skip_plan < 0 || static_cast<long long>(i) < w.first_skip_plan) {
              w.first_skip_plan = static_cast<long long>(i);
              w.first_skip_reason = profiles.expected_path(skip.type, skip.tp, skip.bs) + ": " + skip.reason;
            }
            return;
          }
          const RankKey key{terms.total, static_cast<long long>(i), idx};
          if (!w.top.wants(key)) return;
          PlanResult r;
          for (int t : layout.node_sequence()) r.node_sequence.push_back(cluster.device_types()[t]);
          r.device_groups = *plan.device_groups;
          r.strategies = *c.strategies;
          r.batches = plan.batches;
          r.layer_partition = c.partition->layer_partition;
          r.num_repartition = c.partition->num_repartition;
          r.cost = terms.total;
          w.top.insert(key, std::move(r));
        });
      } catch (const InputError& e) {
        note_input_error(w, static_cast<long long>(i), e.what());
      } catch (const MissingProfileError& e) {
        note_input_error(w, static_cast<long long>(i), e.what());
      }
      done.fetch_add(1, std::memory_order_relaxed);
    }
  };
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, plans.size(), 8), body);

  reporter.stop();

  SearchResult result;
  result.inter_stage_plans = static_cast<long long>(plans.size());
  TopPlans top(opt_.top_k);
  long long err_plan = -1, skip_plan = -1;
  std::string err;
  for (Worker& w : workers) {
    if (w.first_error_plan >= 0 && (err_plan < 0 || w.first_error_plan < err_plan)) {
      err_plan = w.first_error_plan;
      err = w.first_error;
    }
    if (w.first_skip_plan >= 0 && (skip_plan < 0 || w.first_skip_plan < skip_plan)) {
      skip_plan = w.first_skip_plan;
      result.first_skip_reason = w.first_skip_reason;
    }
    result.count += w.count;
    result.candidates += w.candidates;
    result.skipped += w.skipped;
    result.dropped_layers += w.dropped_layers;
    for (auto& e : w.top.items()) top.insert(e.key, std::move(e.item));
  }
  if (err_plan >= 0) throw InputError(err);
  for (auto& e : top.items()) result.top.push_back(std::move(e.item));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace hetplan
