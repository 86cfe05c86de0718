// cli/heap: a worker thread's malloc arena is madvised for huge pages past its first 2 MB.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "cli/heap.h"

namespace {

// The VmFlags of the mapping that holds `addr` (/proc/self/smaps), or "" if none.
std::string vm_flags_of(std::uintptr_t addr) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const auto dash = line.find('-'), space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const std::uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = lo <= addr && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

}  // namespace

TEST_CASE("a thread's malloc arena asks for huge pages, and its blocks start on a huge page", "[heap]") {
  if (const std::string why = hetplan::cli::thread_heap_unsupported(); !why.empty()) {
    std::cout << "HETPLAN_SKIP: " << why << std::endl;
    return;
  }
  hetplan::cli::tune_heap();  // as main() does first
  bool tuned = false, again = false;
  std::uintptr_t block = 0;
  std::string flags;
  std::thread worker([&] {
    tuned = hetplan::cli::tune_thread_heap();
    again = hetplan::cli::tune_thread_heap();  // once per thread: the second call only reports
    void* q = std::malloc(4 << 20);
    block = reinterpret_cast<std::uintptr_t>(q);
    flags = vm_flags_of(block);
    std::free(q);
  });
  worker.join();
  REQUIRE(tuned);
  CHECK(again);
  INFO("block " << std::hex << block << ", VmFlags" << flags);
  CHECK(flags.find(" hg ") != std::string::npos);  // VM_HUGEPAGE: madvise(MADV_HUGEPAGE)
  CHECK(block % (std::uintptr_t{2} << 20) == 0);  // the kept block ends where a huge page begins
}
