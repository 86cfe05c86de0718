// The pipeline schedule (sim/schedule.h): each stage's op order, the counts
// derived from it, and the op counts along the chains the search's bounds
// follow, pinned against independent derivations from the op order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "base/input_error.h"
#include "sim/schedule.h"
#include "sim/timeline.h"

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

TEST_CASE("one_chunk_backwards is for_each_backward's visits on a stage of one chunk", "[schedule]") {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved1F1B})
    for (int pp = 1; pp <= 6; ++pp)
      for (int stage = 0; stage < pp; ++stage)
        for (int m = 1; m <= 9; ++m) {
          INFO(to_string(s) << " pp " << pp << " stage " << stage << " m " << m);
          const OneChunkBackwards b = one_chunk_backwards(s, pp, stage, m);
          CHECK(b.warmup + b.steady == m);
          int k = 0;
          for_each_backward(s, pp, stage, m, 1, [&](int chunk, const int* live, const int* done) {
            CHECK(chunk == 0);
            if (k < b.steady) {
              CHECK(live[0] == b.warmup + 1);
              CHECK(done[0] == k);
            } else {
              CHECK(live[0] == b.warmup - (k - b.steady));
              CHECK(done[0] == k);
            }
            ++k;
          });
          CHECK(k == m);
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

namespace {

// A multi-trip chain read off the op order: stage 0 of after + 1 stages runs its ops in order from the
// first; at each micro-batch of `trips` (increasing) the chain leaves after that micro-batch's forward and
// comes back at its backward (a round trip), skipping the ops in between; then the ops after the last
// trip's backward. Counts of its ops on the chain and the round trips. REQUIRE: each trip's forward comes
// after the previous trip's backward in the order (the chain exists).
MultiTripCounts multi_trip_chain(Schedule schedule, int after, int m, const std::vector<int>& trips) {
  const StageOps ops(schedule, after + 1, 0, m);
  auto position = [&](int i, bool forward) {
    int q = 0;
    while (ops[q].forward != forward || ops[q].micro_batch != i) ++q;
    return q;
  };
  MultiTripCounts c;
  auto count = [&](int q) {
    if (ops[q].forward) {
      ++c.forwards;
    } else {
      ++c.backwards;
      c.accumulations += ops[q].micro_batch > 0;
    }
  };
  int q = 0;  // the chain's next op on stage 0
  for (const int i : trips) {
    const int fq = position(i, true), bq = position(i, false);
    REQUIRE(fq >= q);
    for (; q <= fq; ++q) count(q);
    ++c.trips;
    count(bq);
    q = bq + 1;
  }
  for (; q < ops.size(); ++q) count(q);
  return c;
}

// The trips multi_trip_counts counts for h trips: 0 alone (h = 1), else 0, w + 1, ..., (h - 2)(w + 1), m - 1.
std::vector<int> counted_trips(int after, int m, int h) {
  const int w = warmup_forwards(Schedule::k1F1B, after + 1, 0, m);
  std::vector<int> trips{0};
  if (h == 1) return trips;
  for (int k = 1; k <= h - 2; ++k) trips.push_back(k * (w + 1));
  trips.push_back(m - 1);
  return trips;
}

// The greedy trips (the chain before both ends were used): 0, w + 1, 2 (w + 1), ... while they exist.
std::vector<int> greedy_trips(int after, int m) {
  const int w = warmup_forwards(Schedule::k1F1B, after + 1, 0, m);
  std::vector<int> trips;
  for (int i = 0; i < m; i += w + 1) trips.push_back(i);
  return trips;
}

}  // namespace

TEST_CASE("the multi-trip chains' counts are the 1F1B op order's, and the timeline is never shorter", "[schedule]") {
  for (int after = 1; after <= 7; ++after)
    for (int m = 1; m <= 12; ++m) {
      const int most = most_trips(Schedule::k1F1B, after, m);
      REQUIRE(most >= 1);
      REQUIRE(static_cast<int>(greedy_trips(after, m).size()) == most);  // the most trips that fit
      for (int h = 1; h <= most + 1; ++h) {
        INFO("after " << after << " m " << m << " h " << h);
        const MultiTripCounts a = multi_trip_counts(Schedule::k1F1B, after, m, h),
                              b = multi_trip_chain(Schedule::k1F1B, after, m, counted_trips(after, m, std::min(h, most)));
        CHECK(a.forwards == b.forwards);
        CHECK(a.backwards == b.backwards);
        CHECK(a.accumulations == b.accumulations);
        CHECK(a.trips == b.trips);
      }
      // Both ends' trips count every backward the greedy trips count, and never fewer forwards.
      const MultiTripCounts most_c = multi_trip_counts(Schedule::k1F1B, after, m),
                            greedy = multi_trip_chain(Schedule::k1F1B, after, m, greedy_trips(after, m));
      CHECK(most_c.trips == most);
      CHECK(most_c.backwards == greedy.backwards);
      CHECK(most_c.forwards >= greedy.forwards);
      CHECK(multi_trip_counts(Schedule::kGpipe, after, m).trips == 0);
    }
  CHECK(multi_trip_counts(Schedule::k1F1B, 6, 8).trips == 2);  // 7 stages, 8 micro-batches: 0 and 7
  // 4 stages after, 8 micro-batches (w = 3): trips 0 and 7 run F0, F4..F7 and B0..B3, B7 (the greedy
  // trips 0 and 4 ran F0, F4 only).
  CHECK(multi_trip_counts(Schedule::k1F1B, 3, 8).forwards == 5);
  CHECK(multi_trip_counts(Schedule::k1F1B, 0, 8).trips == 0);  // no stage after: no round trip
  // The chains through stage 0 are paths of the timeline's task graph: on uneven stages the iteration is
  // at least their length (the round trips at their fewest ops: every later stage's forward and backward,
  // the sends both ways, accumulation after micro-batch 0).
  unsigned seed = 12345;
  auto next = [&] {
    seed = seed * 1103515245u + 12345u;
    return 0.1 + (seed >> 8) % 1000 / 100.0;
  };
  int tighter = 0, both_ends_tighter = 0, pair_tighter = 0;
  double closest = 0;  // the largest ratio of the longest chain counted to the iteration
  for (int p = 2; p <= 7; ++p)
    for (int m = 1; m <= 12; ++m)
      for (int trial = 0; trial < 3; ++trial) {
        TimelineInput in;
        in.microbatches = m;
        in.schedule = Schedule::k1F1B;
        for (int j = 0; j < p; ++j) {
          StageCosts c;
          c.forward_ms = next();
          c.backward_ms = 2 * next();
          c.accumulation_ms = next() / 4;
          c.send_forward_ms = j + 1 < p ? next() / 8 : 0;
          c.send_backward_ms = j > 0 ? next() / 8 : 0;
          in.stages.push_back(c);
        }
        const double iteration = simulate_timeline(in).iteration_ms;
        double trip0 = 0;  // micro-batch 0's round trip from stage 0's send to its arrival back
        for (int j = 1; j < p; ++j)
          trip0 += in.stages[j].forward_ms + in.stages[j].backward_ms + in.stages[j].send_backward_ms +
                   (j + 1 < p ? in.stages[j].send_forward_ms : 0.0);
        double trip = trip0;  // a later micro-batch's: with accumulation
        for (int j = 1; j < p; ++j) trip += in.stages[j].accumulation_ms;
        const StageCosts& s0 = in.stages[0];
        auto length = [&](const MultiTripCounts& h) {
          return h.forwards * s0.forward_ms + h.backwards * s0.backward_ms + h.accumulations * s0.accumulation_ms +
                 h.trips * s0.send_forward_ms + trip0 + (h.trips - 1) * trip;
        };
        const int most = most_trips(Schedule::k1F1B, p - 1, m);
        const double greedy = length(multi_trip_chain(Schedule::k1F1B, p - 1, m, greedy_trips(p - 1, m)));
        double longest = 0;
        for (int h = 1; h <= most; ++h) {
          const double chain = length(multi_trip_counts(Schedule::k1F1B, p - 1, m, h));
          INFO("p " << p << " m " << m << " trial " << trial << " h " << h);
          CHECK(chain <= iteration * (1 + 1e-12));
          if (h >= 2 || most == 1) longest = std::max(longest, chain);
        }
        // The longest over h >= 2 is at h = 2 or h = most (the length is affine in h there; h = 1 is the
        // start path's chain, which the bounds count apart).
        const double ends = std::max(length(multi_trip_counts(Schedule::k1F1B, p - 1, m, 2)),
                                     length(multi_trip_counts(Schedule::k1F1B, p - 1, m)));
        CHECK(ends == Approx(longest).epsilon(1e-12));
        closest = std::max(closest, ends / iteration);
        // Where it counts more than one trip, it is more than the start path's chain (one trip).
        const double one_trip = s0.forward_ms + s0.send_forward_ms + trip0 + m * s0.backward_ms + (m - 1) * s0.accumulation_ms;
        tighter += most > 1 && ends > one_trip;
        both_ends_tighter += ends > greedy * (1 + 1e-12);
        pair_tighter += most > 2 && length(multi_trip_counts(Schedule::k1F1B, p - 1, m, 2)) >
                                        length(multi_trip_counts(Schedule::k1F1B, p - 1, m)) * (1 + 1e-12);
      }
  CHECK(tighter > 20);
  CHECK(both_ends_tighter > 20);  // the trip m - 1 instead of the greedy last one
  CHECK(pair_tighter > 0);        // h = 2 beats the most trips somewhere
  // Somewhere a chain counted is the timeline's longest path: the counts cannot grow by an op (nor the
  // chains be scaled up by more than 1e-9) without the check above failing.
  CHECK(closest >= 1 - 1e-9);
}

TEST_CASE("schedules parse and print", "[schedule]") {
  CHECK(parse_schedule("gpipe", "x") == Schedule::kGpipe);
  CHECK(parse_schedule("GPipe", "x") == Schedule::kGpipe);
  CHECK(parse_schedule("1F1B", "x") == Schedule::k1F1B);
  CHECK(std::string(to_string(Schedule::k1F1B)) == "1f1b");
  CHECK(parse_schedule("interleaved", "x") == Schedule::kInterleaved1F1B);
  CHECK(parse_schedule("interleaved-1f1b", "x") == Schedule::kInterleaved1F1B);
  CHECK(std::string(to_string(Schedule::kInterleaved1F1B)) == "interleaved");
  CHECK_THROWS_AS(parse_schedule("zero-bubble", "--schedule"), InputError);
}

namespace {

// Megatron-LM's interleaved order written out the way its schedule function builds it: the k-th
// forward of a stage takes chunk (k mod pp v) / pp and micro-batch (k / pp v) pp + k mod pp, the k-th
// backward the same micro-batch on the mirrored chunk; warm-up 2 (pp - stage - 1) + (v - 1) pp.
// Encoded as +-(1 + micro_batch + 100 chunk).
std::vector<int> megatron_interleaved(int pp, int v, int stage, int m) {
  const int total = m * v;
  const int warmup = std::min(2 * (pp - stage - 1) + (v - 1) * pp, total);
  auto code = [&](int k, bool forward) {
    int chunk = (k % (pp * v)) / pp;
    if (!forward) chunk = v - 1 - chunk;
    const int mb = (k / (pp * v)) * pp + k % pp;
    return (forward ? 1 : -1) * (1 + mb + 100 * chunk);
  };
  std::vector<int> order;
  for (int k = 0; k < warmup; ++k) order.push_back(code(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(code(warmup + k, true));
    order.push_back(code(k, false));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(code(k, false));
  return order;
}

std::vector<int> encoded_chunks(const StageOps& ops) {
  std::vector<int> order;
  for (const PipelineOp op : ops) order.push_back((op.forward ? 1 : -1) * (1 + op.micro_batch + 100 * op.chunk));
  return order;
}

}  // namespace

TEST_CASE("interleaved 1F1B: pp 2 x v 2, m 4 written out by hand", "[schedule][interleaved]") {
  // F/B(micro-batch, chunk) as +-(1 + mb + 100 chunk). Stage 0 warms up with 2 (2 - 1) + 2 = 4 forwards.
  const std::vector<int> stage0 = {1, 2, 101, 102, 3, -101, 4, -102, 103, -1, 104, -2, -103, -104, -3, -4};
  const std::vector<int> stage1 = {1, 2, 101, -101, 102, -102, 3, -1, 4, -2, 103, -103, 104, -104, -3, -4};
  CHECK(encoded_chunks(StageOps(Schedule::kInterleaved1F1B, 2, 0, 4, 2)) == stage0);
  CHECK(encoded_chunks(StageOps(Schedule::kInterleaved1F1B, 2, 1, 4, 2)) == stage1);
  CHECK(in_flight_microbatches(Schedule::kInterleaved1F1B, 2, 0, 4, 2) == 5);
  CHECK(in_flight_microbatches(Schedule::kInterleaved1F1B, 2, 1, 4, 2) == 3);
}

TEST_CASE("interleaved 1F1B is Megatron's order: every (micro-batch, chunk) once, a chunk's micro-batches in order",
          "[schedule][interleaved]") {
  for (int pp = 1; pp <= 5; ++pp)
    for (int v = 2; v <= 4; ++v)
      for (int m = pp; m <= 4 * pp; m += pp)
        for (int stage = 0; stage < pp; ++stage) {
          INFO("pp " << pp << " v " << v << " m " << m << " stage " << stage);
          REQUIRE(interleaving_error(Schedule::kInterleaved1F1B, pp, m, v).empty());
          const StageOps ops(Schedule::kInterleaved1F1B, pp, stage, m, v);
          CHECK(ops.size() == 2 * m * v);
          CHECK(ops.chunks() == v);
          CHECK(encoded_chunks(ops) == megatron_interleaved(pp, v, stage, m));
          std::vector<int> next_fwd(v, 0), next_bwd(v, 0);
          int held = 0, peak = 0;
          for (const PipelineOp op : ops) {
            REQUIRE(op.chunk >= 0);
            REQUIRE(op.chunk < v);
            if (op.forward) CHECK(op.micro_batch == next_fwd[op.chunk]++);
            else CHECK(op.micro_batch == next_bwd[op.chunk]++);
            if (!op.forward) CHECK(next_fwd[op.chunk] > op.micro_batch);  // its forward came first
            held += op.forward ? 1 : -1;
            peak = std::max(peak, held);
          }
          for (int c = 0; c < v; ++c) CHECK((next_fwd[c] == m && next_bwd[c] == m));
          CHECK(peak == in_flight_microbatches(Schedule::kInterleaved1F1B, pp, stage, m, v));
        }
}

TEST_CASE("interleaving needs v >= 2 and m a multiple of pp (Megatron's rule)", "[schedule][interleaved]") {
  CHECK(interleaving_error(Schedule::kInterleaved1F1B, 4, 8, 2).empty());
  CHECK(interleaving_error(Schedule::kInterleaved1F1B, 4, 6, 2).find("multiple of pp") != std::string::npos);
  CHECK(!interleaving_error(Schedule::kInterleaved1F1B, 4, 8, 1).empty());
  CHECK(!interleaving_error(Schedule::k1F1B, 4, 8, 2).empty());
  CHECK(interleaving_error(Schedule::k1F1B, 4, 6, 1).empty());
}

TEST_CASE("a stage's layers split into chunks laid out in virtual-stage order", "[schedule][interleaved]") {
  int a = 0, b = 0;
  // A model of 10 Metis layers (embedding, 8 blocks, head). Stage [3, 8): 5 blocks, 3 + 2.
  CHECK(stage_blocks(3, 8, 10) == 5);
  chunk_layers(3, 8, 10, 2, 0, &a, &b);
  CHECK((a == 3 && b == 6));
  chunk_layers(3, 8, 10, 2, 1, &a, &b);
  CHECK((a == 6 && b == 8));
  // The embedding rides with chunk 0, the head with the last chunk: [0, 5) is the embedding and blocks
  // 1-4 (2 + 2), [5, 10) blocks 5-8 and the head (2 + 2): Megatron's even virtual split.
  CHECK(stage_blocks(0, 5, 10) == 4);
  chunk_layers(0, 5, 10, 2, 0, &a, &b);
  CHECK((a == 0 && b == 3));
  chunk_layers(0, 5, 10, 2, 1, &a, &b);
  CHECK((a == 3 && b == 5));
  chunk_layers(5, 10, 10, 2, 0, &a, &b);
  CHECK((a == 5 && b == 7));
  chunk_layers(5, 10, 10, 2, 1, &a, &b);
  CHECK((a == 7 && b == 10));
  // Stages [0, 3) (embedding + 2 blocks) and [3, 7) (3 blocks + head) of 7 layers, v 2: virtual stages
  // 0 (stage 0: [0, 2)), 1 (stage 1: 2 layers), 2 (stage 0: 1), 3 (stage 1: block and head).
  const int partition[] = {0, 3, 7};
  chunk_model_layers(partition, 2, 2, 0, 0, &a, &b);
  CHECK((a == 0 && b == 2));
  chunk_model_layers(partition, 2, 2, 1, 0, &a, &b);
  CHECK((a == 2 && b == 4));
  chunk_model_layers(partition, 2, 2, 0, 1, &a, &b);
  CHECK((a == 4 && b == 5));
  chunk_model_layers(partition, 2, 2, 1, 1, &a, &b);
  CHECK((a == 5 && b == 7));
}

namespace {

// An op order written "F<micro-batch>.<chunk>" / "B<micro-batch>.<chunk>", space-separated.
std::vector<PipelineOp> parse_ops(const std::string& text) {
  std::vector<PipelineOp> ops;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t end = std::min(text.find(' ', i), text.size());
    const std::string op = text.substr(i, end - i);
    const std::size_t dot = op.find('.');
    ops.push_back({std::stoi(op.substr(1, dot - 1)), std::stoi(op.substr(dot + 1)), op[0] == 'F'});
    i = end + 1;
  }
  return ops;
}

// Just before each backward of `ops`: the backward's chunk, then the micro-batches live on each chunk.
std::vector<std::vector<int>> live_at_backwards(const std::vector<PipelineOp>& ops, int v) {
  std::vector<std::vector<int>> points;
  std::vector<int> live(v, 0);
  for (const PipelineOp& op : ops) {
    if (op.forward) {
      ++live[op.chunk];
      continue;
    }
    std::vector<int> p = {op.chunk};
    p.insert(p.end(), live.begin(), live.end());
    points.push_back(p);
    --live[op.chunk];
  }
  return points;
}

std::vector<std::vector<int>> walked(int pp, int stage, int m, int v) {
  std::vector<std::vector<int>> points;
  for_each_backward(Schedule::kInterleaved1F1B, pp, stage, m, v, [&](int chunk, const int* live, const int* done) {
    std::vector<int> p = {chunk};
    p.insert(p.end(), live, live + v);
    points.push_back(p);
    for (int c = 0; c < v; ++c) CHECK(live[c] + done[c] <= m);
  });
  return points;
}

}  // namespace

TEST_CASE("interleaved pp 4 x v 2: micro-batches live per rank and chunk, as replay ran them",
          "[schedule][interleaved]") {
  // The op order each rank ran in `hetplan replay` of gpt-pp4-v2-m8 on 4 x H100 (its Chrome trace,
  // logs/validate/suite34-h100x4-run1/gpt-pp4-v2-m8.replay.trace.json): the executor takes it from StageOps.
  const std::vector<std::string> replayed = {
      "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 "
      "B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
      "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 B0.1 F5.0 B1.1 F6.0 B2.1 F7.0 B3.1 F4.1 B0.0 F5.1 B1.0 F6.1 B2.0 "
      "F7.1 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
      "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 B0.1 F3.1 B1.1 F4.0 B2.1 F5.0 B3.1 F6.0 B0.0 F7.0 B1.0 F4.1 B2.0 F5.1 B3.0 "
      "F6.1 B4.1 F7.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
      "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 F4.1 B4.1 "
      "F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 B4.0 B5.0 B6.0 B7.0"};
  // Just before each of the first pp v backwards: {backward's chunk, live on chunk 0, live on chunk 1}
  // (the later ones repeat these, fewer in the cool-down). The pair count at the first backward is
  // Megatron's warm-up (pp - r - 1) 2 + (v - 1) pp, plus one: 11, 9, 7, 5.
  const std::vector<std::vector<std::vector<int>>> pinned = {
      {{1, 7, 4}, {1, 8, 3}, {1, 8, 3}, {1, 8, 3}, {0, 8, 3}, {0, 7, 4}, {0, 6, 4}, {0, 5, 4}},
      {{1, 5, 4}, {1, 6, 3}, {1, 7, 2}, {1, 8, 1}, {0, 8, 1}, {0, 7, 2}, {0, 6, 3}, {0, 5, 4}},
      {{1, 4, 3}, {1, 4, 3}, {1, 5, 2}, {1, 6, 1}, {0, 7, 0}, {0, 7, 0}, {0, 6, 1}, {0, 5, 2}},
      {{1, 4, 1}, {1, 4, 1}, {1, 4, 1}, {1, 4, 1}, {0, 5, 0}, {0, 5, 0}, {0, 5, 0}, {0, 5, 0}}};
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    const std::vector<PipelineOp> ran = parse_ops(replayed[r]);
    const StageOps ops(Schedule::kInterleaved1F1B, 4, r, 8, 2);
    REQUIRE(static_cast<int>(ran.size()) == ops.size());
    for (int q = 0; q < ops.size(); ++q) {
      CHECK(ops[q].forward == ran[q].forward);
      CHECK(ops[q].micro_batch == ran[q].micro_batch);
      CHECK(ops[q].chunk == ran[q].chunk);
    }
    const auto points = walked(4, r, 8, 2);
    CHECK(points == live_at_backwards(ran, 2));
    CHECK(std::vector<std::vector<int>>(points.begin(), points.begin() + 8) == pinned[r]);
    CHECK(points[0][1] + points[0][2] == 2 * (4 - r - 1) + 4 + 1);
  }
  // The middle ranks hold 8 and 7 micro-batches of chunk 0 at once, not the (pairs) / v = 4.5 and 3.5 of
  // each chunk a uniform split assumes; the last rank never more than one of chunk 1 (the head's).
}

TEST_CASE("interleaved pp 2 x v 2: micro-batches live per rank and chunk", "[schedule][interleaved]") {
  // Stage 0's and 1's orders are written out by hand above ("pp 2 x v 2, m 4").
  CHECK(walked(2, 0, 4, 2) == std::vector<std::vector<int>>{{1, 3, 2}, {1, 4, 1}, {0, 4, 1}, {0, 3, 2},
                                                               {1, 2, 2}, {1, 2, 1}, {0, 2, 0}, {0, 1, 0}});
  CHECK(walked(2, 1, 4, 2) == std::vector<std::vector<int>>{{1, 2, 1}, {1, 2, 1}, {0, 3, 0}, {0, 3, 0},
                                                               {1, 2, 1}, {1, 2, 1}, {0, 2, 0}, {0, 1, 0}});
  for (int r = 0; r < 2; ++r) {
    std::vector<PipelineOp> ops;
    for (const PipelineOp op : StageOps(Schedule::kInterleaved1F1B, 2, r, 4, 2)) ops.push_back(op);
    CHECK(walked(2, r, 4, 2) == live_at_backwards(ops, 2));
  }
}
