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
#include <memory>
#include <optional>
#include <string>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <pthread.h>

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
//  - a thread of its own (the starter) starts at once on another core than the constructing thread's
//    (Linux placed it on the creator's core, where it waited until the creator's reading was done);
//    it starts the arena (and TBB with it: about 0.8 ms on a VM, which the constructing thread no
//    longer spends), then takes part in the constructing thread's reading (share()) if that is
//    offered before release(), and ends;
//  - each worker (up to the arena's slots - 1) runs tune_thread_heap(), so that a search's workers find
//    their heaps ready instead of preparing them (a few milliseconds each, on a VM) in their first task;
//  - then it keeps running (yielding to any other thread) until release() (which a search calls when
//    its parallel work starts: PlanSearchOptions::on_parallel_start), at most 100 ms after the
//    warm-up began: a worker that sleeps gives its core back, and on a VM a core given back can take
//    milliseconds to return (on a 2-core VM, a worker woken for the search's start or a thread
//    started to read the inputs often waited 1-3 ms for it).
// While the starter waits for it, or the workers are held, share() gives them work of the constructing
// thread's (reading the inputs).
// The tasks are enqueued, for the workers (the constructing thread does no TBB waiting before the
// search); a worker that runs none prepares its heap at the search's start (on_worker_start), as
// without this. With one slot, or where TBB has no worker, it does nothing. Never changes a value.
// Thread-safety: one thread constructs, shares, releases and destroys.
// REQUIRES: `arena` outlives this object.
class WorkerHeapWarmUp {
 public:
  explicit WorkerHeapWarmUp(tbb::task_arena& arena);
  ~WorkerHeapWarmUp();  // releases, and waits for the starter thread
  WorkerHeapWarmUp(const WorkerHeapWarmUp&) = delete;
  WorkerHeapWarmUp& operator=(const WorkerHeapWarmUp&) = delete;
  // Lets the workers go (to the search's tasks); waits for nothing (not for the starter, which may still
  // be starting the arena: the search's parallel work begins without the workers, and they join it).
  void release();
  // Runs `work` on this thread and on each worker held now or until this thread's call of it returns
  // (none, if no worker has started yet); returns once every call of it has returned. Meant for work
  // that takes items until none is left (ProfileSet::load's Spread).
  // REQUIRES: `work` does not throw; no other share() runs at the same time in the process.
  void share(const std::function<void()>& work);

 private:
  unsigned long id_ = 0;  // this warm-up's number (0: none started); its threads hold until it is released
  std::optional<pthread_t> starter_;  // runs the warm-up's start (on another core than the constructor's)
};

// The default search's arena and warm-up, started by main() as it begins, before the command line is
// parsed and the inputs are read: TBB's start on the warm-up's thread (about 0.8 ms on a VM) then ends
// about when the reading begins (row 2: TBB's worker joins it 0.1-0.2 ms after it starts), where a
// warm-up started with the search command came 0.5 ms later, after that much of the reading.
struct EarlyWorkers {
  // An arena of `threads` slots (0: TBB's default concurrency) and its warm-up, started.
  explicit EarlyWorkers(int threads);
  ~EarlyWorkers();  // no longer offered to take_early_workers; lets the workers go
  EarlyWorkers(const EarlyWorkers&) = delete;
  EarlyWorkers& operator=(const EarlyWorkers&) = delete;
  const int threads;  // as asked: 0 for the default
  // Where more threads are asked than this process has cores: TBB's limit raised to them for the
  // arena's lifetime (planner/thread_limit.h).
  std::optional<tbb::global_control> more_threads_than_cores;
  tbb::task_arena arena;
  WorkerHeapWarmUp warm_up;

 private:
  EarlyWorkers(int threads, int cores);  // cores: the process's, read once
};

// For argv that asks for the default search (argv[1] is "search" and no `--cost-model metis`), starts
// EarlyWorkers with the thread count of the last --threads (0 where there is none or it is not a
// whole number from 0 to 4096: the search then checks the flag and reports it), and offers them to
// take_early_workers until the returned object is destroyed. Null otherwise.
// REQUIRES: called once, on main()'s thread, before it parses the command line; the returned object
// outlives the command's run.
std::unique_ptr<EarlyWorkers> start_early_workers(int argc, char** argv);

// The workers start_early_workers started, once: null where none were started or they were taken
// already. A command that takes them and does not search in their arena lets them go at once
// (warm_up.release()), or TBB's workers stay held for up to 100 ms.
EarlyWorkers* take_early_workers();

}  // namespace hetplan::cli
