// base/thread_limit.h: `--threads N` above the process's core count runs N threads at once (PlanSearch::run
// raises TBB's limit with allow_threads_beyond_cores for its arena's lifetime), and the limit goes with it.
#include <catch2/catch.hpp>

#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "base/thread_limit.h"

namespace {

// Runs `threads` tasks in `arena` that each wait (up to 5 s) until all have begun; returns how many gave up
// waiting. Only `threads` threads at once can all begin in time; with TBB's limit of one worker per other
// core, at most the core count would.
int tasks_timed_out(tbb::task_arena& arena, int threads) {
  std::atomic<int> begun{0}, timed_out{0};
  arena.execute([&] {
    tbb::task_group g;
    for (int i = 0; i < threads; ++i)
      g.run([&] {
        begun.fetch_add(1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (begun.load() < threads) {
          if (std::chrono::steady_clock::now() >= until) {
            timed_out.fetch_add(1);
            return;
          }
          std::this_thread::yield();
        }
      });
    g.wait();
  });
  return timed_out.load();
}

}  // namespace

TEST_CASE("more threads than cores: TBB's limit raised to them while the control lives, and they all run",
          "[thread_limit]") {
  const int cores = tbb::info::default_concurrency();
  const int threads = cores + 2;
  const auto limit = [] { return tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism); };
  const std::size_t before = limit();
  {
    const auto more = hetplan::allow_threads_beyond_cores(threads, cores);
    REQUIRE(more.has_value());
    CHECK(limit() == static_cast<std::size_t>(threads));
    tbb::task_arena arena(threads);
    CHECK(tasks_timed_out(arena, threads) == 0);
  }
  CHECK(limit() == before);  // the limit goes with the control
  CHECK_FALSE(hetplan::allow_threads_beyond_cores(cores, cores).has_value());  // as many as cores: no control
}
