// PathCounts: two chains of dependencies of the pipeline timeline through one
// stage, as counts of that stage's forwards, backwards and gradient
// accumulations; the search's lower bounds are built from them. Pure
// functions; thread-safe. REQUIRES: m >= 1 micro-batches, after >= 0 stages
// after the stage.
//
// (Self-contained until sim/schedule.h, which will hold the schedule's counts,
// takes them over.)
#pragma once

#include <algorithm>

#include "sim/memory_model.h"

namespace hetplan {

// For a stage with `after` stages after it, each path its ops in stage order and the sends between
// stages, and which micro-batch's round trip through the stages after it the path takes:
//  * end: micro-batch 0 arrives, the stage runs its ops up to micro-batch m - 1's forward (under 1F1B:
//    its m forwards and the backwards its warm-up leaves before it), that forward crosses the stages
//    after it and its backward comes back (a round trip with accumulation), and the stage runs m - 1's
//    backward;
//  * start: micro-batch 0 arrives, the stage runs its forward, it crosses the stages after and comes
//    back (no accumulation: micro-batch 0), and the stage runs every op from micro-batch 0's backward
//    on: all m backwards and the forwards its warm-up left after it (under GPipe the round trip can
//    only start after the stage's last forward, since every later stage also runs all its forwards
//    first: all m).
struct PathCounts {
  int forwards = 0, backwards = 0, accumulations = 0;
};

inline PathCounts end_path(Schedule schedule, int after, int m) {
  if (schedule == Schedule::kGpipe) return {m, 1, m > 1 ? 1 : 0};
  const int nb = std::max(0, m - 1 - std::min(after, m));  // backwards before m - 1's forward
  return {m, nb + 1, nb >= 1 ? nb : (m > 1 ? 1 : 0)};
}

inline PathCounts start_path(Schedule schedule, int after, int m) {
  if (schedule == Schedule::kGpipe) return {m, m, m - 1};
  const int warmup = std::min(after, m);
  return {1 + m - std::min(warmup + 1, m), m, m - 1};
}

}  // namespace hetplan
