// Process-level tuning of glibc's malloc for the search's allocation pattern:
// tables of a few MB per (node order, micro-batch) group, built, read and
// freed, on a machine where each first touch of a page is a fault of a few
// microseconds (a VM). Both calls only change where memory comes from and how
// it is paged in: never a value. Neither does anything where malloc is not
// glibc's own (another libc, a sanitizer, valgrind, a preloaded allocator).
//
// Thread-safety: tune_heap() once, at the start of main(), before other threads
// exist; tune_thread_heap() on the thread whose arena it prepares (any number of
// threads at once).
#pragma once

#include <functional>
#include <string>

#include <tbb/task_arena.h>

#include <thread>

namespace hetplan::cli {

// The main heap: keeps freed memory (up to 256 MB) instead of returning it, and
// serves blocks up to 32 MB from the heap; its first 64 MB ask for transparent
// huge pages (one fault per 2 MB where THP is on, else nothing changes), and the
// blocks after the call start at a 2 MB boundary (the memory below it is kept
// aside for the process's life: under 2 MB of address space, one page of memory).
void tune_heap();

// The calling thread's own malloc arena (glibc gives each new thread one): the
// same for the arena's heap. Meant for a worker thread before its first work
// (PlanSearchOptions::on_worker_start). Does its work once per thread; returns
// true where it did it: false where thread_heap_unsupported() names a reason,
// or where this thread has no heap of its own (glibc's arena limit reached, or
// its heaps made smaller than a 24 MB block by a tunable).
bool tune_thread_heap();

// Why tune_thread_heap() cannot work in this process ("" where it can): not
// glibc, a sanitizer's allocator, malloc not glibc's (valgrind or a preloaded
// allocator), or a kernel without transparent huge pages.
std::string thread_heap_unsupported();

// Gets the workers of `arena` ready for a search that will run there, while the constructing thread
// goes on (reading the inputs):
//  - the arena starts (and TBB with it) on a thread of its own, about 0.7 ms that the constructing
//    thread no longer spends;
//  - each worker (up to the arena's slots - 1) runs tune_thread_heap(), so that a search's workers find
//    their heaps ready instead of preparing them (a few milliseconds each, on a VM) in their first task;
//  - then it keeps running (yielding to any other thread) until wait() (which a search calls when its
//    parallel work starts: PlanSearchOptions::on_parallel_start), for at most 100 ms: a worker
//    that sleeps gives its core back, and on a VM a core given back can take milliseconds to return
//    (on a 2-core VM, a worker woken for the search's start or a thread started to read the inputs
//    often waited 1-3 ms for it).
// While they are held, share() gives them work of the constructing thread's (reading the inputs), in
// place of a thread started for it: on a VM a new thread's first allocations fault in a heap of its own,
// and the 2-core VM has no third core for it beside a held worker.
// The tasks are enqueued, for the workers (the constructing thread does no TBB waiting before the
// search); a worker that runs none prepares its heap at the search's start (on_worker_start), as
// without this. With one slot, or where TBB has no worker, it does nothing. Never changes a value.
// Thread-safety: one thread constructs, shares, waits and destroys.
// REQUIRES: `arena` outlives this object.
class WorkerHeapWarmUp {
 public:
  explicit WorkerHeapWarmUp(tbb::task_arena& arena);
  ~WorkerHeapWarmUp() { wait(); }
  WorkerHeapWarmUp(const WorkerHeapWarmUp&) = delete;
  WorkerHeapWarmUp& operator=(const WorkerHeapWarmUp&) = delete;
  // Lets the workers go (to the search's tasks); does not wait for a worker still on its way.
  void wait();
  // Runs `work` on this thread and on each worker held now or until this thread's call of it returns
  // (none, if no worker has started yet); returns once every call of it has returned. Meant for work
  // that takes items until none is left (ProfileSet::load's Spread).
  // REQUIRES: `work` does not throw; no other share() runs at the same time in the process.
  void share(const std::function<void()>& work);

 private:
  unsigned long id_ = 0;  // this warm-up's number (0: none enqueued); its tasks hold until it is released
  std::thread starter_;
};

}  // namespace hetplan::cli
