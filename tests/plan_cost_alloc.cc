// PlanCostModel's hot path allocates nothing once warm: stage() and
// best_setup()/iteration_ms() over a set of candidates, counted with a
// replaced global operator new. Also prints the per-candidate time of the
// fast path and of PlanSimulator::run per setting (the old search hook).
// Usage: plan_cost_alloc <source dir> <scratch dir>
// GCC warns on free() in a replaced operator delete (the pairing is ours and matches).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <new>
#include <random>

#include "sim/analytic_profiles.h"
#include "sim/plan_cost.h"

namespace {
std::atomic<long> g_allocs{0};
std::atomic<bool> g_count{false};
}  // namespace

void* operator new(std::size_t n) {
  if (g_count.load(std::memory_order_relaxed)) ++g_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace hetplan;

namespace {

struct Candidate {
  std::vector<int> groups, partition;
  std::vector<Strategy> strategies;
  int batches = 1;
};

std::vector<Candidate> random_candidates(const RankLayout& layout, int count, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<Candidate> out;
  while (static_cast<int>(out.size()) < count) {
    Candidate c;
    const int p = std::uniform_int_distribution<int>(1, 6)(rng);
    // p - 1 distinct cuts in 1..15, sorted.
    std::vector<int> cuts, pool;
    for (int r = 1; r < layout.num_ranks(); ++r) pool.push_back(r);
    std::shuffle(pool.begin(), pool.end(), rng);
    cuts.assign(pool.begin(), pool.begin() + (p - 1));
    cuts.push_back(0);
    cuts.push_back(layout.num_ranks());
    std::sort(cuts.begin(), cuts.end());
    for (int i = 0; i < p; ++i) {
      const int size = cuts[i + 1] - cuts[i];
      std::vector<int> tps;
      for (int tp = 1; tp <= size; tp *= 2)
        if (size % tp == 0) tps.push_back(tp);
      const int tp = tps[rng() % tps.size()];
      c.groups.push_back(size);
      c.strategies.push_back({size / tp, tp});
    }
    std::vector<int> lpool{1, 2, 3, 4, 5, 6, 7, 8, 9};
    std::shuffle(lpool.begin(), lpool.end(), rng);
    c.partition.assign(lpool.begin(), lpool.begin() + (p - 1));
    c.partition.push_back(0);
    c.partition.push_back(10);
    std::sort(c.partition.begin(), c.partition.end());
    c.batches = 1 << std::uniform_int_distribution<int>(0, 5)(rng);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: plan_cost_alloc <source dir> <scratch dir>\n");
    return 2;
  }
  const std::string src = argv[1], dir = argv[2];
  AnalyticOptions ao;
  ao.model.num_layers = 10;
  ao.max_bs = 64;
  ao.max_tp = 16;
  ao.device_types = {"A100", "V100"};
  std::filesystem::create_directories(dir);
  generate_analytic_profiles(ao, dir);
  const ProfileSet profiles = ProfileSet::load(dir, 10);
  const Cluster cluster = Cluster::load(src + "/hostfiles/a100_v100_16.hostfile", src + "/hostfiles/clusterfile.json");
  // search --zero auto --recompute auto: 4 ZeRO stages x 3 recomputations.
  std::vector<TrainingSetup> setups;
  std::vector<PlanSimulator> sims;
  for (int zero = 0; zero <= 3; ++zero)
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      SimulationOptions so;
      so.setup.zero_stage = zero;
      so.setup.recompute = r;
      so.setup.framework_bytes = -1;
      setups.push_back(so.setup);
      sims.emplace_back(cluster, profiles, shape_from_model_config(ao.model), ao.model.sequence_length, so);
    }
  // search --overlap auto: each ZeRO stage with overlapped communication too (sim/dp_overlap.h).
  for (int zero = 0; zero <= 3; ++zero) {
    TrainingSetup s = setups[zero * 3];
    s.overlap.grad_reduce = s.overlap.param_gather = true;
    setups.push_back(s);
  }
  const RankLayout layout(cluster, {1, 0});
  const PlanCostModel model(sims[0], layout, setups);
  const int n = model.num_setups(), gbs = 64;
  const std::vector<Candidate> cands = random_candidates(layout, 10000, 4242);

  std::vector<FastStageCost> all(8 * n);
  PipelineScratch scratch;
  auto fast = [&](const Candidate& c) {
    const int p = static_cast<int>(c.groups.size());
    int begin = 0;
    for (int i = 0; i < p; ++i) {
      const StageChoice s{begin, c.groups[i], c.strategies[i], c.partition[i], c.partition[i + 1]};
      if (!model.stage(s, i, p, c.batches, gbs / c.batches, &all[i * n])) std::abort();
      begin += c.groups[i];
    }
    double ms = 0;
    model.best_setup(all.data(), p, c.batches, model.schedule(), &scratch, &ms);
    return ms;
  };
  double sink = 0;
  for (const Candidate& c : cands) sink += fast(c);  // warm up: grow the scratch
  g_allocs = 0;
  g_count = true;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Candidate& c : cands) sink += fast(c);
  const auto t1 = std::chrono::steady_clock::now();
  g_count = false;
  const long allocs = g_allocs.load();
  const double fast_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / cands.size();

  // The old hook's work: PlanSimulator::run per setting (now the explain path).
  const int slow_count = 1000;
  const auto t2 = std::chrono::steady_clock::now();
  for (int i = 0; i < slow_count; ++i) {
    const Candidate& c = cands[i];
    for (const PlanSimulator& s : sims) {
      PlanSimulation out;
      std::string why;
      if (!s.run(layout, c.groups, c.strategies.data(), c.partition.data(), c.batches, gbs, &out, &why, false))
        std::abort();
      sink += out.timeline.iteration_ms;
    }
  }
  const auto t3 = std::chrono::steady_clock::now();
  const double slow_us = std::chrono::duration<double, std::micro>(t3 - t2).count() / slow_count;
  std::printf("candidates %zu, settings %d: fast path %.2f us/candidate (%ld allocations), PlanSimulator::run per "
              "setting %.1f us/candidate (%.1f us per setting)  [sink %g]\n",
              cands.size(), n, fast_us, allocs, slow_us, slow_us / n, sink);
  return allocs == 0 ? 0 : 1;
}
