// SpinLock: a mutex (BasicLockable) for critical sections of a few
// microseconds that several search threads enter at once. A waiter spins,
// then yields, and never sleeps in the kernel: on the 2-core VM this project
// runs on, a thread put to sleep on a std::mutex and woken again often lost
// tens of microseconds to the wake-up, about 1.2 ms per row-2 search on two
// threads in MixedLists::intern (traced; with this lock, 0.04 ms).
//
// Not fair, not recursive. Thread-safety: any number of threads.
#pragma once

#include <atomic>
#include <thread>

namespace hetplan {

class SpinLock {
 public:
  void lock() {
    for (int spins = 0; locked_.exchange(true, std::memory_order_acquire); ++spins) {
      // Wait reading, not writing, the flag (the holder keeps its cache line), and give the core away
      // now and then: a holder preempted by a thread of the same process must get to run.
      while (locked_.load(std::memory_order_relaxed))
        if (++spins % 128 == 0) std::this_thread::yield();
    }
  }
  bool try_lock() { return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace hetplan
