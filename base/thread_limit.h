// allow_threads_beyond_cores: lets an arena of more slots than the process has
// cores run a thread in each. TBB keeps to one worker per other core unless its
// global limit is raised, and prints a warning when an arena asks for more; the
// returned control raises the limit to `threads` while it lives (nothing where
// `threads` is not above `cores`).
// REQUIRES: the returned object outlives the arena it is made for (declare it
// before the arena); `cores` is the process's core count (TBB's default
// concurrency).
#pragma once

#include <tbb/global_control.h>

#include <cstddef>
#include <optional>

namespace hetplan {

inline std::optional<tbb::global_control> allow_threads_beyond_cores(int threads, int cores) {
  if (threads <= cores) return std::nullopt;
  return std::optional<tbb::global_control>(std::in_place, tbb::global_control::max_allowed_parallelism,
                                            static_cast<std::size_t>(threads));
}

}  // namespace hetplan
