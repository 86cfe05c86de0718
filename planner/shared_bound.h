// SharedBound: the K smallest plan costs any worker of a search has found, and
// the pruning threshold they set: a hair above the K-th (infinity until K are
// found). The threshold only falls.
// Thread-safety: offer() and threshold() from any number of threads at once.
#pragma once

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <vector>

#include "base/spin_lock.h"

namespace hetplan {

class SharedBound {
 public:
  explicit SharedBound(int k) : k_(k) {}
  double threshold() const { return threshold_.load(std::memory_order_relaxed); }
  void offer(double cost) {
    if (cost > threshold()) return;
    std::lock_guard<SpinLock> lock(mu_);
    costs_.insert(std::upper_bound(costs_.begin(), costs_.end(), cost), cost);
    if (static_cast<int>(costs_.size()) > k_) costs_.pop_back();
    // A hair above the K-th cost: a bound summed in another order than the cost itself may exceed a
    // plan's exact cost by a few ulps, and must not prune a plan that ties the K-th (ties are broken by
    // the plan order, not by which was found first).
    if (static_cast<int>(costs_.size()) == k_)
      threshold_.store(costs_.back() * (1 + 1e-9), std::memory_order_relaxed);
  }

 private:
  int k_;
  SpinLock mu_;  // taken where a plan is found: both threads find plans early in the search
  std::vector<double> costs_;
  std::atomic<double> threshold_{std::numeric_limits<double>::infinity()};
};

}  // namespace hetplan
