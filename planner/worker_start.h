// WorkerStart: runs a hook on each TBB worker thread as it first enters an
// arena while this object observes it, before that thread runs any task there
// (tbb::task_scheduler_observer's entry callback). A worker may leave and enter
// again: the hook runs once per thread per WorkerStart. TBB keeps its workers,
// so a later WorkerStart runs it again on the same threads: a hook must be
// idempotent per thread.
//
// Not on threads that are not TBB workers (the thread calling execute()).
// REQUIRES: `arena` and `hook` outlive the WorkerStart. An empty hook observes
// nothing. Thread-safety: the hook may run on several workers at once.
#pragma once

#include <tbb/enumerable_thread_specific.h>
#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include <functional>

namespace hetplan {

class WorkerStart : public tbb::task_scheduler_observer {
 public:
  WorkerStart(tbb::task_arena& arena, const std::function<void()>& hook)
      : tbb::task_scheduler_observer(arena), hook_(hook) {
    if (hook_) observe(true);
  }
  ~WorkerStart() override { observe(false); }  // waits for callbacks still running
  WorkerStart(const WorkerStart&) = delete;
  WorkerStart& operator=(const WorkerStart&) = delete;

  void on_scheduler_entry(bool worker) override {
    if (!worker) return;
    char& started = started_.local();
    if (started) return;
    started = 1;
    hook_();
  }

 private:
  const std::function<void()>& hook_;
  tbb::enumerable_thread_specific<char> started_{0};
};

}  // namespace hetplan
