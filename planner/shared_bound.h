// SharedBound: the K smallest plan costs any worker of a search has found, and
// the pruning threshold they set: a hair above the K-th, divided by 1 + gap
// (infinity until K are found). With gap 0 the search is exact; with gap G a
// plan is pruned once a bound shows it cannot beat the K-th by more than a
// factor 1 + G, so the best plan returned is within 1 + G of the optimum. The
// threshold only falls.
// Thread-safety: offer() and threshold() from any number of threads at once.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "base/spin_lock.h"

namespace hetplan {

class SharedBound {
 public:
  explicit SharedBound(int k, double gap = 0) : k_(k), shrink_((1 + 1e-9) / (1 + gap)) {}
  double threshold() const { return threshold_.load(std::memory_order_relaxed); }
  // The least cost found (infinity before any).
  double best() const { return best_.load(std::memory_order_relaxed); }
  // When the first plan was offered (REQUIRES: best() finite).
  std::chrono::steady_clock::time_point first_found() const {
    std::lock_guard<SpinLock> lock(mu_);
    return first_;
  }
  // A plan of cost `cost`; `id` names the plan (a hash of its PlanKey order): the same plan offered twice
  // (a seed the search meets again, or a plan of an earlier setting part met again under another
  // setting) counts once, at its least cost.
  void offer(double cost, unsigned long long id) {
    if (cost > threshold() / shrink_) return;  // not below the K-th
    std::lock_guard<SpinLock> lock(mu_);
    const Entry e{cost, id};
    for (auto x = costs_.begin(); x != costs_.end(); ++x)
      if (x->id == id) {
        if (x->cost <= cost) return;
        costs_.erase(x);
        break;
      }
    costs_.insert(std::upper_bound(costs_.begin(), costs_.end(), e,
                                   [](const Entry& a, const Entry& b) { return a.cost < b.cost; }),
                  e);
    if (static_cast<int>(costs_.size()) > k_) costs_.pop_back();
    // A hair above the K-th cost: a bound summed in another order than the cost itself may exceed a
    // plan's exact cost by a few ulps, and must not prune a plan that ties the K-th (ties are broken by
    // the plan order, not by which was found first).
    if (!std::isfinite(best())) first_ = std::chrono::steady_clock::now();
    best_.store(costs_.front().cost, std::memory_order_relaxed);
    if (static_cast<int>(costs_.size()) == k_) threshold_.store(costs_.back().cost * shrink_, std::memory_order_relaxed);
  }

 private:
  int k_;
  double shrink_;  // (1 + 1e-9) / (1 + gap)
  mutable SpinLock mu_;
  std::chrono::steady_clock::time_point first_;  // taken where a plan is found: both threads find plans early in the search
  struct Entry {
    double cost;
    unsigned long long id;
  };
  std::vector<Entry> costs_;
  std::atomic<double> threshold_{std::numeric_limits<double>::infinity()};
  std::atomic<double> best_{std::numeric_limits<double>::infinity()};
};

}  // namespace hetplan
