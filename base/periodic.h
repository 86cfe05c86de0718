// Periodic: calls a function about once a second from a side thread, from
// construction until stop() or destruction (the searches' progress
// reports). The destructor stops and joins the thread, also when the search
// throws.
//
// Thread-safety: `tick` runs on the side thread, concurrently with the
// caller: it may only read what is safe to read concurrently (atomics).
// An empty `tick` starts no thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace hetplan {

class Periodic {
 public:
  explicit Periodic(std::function<void()> tick) {
    if (!tick) return;
    thread_ = std::thread([this, tick = std::move(tick)] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::seconds(1), [&] { return finished_; })) tick();
    });
  }
  ~Periodic() { stop(); }
  // Stops and joins the thread; later calls do nothing.
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Periodic(const Periodic&) = delete;
  Periodic& operator=(const Periodic&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::thread thread_;
};

}  // namespace hetplan
