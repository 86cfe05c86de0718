// WorkerStart: runs a hook once on each thread that calls enter(), other than
// the thread that made the WorkerStart. PlanSearch calls enter() first in each
// of its parallel task bodies, so a TBB worker runs the hook before it does any
// of the search's work. (Not a tbb::task_scheduler_observer: oneTBB 2021 keeps an
// observer's proxy alive after observe(false) while workers still refer to it,
// and LeakSanitizer reported it at exit.)
//
// Once per thread per WorkerStart: TBB keeps its workers, so a later WorkerStart
// (a later search) runs the hook again on the same threads; a hook must be
// idempotent per thread. enter() with an empty hook does nothing.
// Thread-safety: enter() from any number of threads at once; the hook may run
// on several threads at once. REQUIRES: `hook` outlives the WorkerStart.
#pragma once

#include <tbb/enumerable_thread_specific.h>

#include <functional>
#include <thread>

namespace hetplan {

class WorkerStart {
 public:
  explicit WorkerStart(const std::function<void()>& hook) : hook_(hook), owner_(std::this_thread::get_id()) {}
  WorkerStart(const WorkerStart&) = delete;
  WorkerStart& operator=(const WorkerStart&) = delete;

  void enter() {
    if (!hook_) return;
    char& started = started_.local();
    if (started) return;
    started = 1;
    if (std::this_thread::get_id() != owner_) hook_();
  }

 private:
  const std::function<void()>& hook_;
  const std::thread::id owner_;
  tbb::enumerable_thread_specific<char> started_{0};
};

}  // namespace hetplan
