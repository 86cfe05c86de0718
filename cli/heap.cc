#include "cli/heap.h"

#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <pthread.h>

#include "planner/thread_limit.h"

#if defined(__GLIBC__)
#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#endif

// A sanitizer replaces malloc: glibc's layout, which tune_thread_heap reads, is not there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HETPLAN_FOREIGN_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer) || \
    __has_feature(hwaddress_sanitizer)
#define HETPLAN_FOREIGN_MALLOC 1
#endif
#endif

namespace hetplan::cli {

namespace {
[[maybe_unused]] constexpr std::uintptr_t kHugePage = 2 << 20;

#if defined(__GLIBC__)
// The blocks kept below a heap's first huge-page boundary, never freed (volatile: the compiler may not
// drop the allocation).
void* volatile main_kept = nullptr;
thread_local void* volatile thread_kept = nullptr;

// `block` (at address p, the last block carved from its heap's top) resized in place to end just below
// the first huge-page boundary at or above `touched` (the end of the memory glibc has written since the
// madvise: the top's header after the block): the heap's blocks after it then start at that boundary,
// and the memory below it, small-page backed (a 2 MB range with any page touched before the madvise
// never gets a huge page), is kept aside. glibc: a block of n bytes is a chunk of n + 8 rounded up to
// 16, starting 16 bytes before it; so n = boundary - p - 8 makes the chunk end 16 bytes below the
// boundary, where the next chunk's header goes. realloc shrinks or grows in place into the top (not
// free + malloc, which could take a free chunk elsewhere in the heap). Frees `block` instead where the
// boundary is too close to bother.
void* fill_to_huge_page(void* block, std::uintptr_t p, std::uintptr_t touched) {
  const std::uintptr_t boundary = (std::max(p, touched) + kHugePage - 1) & ~(kHugePage - 1);
  if (boundary - p <= 64) {
    std::free(block);
    return nullptr;
  }
  return std::realloc(block, boundary - p - 8);
}
#endif
}  // namespace

std::string thread_heap_unsupported() {
  // The process's answer, found once (by tune_heap, at the start of main()), not again on every thread.
  static const std::string why = [] () -> std::string {
#if !defined(__GLIBC__)
    return "not glibc";
#elif defined(HETPLAN_FOREIGN_MALLOC)
    return "a sanitizer's allocator";
#else
    // glibc exports its allocator also as __libc_malloc; valgrind and preloaded allocators replace malloc.
    if (dlsym(RTLD_DEFAULT, "malloc") != dlsym(RTLD_DEFAULT, "__libc_malloc"))
      return "malloc is not glibc's (valgrind or a preloaded allocator)";
    std::error_code ec;
    if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage", ec))
      return "this kernel has no transparent huge pages";
    return "";
#endif
  }();
  return why;
}

// The search builds tables of a few MB per (node order, micro-batch) group and frees each when its
// group is done. By default glibc serves blocks that large with fresh mmaps and gives freed memory
// back to the kernel, so every table faults its pages in anew (row 2: 6.6k page faults, 10k on two
// threads). Kept in the heap instead, the next table reuses them (4.0k and 5.0k). Peak memory is
// unchanged: only memory already freed is kept, and only up to kKeepFreed.
// The faults that remain are the first touch of the peak's pages, 1.5-3 us each on a VM. So the main
// heap also asks for transparent huge pages (one fault per 2 MB; a no-op where THP is off): its first
// kHugeHeap bytes are reserved at once and madvised. Row 2: 4.0k faults -> 0.9k on one thread, the
// search 7-8% faster, peak RSS +1-2 MB. The heap's memory up to the first huge-page boundary is then
// set aside (fill_to_huge_page): 0.8k -> 0.3k faults, the search 2-4% faster on one thread.
// (Other threads have arenas of their own: tune_thread_heap.)
void tune_heap() {
#if defined(__GLIBC__)
  constexpr int kLargestFromHeap = 32 << 20;  // glibc's upper limit for M_MMAP_THRESHOLD on 64-bit
  constexpr int kKeepFreed = 256 << 20;
  constexpr int kHugeHeap = 64 << 20;
  mallopt(M_MMAP_THRESHOLD, kLargestFromHeap);
  mallopt(M_TRIM_THRESHOLD, kKeepFreed);
  mallopt(M_TOP_PAD, kHugeHeap);
  // Before the probe: nothing may be allocated between it and fill_to_huge_page's realloc, which must
  // find the heap's top right after it (this check allocates).
  const bool glibc_malloc = thread_heap_unsupported().empty();
  constexpr std::size_t kProbe = 1 << 20;
  void* probe = std::malloc(kProbe);  // grows the heap by kHugeHeap more (virtual memory: untouched)
  const auto p = reinterpret_cast<std::uintptr_t>(probe);
  const auto lo = (p + kHugePage - 1) & ~(kHugePage - 1);
  void* brk = sbrk(0);
  const auto hi = reinterpret_cast<std::uintptr_t>(brk) & ~(kHugePage - 1);
  // Only where the block came from the heap below the break (not where a sanitizer's allocator serves
  // malloc from its own mappings).
  const bool advised = glibc_malloc && brk != reinterpret_cast<void*>(-1) && hi > lo &&
                       hi - lo <= 2 * static_cast<std::uintptr_t>(kHugeHeap) &&
                       madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) == 0;
  if (advised && !main_kept)
    main_kept = fill_to_huge_page(probe, p, p + kProbe + 32);  // the top's header was written after it
  else
    std::free(probe);
  mallopt(M_TOP_PAD, 128 << 10);  // glibc's default
#endif
}

// A thread's first malloc gives it an arena of its own: a heap reserved as one mapping of
// kArenaHeap bytes aligned to that size (glibc's HEAP_MAX_SIZE on 64-bit), made writable as it grows,
// its first page holding the arena's header. Without this, a search worker faulted its tables in 4 KB
// at a time (row 2 on two threads: 2.8k faults, 1.9k of them the worker's, against 0.8k on one thread).
//  1. A block of kGrow bytes makes the heap writable that far (virtual memory: untouched).
//  2. Only where that block is in a thread arena's heap: its chunk's size word (the 8 bytes before it)
//     has glibc's NON_MAIN_ARENA bit and not IS_MMAPPED, and it lies inside one aligned heap.
//  3. The whole heap is madvised for huge pages.
//  4. The block is shrunk in place to end below the heap's next 2 MB boundary and kept (see
//     fill_to_huge_page): the rest goes back to the top (M_TRIM_THRESHOLD keeps it there, untouched),
//     and the thread's later blocks start on a huge page.
bool tune_thread_heap() {
#if defined(__GLIBC__) && !defined(HETPLAN_FOREIGN_MALLOC)
  constexpr std::uintptr_t kArenaHeap = 64 << 20;
  constexpr std::size_t kGrow = 24 << 20;
  constexpr std::size_t kNonMainArena = 0x4, kMmapped = 0x2;
  thread_local int state = 0;  // 1: done here, 2: not possible here
  if (state != 0) return state == 1;
  state = 2;
  if (!thread_heap_unsupported().empty()) return false;  // before the probe (it allocates): see tune_heap
  void* probe = std::malloc(kGrow);
  if (!probe) return false;
  const auto p = reinterpret_cast<std::uintptr_t>(probe);
  const std::size_t size_word = *reinterpret_cast<const volatile std::size_t*>(p - sizeof(std::size_t));
  const std::uintptr_t base = p & ~(kArenaHeap - 1);
  const bool own_heap = (size_word & kNonMainArena) && !(size_word & kMmapped) && p + kGrow <= base + kArenaHeap;
  if (!own_heap || madvise(reinterpret_cast<void*>(base), kArenaHeap, MADV_HUGEPAGE) != 0) {
    std::free(probe);
    return false;
  }
  // (Its top's header, written at p + kGrow, leaves that one 2 MB range on small pages.)
  thread_kept = fill_to_huge_page(probe, p, p);
  state = 1;
  return true;
#else
  return false;
#endif
}

namespace {
// The process's cores (its affinity mask), and whether it could be read.
struct Cores {
  bool known = false;
#if defined(__GLIBC__)
  cpu_set_t set;
#endif
};
Cores process_cores() {
  Cores c;
#if defined(__GLIBC__)
  c.known = sched_getaffinity(0, sizeof c.set, &c.set) == 0;
#endif
  return c;
}
// How many `cores` are: TBB's default concurrency, counted without asking TBB, whose answer first loads
// its topology support (library look-ups, about 0.3 ms on a VM), which the arena's start does anyway,
// on the warm-up's own thread. TBB's answer where the mask could not be read.
int count(const Cores& cores) {
#if defined(__GLIBC__)
  if (cores.known && CPU_COUNT(&cores.set) > 0) return CPU_COUNT(&cores.set);
#endif
  return tbb::info::default_concurrency();
}
// Lets the calling thread run on every core of `cores` again (where known).
void run_anywhere([[maybe_unused]] const Cores& cores) {
#if defined(__GLIBC__)
  if (cores.known) sched_setaffinity(0, sizeof cores.set, &cores.set);  // this thread only
#endif
}

// Runs `work` on a new thread that starts confined to the cores of `cores` other than the calling
// thread's one (all of them where that leaves none, or the cores are not known); `work` may lift that
// (run_anywhere) once it runs. Linux places a new thread by its creator, on a VM often on the
// creator's own core: it then waited there, for most of a millisecond or until the creator was done
// with its reading (row 2: 2 ms), while the other core was idle. Returns nothing where no thread could
// be made (`work` is dropped).
std::optional<pthread_t> start_on_another_core(const Cores& cores, std::unique_ptr<std::function<void()>> work) {
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return std::nullopt;
#if defined(__GLIBC__)
  const int here = sched_getcpu();
  if (cores.known && here >= 0) {
    cpu_set_t others = cores.set;
    CPU_CLR(here, &others);
    if (CPU_COUNT(&others) > 0) pthread_attr_setaffinity_np(&attr, sizeof others, &others);
  }
#endif
  auto run = [](void* p) -> void* {
    std::unique_ptr<std::function<void()>> w(static_cast<std::function<void()>*>(p));
    (*w)();
    return nullptr;
  };
  pthread_t t;
  std::function<void()>* arg = work.release();
  const int rc = pthread_create(&t, &attr, run, arg);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    delete arg;
    return std::nullopt;
  }
  return t;
}

// Warm-ups numbered as they start, and the highest released: a task of warm-up n holds its worker while
// released < n. Static, so that a task left unrun when the process ends (an input error right after the
// warm-up started) holds no memory of ours.
std::atomic<unsigned long> g_warm_ups_started{0}, g_warm_ups_released{0};
// The work share() offers to held workers (null when none), its offer's number, and how many workers
// have joined it and not yet returned. share() clears the offer, then waits for that count to be 0; a
// worker counts itself in, then reads the offer again (sequentially consistent): so either share() waits
// for it, or it sees no offer and never calls the work, which lives on share()'s caller's stack.
std::atomic<const std::function<void()>*> g_offered{nullptr};
std::atomic<unsigned long> g_offer_number{0};
std::atomic<int> g_in_offer{0};

// A held worker's part in the current offer, once per offer.
void join_offer(unsigned long& joined) {
  const std::function<void()>* work = g_offered.load();
  const unsigned long number = g_offer_number.load();
  if (!work || number == joined) return;
  joined = number;
  g_in_offer.fetch_add(1);
  if (g_offered.load() == work) (*work)();
  g_in_offer.fetch_sub(1);
}
}  // namespace

WorkerHeapWarmUp::WorkerHeapWarmUp(tbb::task_arena& arena) {
  const int slots = arena.max_concurrency();  // without starting it
  const Cores cores = process_cores();
  const int workers = std::min(slots, count(cores)) - 1;  // TBB's workers that can take one
  if (workers <= 0) return;
  id_ = g_warm_ups_started.fetch_add(1) + 1;
  // Inputs that take longer to read than this make a wake-up's delay small beside them.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  auto held = [id = id_, until] {
    return g_warm_ups_released.load(std::memory_order_acquire) < id && std::chrono::steady_clock::now() < until;
  };
  auto start = std::make_unique<std::function<void()>>([&arena, workers, held, cores] {
    run_anywhere(cores);  // (it runs on another core by now; the threads it makes are placed freely)
    // TBB's start (about 0.8 ms on a VM, much of it loading its libraries) and its workers.
    for (int i = 0; i < workers; ++i)
      arena.enqueue([held] {
        tune_thread_heap();
        unsigned long joined = 0;
        while (held()) {
          join_offer(joined);
          std::this_thread::yield();
        }
      });
    // Then a hand in the reading, which by now has mostly begun; this thread ends with it (or at the
    // release, or the hold's end, where none is offered), and a worker takes its core.
    unsigned long joined = 0;
    while (joined == 0 && held()) {
      join_offer(joined);
      if (joined == 0) std::this_thread::yield();
    }
  });
  starter_ = start_on_another_core(cores, std::move(start));
}

void WorkerHeapWarmUp::share(const std::function<void()>& work) {
  g_offer_number.fetch_add(1);
  g_offered.store(&work);
  work();
  g_offered.store(nullptr);
  while (g_in_offer.load() != 0) std::this_thread::yield();
}

void WorkerHeapWarmUp::release() {
  for (unsigned long r = g_warm_ups_released.load(); r < id_ && !g_warm_ups_released.compare_exchange_weak(r, id_);) {
  }
}

WorkerHeapWarmUp::~WorkerHeapWarmUp() {
  release();
  if (starter_) pthread_join(*starter_, nullptr);
}

EarlyWorkers::EarlyWorkers(int threads_asked) : EarlyWorkers(threads_asked, count(process_cores())) {}

EarlyWorkers::EarlyWorkers(int threads_asked, int cores)
    : threads(threads_asked),
      more_threads_than_cores(allow_threads_beyond_cores(threads_asked, cores)),
      arena(threads_asked > 0 ? threads_asked : cores),
      warm_up(arena) {}

namespace {
std::atomic<EarlyWorkers*> g_early_workers{nullptr};

// The value of a flag's last occurrence in argv ("--flag V" or "--flag=V"), or "" where absent.
std::string_view last_flag_value(int argc, char** argv, std::initializer_list<std::string_view> names) {
  std::string_view value;
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;  // positional arguments follow
    for (std::string_view name : names) {
      if (arg == name && i + 1 < argc) value = argv[i + 1];
      else if (arg.size() > name.size() && arg.substr(0, name.size()) == name && arg[name.size()] == '=')
        value = arg.substr(name.size() + 1);
    }
  }
  return value;
}
}  // namespace

EarlyWorkers::~EarlyWorkers() {
  EarlyWorkers* self = this;
  g_early_workers.compare_exchange_strong(self, nullptr);
}

std::unique_ptr<EarlyWorkers> start_early_workers(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "search") != 0) return nullptr;
  if (last_flag_value(argc, argv, {"--cost-model", "--cost_model"}) == "metis") return nullptr;
  const std::string_view t = last_flag_value(argc, argv, {"--threads"});
  int threads = 0;
  if (!t.empty() && t.size() <= 4 && t.find_first_not_of("0123456789") == std::string_view::npos) {
    threads = std::atoi(std::string(t).c_str());
    if (threads > 4096) threads = 0;
  }
  auto early = std::make_unique<EarlyWorkers>(threads);
  g_early_workers.store(early.get());
  return early;
}

EarlyWorkers* take_early_workers() { return g_early_workers.exchange(nullptr); }

}  // namespace hetplan::cli
