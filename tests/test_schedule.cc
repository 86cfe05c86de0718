// The pipeline schedule (sim/schedule.h): each stage's op order, the counts
// derived from it, and the op counts along the chains the search's bounds
// follow, pinned against independent derivations from the op order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "base/input_error.h"
#include "sim/schedule.h"

using namespace hetplan;

namespace {

// The op order written out as the papers describe it: +(j + 1) the forward of micro-batch j, -(j + 1)
// its backward. GPipe (Huang et al. 2019): all forwards, then all backwards. 1F1B (Narayanan et al.
// 2021, Sec. 2.2.1): pp - stage - 1 warm-up forwards, one forward one backward, then the cool-down.
std::vector<int> reference_order(Schedule schedule, int pp, int stage, int m) {
  std::vector<int> order;
  if (schedule == Schedule::kGpipe) {
    for (int j = 0; j < m; ++j) order.push_back(j + 1);
    for (int j = 0; j < m; ++j) order.push_back(-(j + 1));
    return order;
  }
  const int warmup = std::min(pp - stage - 1, m);
  for (int j = 0; j < warmup; ++j) order.push_back(j + 1);
  for (int k = 0; k < m - warmup; ++k) {
    order.push_back(warmup + k + 1);
    order.push_back(-(k + 1));
  }
  for (int j = m - warmup; j < m; ++j) order.push_back(-(j + 1));
  return order;
}

std::vector<int> encoded(const StageOps& ops) {
  std::vector<int> order;
  for (const PipelineOp op : ops) {
    CHECK(op.chunk == 0);
    order.push_back(op.forward ? op.micro_batch + 1 : -(op.micro_batch + 1));
  }
  return order;
}

void add_backward(PathOpCounts* c, int micro_batch) {
  ++c->backwards;
  if (micro_batch > 0) ++c->accumulations;  // every backward but the first adds into the gradients
}

// The end chain from stage 0 of after + 1 stages' op order: its ops up to micro-batch m - 1's forward,
// then (after the round trip) m - 1's backward.
PathOpCounts end_chain(Schedule schedule, int after, int m) {
  PathOpCounts c;
  for (const PipelineOp op : StageOps(schedule, after + 1, 0, m)) {
    if (op.forward) ++c.forwards;
    else add_backward(&c, op.micro_batch);
    if (op.forward && op.micro_batch == m - 1) break;
  }
  add_backward(&c, m - 1);
  return c;
}

// The start chain: the forwards the last stage runs before its first backward (each crossed down to it),
// then (after micro-batch 0's round trip) every op of stage 0 from micro-batch 0's backward on.
PathOpCounts start_chain(Schedule schedule, int after, int m) {
  PathOpCounts c;
  for (const PipelineOp op : StageOps(schedule, after + 1, after, m)) {
    if (!op.forward) break;
    ++c.forwards;
  }
  bool from_first_backward = false;
  for (const PipelineOp op : StageOps(schedule, after + 1, 0, m)) {
    from_first_backward = from_first_backward || !op.forward;
    if (!from_first_backward) continue;
    if (op.forward) ++c.forwards;
    else add_backward(&c, op.micro_batch);
  }
  return c;
}

// planner/plan_search.cc's formulas, as the search's bounds used them before sim/schedule.h.
PathOpCounts planner_end_path(Schedule schedule, int after, int m) {
  if (schedule == Schedule::kGpipe) return {m, 1, m > 1 ? 1 : 0};
  const int nb = std::max(0, m - 1 - std::min(after, m));
  return {m, nb + 1, nb >= 1 ? nb : (m > 1 ? 1 : 0)};
}
PathOpCounts planner_start_path(Schedule schedule, int after, int m) {
  if (schedule == Schedule::kGpipe) return {m, m, m - 1};
  const int warmup = std::min(after, m);
  return {1 + m - std::min(warmup + 1, m), m, m - 1};
}

void check_equal(const PathOpCounts& a, const PathOpCounts& b) {
  CHECK(a.forwards == b.forwards);
  CHECK(a.backwards == b.backwards);
  CHECK(a.accumulations == b.accumulations);
}

}  // namespace

TEST_CASE("StageOps gives each stage the GPipe and 1F1B op order", "[schedule]") {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B})
    for (int pp = 1; pp <= 6; ++pp)
      for (int stage = 0; stage < pp; ++stage)
        for (int m = 1; m <= 9; ++m) {
          INFO(to_string(s) << " pp " << pp << " stage " << stage << " m " << m);
          const StageOps ops(s, pp, stage, m);
          CHECK(ops.size() == 2 * m);
          CHECK(encoded(ops) == reference_order(s, pp, stage, m));
          CHECK(ops.warmup() == warmup_forwards(s, pp, stage, m));
          const std::vector<int> order = encoded(ops);
          for (int q = 0; q < ops.size(); ++q)  // indexing agrees with iterating
            CHECK((ops[q].forward ? ops[q].micro_batch + 1 : -(ops[q].micro_batch + 1)) == order[q]);
        }
}

TEST_CASE("in-flight micro-batches are the op order's peak of forwarded, not yet backwarded", "[schedule]") {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B})
    for (int pp = 1; pp <= 6; ++pp)
      for (int stage = 0; stage < pp; ++stage)
        for (int m = 1; m <= 9; ++m) {
          int held = 0, peak = 0;
          for (const PipelineOp op : StageOps(s, pp, stage, m)) {
            held += op.forward ? 1 : -1;
            peak = std::max(peak, held);
          }
          INFO(to_string(s) << " pp " << pp << " stage " << stage << " m " << m);
          CHECK(held == 0);
          CHECK(peak == in_flight_microbatches(s, pp, stage, m));
        }
  CHECK(in_flight_microbatches(Schedule::k1F1B, 4, 0, 8) == 4);
  CHECK(in_flight_microbatches(Schedule::kGpipe, 4, 3, 8) == 8);
}

TEST_CASE("the bounds' path counts equal the chains of the op order and the search's formulas", "[schedule]") {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B})
    for (int after = 0; after <= 7; ++after)
      for (int m = 1; m <= 10; ++m) {
        INFO(to_string(s) << " after " << after << " m " << m);
        check_equal(end_path_counts(s, after, m), end_chain(s, after, m));
        check_equal(start_path_counts(s, after, m), start_chain(s, after, m));
        check_equal(end_path_counts(s, after, m), planner_end_path(s, after, m));
        check_equal(start_path_counts(s, after, m), planner_start_path(s, after, m));
      }
}

TEST_CASE("schedules parse and print", "[schedule]") {
  CHECK(parse_schedule("gpipe", "x") == Schedule::kGpipe);
  CHECK(parse_schedule("GPipe", "x") == Schedule::kGpipe);
  CHECK(parse_schedule("1F1B", "x") == Schedule::k1F1B);
  CHECK(std::string(to_string(Schedule::k1F1B)) == "1f1b");
  CHECK_THROWS_AS(parse_schedule("interleaved", "--schedule"), InputError);
}
