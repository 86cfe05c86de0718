#include "cli/heap.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

// A sanitizer replaces malloc: glibc's layout, which tune_thread_heap reads, is not there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HETPLAN_FOREIGN_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define HETPLAN_FOREIGN_MALLOC 1
#endif
#endif

namespace hetplan::cli {

namespace {
[[maybe_unused]] constexpr std::uintptr_t kHugePage = 2 << 20;

#if defined(__GLIBC__)
// After `freed` (a block just freed back to the top of its heap, from where the next block is carved),
// the heap's memory below the next huge-page boundary is small-page backed (pages there were touched
// before the madvise). A block from `freed` up to that boundary, never freed, makes the blocks after it
// start at the boundary; returns it (nullptr if the boundary is too close to bother). Its chunk ends 16
// bytes below the boundary (glibc: a chunk of n + 8 bytes rounded up to 16, starting 16 bytes before
// its block): the next chunk's header is there, and that chunk's block starts at the boundary.
void* fill_to_huge_page(std::uintptr_t freed) {
  const std::uintptr_t boundary = (freed + kHugePage - 1) & ~(kHugePage - 1);
  return boundary - freed > 64 ? std::malloc(boundary - freed - 8) : nullptr;
}
// The blocks fill_to_huge_page set aside, never freed (volatile: the compiler may not drop the malloc).
void* volatile main_kept = nullptr;
thread_local void* volatile thread_kept = nullptr;
#endif
}  // namespace

// The search builds tables of a few MB per (node order, micro-batch) group and frees each when its
// group is done. By default glibc serves blocks that large with fresh mmaps and gives freed memory
// back to the kernel, so every table faults its pages in anew (row 2: 6.6k page faults, 10k on two
// threads). Kept in the heap instead, the next table reuses them (4.0k and 5.0k). Peak memory is
// unchanged: only memory already freed is kept, and only up to kKeepFreed.
// The faults that remain are the first touch of the peak's pages, 1.5-3 us each on a VM. So the main
// heap also asks for transparent huge pages (one fault per 2 MB; a no-op where THP is off): its first
// kHugeHeap bytes are reserved at once and madvised. Row 2: 4.0k faults -> 0.9k on one thread, the
// search 7-8% faster, peak RSS +1-2 MB. The heap's memory up to the first huge-page boundary is then
// set aside (fill_to_huge_page): 0.8k -> 0.3k faults, the search 2% faster on one thread, 4% on two.
// (Other threads have arenas of their own: tune_thread_heap.)
void tune_heap() {
#if defined(__GLIBC__)
  constexpr int kLargestFromHeap = 32 << 20;  // glibc's upper limit for M_MMAP_THRESHOLD on 64-bit
  constexpr int kKeepFreed = 256 << 20;
  constexpr int kHugeHeap = 64 << 20;
  mallopt(M_MMAP_THRESHOLD, kLargestFromHeap);
  mallopt(M_TRIM_THRESHOLD, kKeepFreed);
  mallopt(M_TOP_PAD, kHugeHeap);
  void* probe = std::malloc(1 << 20);  // grows the heap by kHugeHeap more (virtual memory: untouched)
  const auto p = reinterpret_cast<std::uintptr_t>(probe);
  const auto lo = (p + kHugePage - 1) & ~(kHugePage - 1);
  void* brk = sbrk(0);
  const auto hi = reinterpret_cast<std::uintptr_t>(brk) & ~(kHugePage - 1);
  // Only where the block came from the heap below the break (not where a sanitizer's allocator serves
  // malloc from its own mappings).
  const bool advised = brk != reinterpret_cast<void*>(-1) && hi > lo &&
                       hi - lo <= 2 * static_cast<std::uintptr_t>(kHugeHeap) &&
                       madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) == 0;
  std::free(probe);
  if (advised && !main_kept) main_kept = fill_to_huge_page(p);
  mallopt(M_TOP_PAD, 128 << 10);  // glibc's default
#endif
}

// A thread's first malloc gives it an arena of its own: a heap reserved as one mapping of
// kArenaHeap bytes aligned to that size (glibc's HEAP_MAX_SIZE on 64-bit), made writable as it grows,
// its first page holding the arena's header. Without this, a search worker faulted its tables in 4 KB
// at a time (row 2 on two threads: 2.8k faults, 1.9k of them the worker's, against 0.8k on one thread).
//  1. A block of kGrow bytes (below M_MMAP_THRESHOLD, so from the arena) makes the heap writable that
//     far; freed, it stays in the arena (M_TRIM_THRESHOLD above it), untouched.
//  2. The whole heap is madvised for huge pages.
//  3. The arena's first 2 MB cannot be huge-page backed (its header page is already there): a block
//     up to the next 2 MB boundary is kept for the thread's life, so the thread's blocks come from above.
// Only where the block came from a thread arena's heap: not mmapped on its own (glibc's count of such
// blocks did not grow) and not from the main heap (below the break).
bool tune_thread_heap() {
#if defined(__GLIBC__) && !defined(HETPLAN_FOREIGN_MALLOC)
  constexpr std::uintptr_t kArenaHeap = 64 << 20;
  constexpr std::size_t kGrow = 24 << 20;
  thread_local int state = 0;         // 1: done, 2: not possible here
  if (state != 0) return state == 1;
  state = 2;
  const std::size_t mmapped_before = mallinfo2().hblks;
  void* probe = std::malloc(kGrow);
  if (!probe) return false;
  const bool own_mapping = mallinfo2().hblks != mmapped_before;
  const auto p = reinterpret_cast<std::uintptr_t>(probe);
  const auto brk = reinterpret_cast<std::uintptr_t>(sbrk(0));
  const std::uintptr_t base = p & ~(kArenaHeap - 1);
  const bool thread_heap = !own_mapping && p > brk && p + kGrow <= base + kArenaHeap;
  const bool advised = thread_heap && madvise(reinterpret_cast<void*>(base), kArenaHeap, MADV_HUGEPAGE) == 0;
  std::free(probe);
  if (!advised) return false;
  thread_kept = fill_to_huge_page(p);
  state = 1;
  return true;
#else
  return false;
#endif
}

}  // namespace hetplan::cli
