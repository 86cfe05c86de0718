// Schedule: the one home of the pipeline schedule. It promises, for each
// schedule, the order in which every stage runs the forwards and backwards
// of its micro-batches (StageOps), the counts derived from that order
// (warm-up forwards, micro-batches in flight) and the op counts along the
// two dependency chains the search's lower bounds follow. The timeline
// (sim/timeline.h), the fast cost (sim/plan_cost.h), the memory model and
// the executor's runtime all take the order from here.
//
//   GPipe: every forward (micro-batches 0..m-1), then every backward.
//   1F1B (Narayanan et al. 2021, Sec. 2.2.1): pp - stage - 1 warm-up
//   forwards (at most m), then pairs of one forward and one backward, then
//   the backwards the warm-up left (cool-down).
// GPipe is the 1F1B order with a warm-up of all m forwards, so one order
// serves both. An op names its model chunk so that an interleaved schedule
// (virtual stages) is one more case here later; every chunk is 0 today.
//
// REQUIRES (everywhere): pp >= 1, 0 <= stage < pp, microbatches >= 1.
// Everything here is a pure function of its arguments: thread-safe, no
// allocation, nothing stored.
#pragma once

#include <algorithm>
#include <string>

namespace hetplan {

enum class Schedule { kGpipe, k1F1B };

const char* to_string(Schedule s);
// "gpipe" / "GPipe" or "1f1b" / "1F1B"; anything else is an InputError naming `where`.
Schedule parse_schedule(const std::string& s, const std::string& where);

// One compute op of a stage: the forward or the backward of one micro-batch on one model chunk.
struct PipelineOp {
  int micro_batch = 0;
  int chunk = 0;  // virtual stage of the stage's model (always 0: no interleaving yet)
  bool forward = true;
};

// Forwards a stage runs before its first backward, beyond the one right before it under 1F1B:
// GPipe m, 1F1B min(pp - stage - 1, m).
inline int warmup_forwards(Schedule schedule, int pp, int stage, int microbatches) {
  return schedule == Schedule::kGpipe ? microbatches : std::min(pp - stage - 1, microbatches);
}

// Micro-batches whose activations stage `stage` of `pp` holds at its peak (forwarded, not yet
// backwarded): GPipe m, 1F1B min(pp - stage, m) (at least 1).
inline int in_flight_microbatches(Schedule schedule, int pp, int stage, int microbatches) {
  if (schedule == Schedule::kGpipe) return microbatches;
  return std::max(1, std::min(pp - stage, microbatches));
}

// The op order of one stage: ops [0, size()), op(q) in O(1). A value; iterate it or index it.
class StageOps {
 public:
  StageOps(Schedule schedule, int pp, int stage, int microbatches)
      : m_(microbatches), warmup_(warmup_forwards(schedule, pp, stage, microbatches)) {}

  int size() const { return 2 * m_; }
  int warmup() const { return warmup_; }

  // The q-th op, 0 <= q < size(): warm-up forwards, then forward/backward pairs, then the cool-down.
  PipelineOp operator[](int q) const {
    if (q < warmup_) return {q, 0, true};
    if (q < warmup_ + 2 * (m_ - warmup_)) {
      const int r = q - warmup_;
      const bool forward = (r % 2) == 0;
      return {forward ? warmup_ + r / 2 : r / 2, 0, forward};
    }
    return {q - m_, 0, false};
  }

  class iterator {
   public:
    iterator(const StageOps* ops, int q) : ops_(ops), q_(q) {}
    PipelineOp operator*() const { return (*ops_)[q_]; }
    iterator& operator++() {
      ++q_;
      return *this;
    }
    bool operator!=(const iterator& o) const { return q_ != o.q_; }

   private:
    const StageOps* ops_;
    int q_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size()}; }

 private:
  int m_;
  int warmup_;
};

// Ops of one stage j along a chain of the timeline's dependencies (j's ops in stage order, the sends
// between stages), as counts of j's forwards, backwards and accumulations (backwards of a micro-batch
// after the first, which add into the gradients). The search's lower bounds add to them the round trip
// of one micro-batch through the `after` stages after j. Two chains:
//  * end: micro-batch 0 arrives, j runs its ops up to micro-batch m - 1's forward (under 1F1B: its m
//    forwards and the backwards its warm-up leaves before it), that forward crosses the stages after it
//    and its backward comes back (a round trip with accumulation), and j runs m - 1's backward;
//  * start: j runs the forwards the last stage runs before its first backward (1F1B: micro-batch 0's;
//    GPipe: all m, every later stage running all its forwards first), micro-batch 0 crosses the stages
//    after and comes back (no accumulation), and j runs every op from micro-batch 0's backward on: all
//    m backwards and the forwards its warm-up left after it.
// REQUIRES: after >= 0, m >= 1.
struct PathOpCounts {
  int forwards = 0, backwards = 0, accumulations = 0;
};

inline PathOpCounts end_path_counts(Schedule schedule, int after, int m) {
  const int warmup = warmup_forwards(schedule, after + 1, 0, m);
  const int nb = std::max(0, m - 1 - warmup);  // backwards before m - 1's forward
  return {m, nb + 1, nb >= 1 ? nb : (m > 1 ? 1 : 0)};
}

inline PathOpCounts start_path_counts(Schedule schedule, int after, int m) {
  const int last_forwards = std::min(warmup_forwards(schedule, 1, 0, m) + 1, m);
  const int forwards_after = m - std::min(warmup_forwards(schedule, after + 1, 0, m) + 1, m);
  return {last_forwards + forwards_after, m, m - 1};
}

}  // namespace hetplan
