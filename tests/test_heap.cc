// cli/heap: a worker thread's malloc arena is madvised for huge pages past its first 2 MB; the warm-up
// holds TBB's workers only until release(), and never longer than its cap; main()'s early workers are
// started only for the default search, with the thread count of its command line.
#include <catch2/catch.hpp>

#include <tbb/info.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/task_group.h>
#include <tbb/parallel_reduce.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>

#include "cli/heap.h"

namespace {

// The VmFlags of the mapping that holds `addr` (/proc/self/smaps), or "" if none.
std::string vm_flags_of(std::uintptr_t addr) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const auto dash = line.find('-'), space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const std::uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = lo <= addr && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

}  // namespace

TEST_CASE("a thread's malloc arena asks for huge pages, and its blocks start on a huge page", "[heap]") {
  if (const std::string why = hetplan::cli::thread_heap_unsupported(); !why.empty()) {
    std::cout << "HETPLAN_SKIP: " << why << std::endl;
    return;
  }
  hetplan::cli::tune_heap();  // as main() does first
  bool tuned = false, again = false;
  std::uintptr_t block = 0;
  std::string flags;
  std::thread worker([&] {
    tuned = hetplan::cli::tune_thread_heap();
    again = hetplan::cli::tune_thread_heap();  // once per thread: the second call only reports
    void* q = std::malloc(4 << 20);
    block = reinterpret_cast<std::uintptr_t>(q);
    flags = vm_flags_of(block);
    std::free(q);
  });
  worker.join();
  REQUIRE(tuned);
  CHECK(again);
  INFO("block " << std::hex << block << ", VmFlags" << flags);
  CHECK(flags.find(" hg ") != std::string::npos);  // VM_HUGEPAGE: madvise(MADV_HUGEPAGE)
  CHECK(block % (std::uintptr_t{2} << 20) == 0);  // the kept block ends where a huge page begins
}

TEST_CASE("WorkerHeapWarmUp holds its workers until release(), for at most 100 ms", "[heap]") {
  if (tbb::info::default_concurrency() < 2) {
    std::cout << "HETPLAN_SKIP: TBB has no worker thread on a machine of one core" << std::endl;
    return;
  }
  using namespace std::chrono_literals;
  // Runs a task enqueued in `arena` (only a worker takes it): true once it has run, false after 5 s.
  auto worker_runs_a_task = [](tbb::task_arena& arena) {
    auto ran = std::make_shared<std::atomic<bool>>(false);
    arena.enqueue([ran] { ran->store(true); });
    for (auto until = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < until;) {
      if (ran->load()) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  };
  tbb::task_arena arena(2);  // one worker
  {
    hetplan::cli::WorkerHeapWarmUp warm_up(arena);
    std::this_thread::sleep_for(200ms);  // past the hold: the worker is free again without release()
    CHECK(worker_runs_a_task(arena));
  }
  {
    hetplan::cli::WorkerHeapWarmUp warm_up(arena);
    warm_up.release();  // lets it go at once
    CHECK(worker_runs_a_task(arena));
    int sum = 0;
    arena.execute([&] { sum = tbb::parallel_reduce(tbb::blocked_range<int>(0, 1000), 0,
                                                    [](const tbb::blocked_range<int>& r, int s) {
                                                      for (int i = r.begin(); i != r.end(); ++i) s += i;
                                                      return s;
                                                    }, std::plus<int>()); });
    CHECK(sum == 499500);
  }
  tbb::task_arena single(1);  // no worker: nothing to hold, and release() returns at once
  hetplan::cli::WorkerHeapWarmUp none(single);
  const auto t0 = std::chrono::steady_clock::now();
  none.release();
  CHECK(std::chrono::steady_clock::now() - t0 < 50ms);
}

TEST_CASE("WorkerHeapWarmUp::share runs work on this thread and on the held workers, each item once", "[heap]") {
  using namespace std::chrono_literals;
  // 300 items of 100 us each, taken one at a time: the threads that took part, and how often each item ran.
  auto run = [](hetplan::cli::WorkerHeapWarmUp& warm_up) {
    std::atomic<int> next{0};
    std::vector<std::atomic<int>> runs(300);
    std::mutex mu;
    std::set<std::thread::id> threads;
    warm_up.share([&] {
      {
        std::lock_guard<std::mutex> lock(mu);
        threads.insert(std::this_thread::get_id());
      }
      for (int i = next.fetch_add(1); i < 300; i = next.fetch_add(1)) {
        runs[i].fetch_add(1);
        std::this_thread::sleep_for(100us);
      }
    });
    for (auto& r : runs) CHECK(r.load() == 1);  // every item ran, once, before share() returned
    return threads;
  };
  tbb::task_arena single(1);  // no worker: the calling thread does it all
  {
    hetplan::cli::WorkerHeapWarmUp warm_up(single);
    const auto threads = run(warm_up);
    CHECK(threads == std::set<std::thread::id>{std::this_thread::get_id()});
  }
  if (tbb::info::default_concurrency() < 2) {
    std::cout << "HETPLAN_SKIP: TBB has no worker thread on a machine of one core" << std::endl;
    return;
  }
  tbb::task_arena arena(2);  // one worker
  hetplan::cli::WorkerHeapWarmUp warm_up(arena);
  std::this_thread::sleep_for(5ms);  // the warm-up's threads start, and are held (up to 100 ms from its start)
  // 30 ms or more of items: the warm-up's starter thread and the held worker, which look every yield, join.
  const auto threads = run(warm_up);
  CHECK(threads.size() >= 2);
  CHECK(threads.size() <= 3);
  CHECK(threads.count(std::this_thread::get_id()) == 1);
  warm_up.release();
}

TEST_CASE("start_early_workers: only for the default search, with the command line's --threads", "[heap]") {
  auto start = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return hetplan::cli::start_early_workers(static_cast<int>(argv.size()), argv.data());
  };
  CHECK(start({"hetplan", "simulate", "--threads", "2"}) == nullptr);
  CHECK(start({"hetplan"}) == nullptr);
  CHECK(start({"hetplan", "search", "--cost-model", "metis", "--threads", "2"}) == nullptr);
  CHECK(start({"hetplan", "search", "--cost_model=metis"}) == nullptr);
  CHECK(hetplan::cli::take_early_workers() == nullptr);  // none offered by the calls above
  {
    auto early = start({"hetplan", "search", "--threads", "1", "--gbs", "8", "--threads=2"});
    REQUIRE(early != nullptr);
    CHECK(early->threads == 2);  // the last --threads, as CLI11 takes it
    CHECK(early->arena.max_concurrency() == 2);
    CHECK(hetplan::cli::take_early_workers() == early.get());
    CHECK(hetplan::cli::take_early_workers() == nullptr);  // taken once
    early->warm_up.release();
  }
  {
    auto early = start({"hetplan", "search", "--threads", "x2", "--cost-model", "sim"});
    REQUIRE(early != nullptr);
    CHECK(early->threads == 0);  // not a number: the default (the search then reports the flag)
    auto beyond = start({"hetplan", "search", "--", "--threads", "2"});  // after --: not a flag
    REQUIRE(beyond != nullptr);
    CHECK(beyond->threads == 0);
    CHECK(hetplan::cli::take_early_workers() == beyond.get());  // the latest started
  }
  CHECK(hetplan::cli::take_early_workers() == nullptr);  // destroyed: no longer offered
}

TEST_CASE("EarlyWorkers asked for more threads than cores run that many at once", "[heap]") {
  cpu_set_t mask;
  REQUIRE(sched_getaffinity(0, sizeof mask, &mask) == 0);
  const int cores = CPU_COUNT(&mask);
  const int threads = cores + 2;
  const auto limit = [] { return tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism); };
  const std::size_t before = limit();
  {
    hetplan::cli::EarlyWorkers early(threads);
    early.warm_up.release();
    CHECK(limit() == static_cast<std::size_t>(threads));
    // `threads` tasks that each wait (up to 5 s) until all have begun: only `threads` threads at once
    // can all begin in time; with TBB's limit of one worker per other core, at most `cores` would.
    std::atomic<int> begun{0};
    std::atomic<int> timed_out{0};
    early.arena.execute([&] {
      tbb::task_group g;
      for (int i = 0; i < threads; ++i)
        g.run([&] {
          begun.fetch_add(1);
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (begun.load() < threads)
            if (std::chrono::steady_clock::now() >= until) {
              timed_out.fetch_add(1);
              break;
            } else {
              std::this_thread::yield();
            }
        });
      g.wait();
    });
    CHECK(begun.load() == threads);
    CHECK(timed_out.load() == 0);
  }
  CHECK(limit() == before);  // the limit goes with the workers
  {
    hetplan::cli::EarlyWorkers early(cores);  // as many as cores: no limit of its own
    early.warm_up.release();
    CHECK_FALSE(early.more_threads_than_cores.has_value());
  }
}
