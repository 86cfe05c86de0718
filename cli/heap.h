// Process-level tuning of glibc's malloc for the search's allocation pattern:
// tables of a few MB per (node order, micro-batch) group, built, read and
// freed, on a machine where each first touch of a page is a fault of a few
// microseconds (a VM). Both calls only change where memory comes from and how
// it is paged in: never a value, and no-ops outside glibc or under a sanitizer's
// allocator.
//
// Thread-safety: tune_heap() once, at the start of main(), before other threads
// exist; tune_thread_heap() on the thread whose arena it prepares (any number of
// threads at once).
#pragma once

namespace hetplan::cli {

// The main heap: keeps freed memory (up to 256 MB) instead of returning it, and
// serves blocks up to 32 MB from the heap; its first 64 MB ask for transparent
// huge pages (one fault per 2 MB where THP is on, else nothing changes).
void tune_heap();

// The calling thread's own malloc arena (glibc gives each new thread one): the
// same huge-page advice for the arena's heap, past the arena's first 2 MB (already
// touched, so not huge-page backed: a block of the rest of them is kept for the
// thread's life, about 2 MB of address space and one page of memory). Meant for a
// worker thread before its first work (PlanSearchOptions::on_worker_start).
// Returns true where it did so: false outside glibc, under a sanitizer's
// allocator, where the thread's blocks do not come from an arena of its own
// (tune_heap() not called first: then 24 MB is above glibc's mmap threshold), or
// where the kernel has no transparent huge pages (madvise refused).
bool tune_thread_heap();

}  // namespace hetplan::cli
