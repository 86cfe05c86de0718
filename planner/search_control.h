// SearchControl: what the threads of one search share to stop it and to report
// its progress: the stop flag (a time budget, a cancellation, or a thread's
// exception) and the counts published so far. Counters: one worker's counts.
// Thread-safety: every member from any number of threads at once, except a
// WorkerCounters, which belongs to one thread. REQUIRES: `cancel` (may be
// null) outlives the SearchControl.
#pragma once

#include <atomic>
#include <chrono>

namespace hetplan {

struct Counters {
  long long enumerated = 0, pruned = 0, costed = 0, infeasible = 0;
  long long units = 0;  // work units finished
};

// One worker's counts, the part of them already added to the shared (progress) counts, and the units and
// enumerations since it last read the stop flags and the clock.
struct WorkerCounters {
  Counters own;
  Counters published;
  long long since_check = 0;
};

class SearchControl {
 public:
  using Clock = std::chrono::steady_clock;
  enum Why { kNotStopped = 0, kTimeBudget = 1, kCancelled = 2, kProven = 3 };

  SearchControl(Clock::time_point start, double time_budget_s, const std::atomic<bool>* cancel)
      : start_(start), time_budget_s_(time_budget_s), cancel_(cancel) {}

  Clock::time_point start() const { return start_; }
  double time_budget_s() const { return time_budget_s_; }  // 0: none
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  bool stopped() const { return stop_.load(std::memory_order_relaxed); }
  Why why() const { return static_cast<Why>(why_.load()); }
  // Stops the search without a reason (a thread's exception): no thread waits for ever on its work.
  void stop_now() { stop_.store(true); }
  // Stops the search because what is left cannot beat the best found by more than the gap asked for.
  void stop_proven() {
    int expected = kNotStopped;
    why_.compare_exchange_strong(expected, kProven);
    stop_.store(true);
  }

  // Reads the cancellation flag and the clock; true: stop.
  bool check_stop() {
    if (stop_.load(std::memory_order_relaxed)) return true;
    if (cancel_ && cancel_->load(std::memory_order_relaxed)) {
      why_.store(kCancelled);
      stop_.store(true);
      return true;
    }
    if (time_budget_s_ > 0 && elapsed_s() > time_budget_s_) {
      why_.store(kTimeBudget);
      stop_.store(true);
      return true;
    }
    return false;
  }

  // The worker's counts into the shared (progress) counts: added to now and then, not per unit, since
  // the threads would contend on their cache line.
  void publish(WorkerCounters& w) {
    enumerated_.fetch_add(w.own.enumerated - w.published.enumerated, std::memory_order_relaxed);
    pruned_.fetch_add(w.own.pruned - w.published.pruned, std::memory_order_relaxed);
    costed_.fetch_add(w.own.costed - w.published.costed, std::memory_order_relaxed);
    units_done_.fetch_add(w.own.units - w.published.units, std::memory_order_relaxed);
    w.published = w.own;
  }

  // Every 1024 units or enumerations: publish, read the clock and the flags. True: stop.
  bool every_so_often(WorkerCounters& w) {
    if (stop_.load(std::memory_order_relaxed)) return true;
    if (++w.since_check < 1024) return false;
    w.since_check = 0;
    publish(w);
    return check_stop();
  }

  long long units_done() const { return units_done_.load(); }
  long long enumerated() const { return enumerated_.load(); }
  long long pruned() const { return pruned_.load(); }
  long long costed() const { return costed_.load(); }

 private:
  const Clock::time_point start_;
  const double time_budget_s_;
  const std::atomic<bool>* cancel_;
  std::atomic<bool> stop_{false};
  std::atomic<int> why_{kNotStopped};
  std::atomic<long long> units_done_{0};
  std::atomic<long long> enumerated_{0}, pruned_{0}, costed_{0};
};

}  // namespace hetplan
