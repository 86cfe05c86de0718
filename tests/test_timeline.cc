// StageTimeline: the task-graph schedule against pipeline theory.
// Closed forms: Huang et al. 2019 (GPipe), Sec. 2.3, bubble (K - 1) / (M + K - 1);
// Narayanan et al. 2021 (Megatron-LM, SC21), Sec. 2.2.1: 1F1B has the same
// bubble as GPipe, iteration (m + p - 1)(tf + tb), but at most p micro-batches
// in flight instead of m.
#include <catch2/catch.hpp>

#include "base/input_error.h"
#include "sim/timeline.h"

using namespace hetplan;

namespace {

TimelineInput homogeneous(int p, int m, double tf, double tb, Schedule s) {
  TimelineInput in;
  in.microbatches = m;
  in.schedule = s;
  for (int i = 0; i < p; ++i) {
    StageCosts c;
    c.forward_ms = tf;
    c.backward_ms = tb;
    in.stages.push_back(c);
  }
  return in;
}

}  // namespace

TEST_CASE("1F1B and GPipe makespans equal the closed form without communication", "[timeline]") {
  for (int p : {1, 2, 4, 7})
    for (int m : {1, 3, 8, 16}) {
      const double tf = 1.3, tb = 2.7;
      for (Schedule s : {Schedule::k1F1B, Schedule::kGpipe}) {
        const TimelineResult r = simulate_timeline(homogeneous(p, m, tf, tb, s));
        INFO("p " << p << " m " << m << " " << to_string(s));
        CHECK(std::abs(r.iteration_ms - (m + p - 1) * (tf + tb)) < 1e-9);
        CHECK(std::abs(r.bubble_fraction - double(p - 1) / (m + p - 1)) < 1e-12);
      }
    }
}

TEST_CASE("1F1B holds p - stage micro-batches, GPipe all m", "[timeline]") {
  const int p = 4, m = 8;
  const TimelineResult a = simulate_timeline(homogeneous(p, m, 1, 2, Schedule::k1F1B));
  const TimelineResult g = simulate_timeline(homogeneous(p, m, 1, 2, Schedule::kGpipe));
  for (int i = 0; i < p; ++i) {
    CHECK(a.peak_in_flight[i] == p - i);
    CHECK(g.peak_in_flight[i] == m);
    CHECK(a.peak_in_flight[i] == in_flight_microbatches(Schedule::k1F1B, p, i, m));
  }
  CHECK(a.bubble_fraction == Approx(g.bubble_fraction));
}

TEST_CASE("all-reduce and optimizer follow the last backward", "[timeline]") {
  TimelineInput in = homogeneous(4, 8, 1, 2, Schedule::k1F1B);
  for (auto& c : in.stages) {
    c.allreduce_ms = 5;
    c.optimizer_ms = 0.5;
  }
  const TimelineResult r = simulate_timeline(in);
  // Stage 0 finishes its backwards last (at (m + p - 1)(tf + tb)); its all-reduce and step follow.
  CHECK(r.iteration_ms == Approx(11 * 3 + 5 + 0.5).epsilon(1e-12));
  CHECK(r.busy_ms[0] == Approx(8 * 3 + 0.5));
}

TEST_CASE("gradient accumulation lengthens every backward but the first", "[timeline]") {
  for (Schedule s : {Schedule::k1F1B, Schedule::kGpipe}) {
    // One stage: m (tf + tb) + (m - 1) accumulations.
    TimelineInput one = homogeneous(1, 8, 1, 2, s);
    one.stages[0].accumulation_ms = 0.25;
    CHECK(simulate_timeline(one).iteration_ms == Approx(8 * 3 + 7 * 0.25).epsilon(1e-12));
    // p stages under 1F1B: the last stage starts after (p - 1) forwards, runs
    // m (tf + tb) + (m - 1) acc, and the last micro-batch's backward (which
    // accumulates) crosses p - 1 stages back: (m + p - 1)(tf + tb) + (m + p - 2) acc.
    TimelineInput in = homogeneous(4, 8, 1, 2, s);
    for (auto& c : in.stages) c.accumulation_ms = 0.25;
    const TimelineResult r = simulate_timeline(in);
    if (s == Schedule::k1F1B) CHECK(r.iteration_ms == Approx(11 * 3 + 10 * 0.25).epsilon(1e-12));
    CHECK(r.busy_ms[0] == Approx(8 * 3 + 7 * 0.25).epsilon(1e-12));
  }
}

TEST_CASE("heterogeneous stages: the slowest stage sets the pace", "[timeline]") {
  // Two stages, stage 1 twice as slow: (m - 1) max_i (tf + tb) + sum_i (tf + tb), Metis's execution term.
  TimelineInput in = homogeneous(2, 8, 1, 2, Schedule::k1F1B);
  in.stages[1].forward_ms = 2;
  in.stages[1].backward_ms = 4;
  const TimelineResult r = simulate_timeline(in);
  CHECK(r.iteration_ms == Approx(7 * 6 + (3 + 6)).epsilon(1e-12));
}

TEST_CASE("p2p transfers sit between stages and add to the critical path", "[timeline]") {
  TimelineInput in = homogeneous(4, 8, 1, 2, Schedule::kGpipe);
  for (auto& c : in.stages) c.send_forward_ms = c.send_backward_ms = 0.25;
  const TimelineResult r = simulate_timeline(in);
  // GPipe: the first micro-batch crosses 3 links forward and 3 backward; nothing else waits on a link.
  CHECK(r.iteration_ms == Approx(11 * 3 + 6 * 0.25).epsilon(1e-12));
  int sends = 0, recvs = 0;
  for (const Span& s : r.spans) {
    sends += s.name == "send";
    recvs += s.name == "recv";
  }
  CHECK(sends == 2 * 3 * 8);
  CHECK(recvs == sends);
}

TEST_CASE("tokens/s, MFU and the Chrome trace", "[timeline]") {
  TimelineInput in = homogeneous(2, 4, 10, 20, Schedule::k1F1B);
  for (auto& c : in.stages) c.peak_flops = 1e15;
  in.tokens = 4 * 2048;
  in.model_flops = 1e14;
  const TimelineResult r = simulate_timeline(in);
  CHECK(r.iteration_ms == Approx(5 * 30));
  CHECK(r.tokens_per_s == Approx(8192 / 0.150));
  CHECK(r.mfu == Approx(1e14 / 0.150 / 2e15));
  const ordered_json t = chrome_trace(r, in.stages);
  int forward = 0, backward = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    forward += e["name"] == "forward";
    backward += e["name"] == "backward";
    CHECK(e["dur"].get<double>() >= 0);
  }
  CHECK(forward == 8);
  CHECK(backward == 8);
  CHECK_THROWS_AS(parse_schedule("zb", "--schedule"), InputError);
}

namespace {

// pp stages of v chunks each, every chunk tf / tb.
TimelineInput interleaved(int p, int v, int m, double tf, double tb) {
  TimelineInput in = homogeneous(p, m, v * tf, v * tb, Schedule::kInterleaved1F1B);
  in.virtual_stages = v;
  for (int k = 0; k < p * v; ++k) {
    StageCosts c;
    c.forward_ms = tf;
    c.backward_ms = tb;
    in.chunks.push_back(c);
  }
  return in;
}

}  // namespace

// Narayanan et al. 2021, Sec. 2.2.2: with v chunks per stage the bubble shrinks v-fold, to
// (p - 1)(tf + tb) / v for stage times tf, tb: iteration (m v + p - 1)(chunk tf + chunk tb).
TEST_CASE("interleaved 1F1B: the bubble is the 1F1B bubble over v", "[timeline][interleaved]") {
  for (int p : {2, 3, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        const double tf = 0.5, tb = 1.25;
        INFO("p " << p << " v " << v << " m " << m);
        const TimelineResult r = simulate_timeline(interleaved(p, v, m, tf, tb));
        CHECK(std::abs(r.iteration_ms - (m * v + p - 1) * (tf + tb)) < 1e-9);
        const TimelineResult plain = simulate_timeline(homogeneous(p, m, v * tf, v * tb, Schedule::k1F1B));
        CHECK(std::abs(plain.iteration_ms - (m + p - 1) * v * (tf + tb)) < 1e-9);
        for (int i = 0; i < p; ++i)
          CHECK(r.peak_in_flight[i] == in_flight_microbatches(Schedule::kInterleaved1F1B, p, i, m, v));
      }
}

TEST_CASE("interleaved 1F1B: the last stage's chunk sends to the first stage's next chunk", "[timeline][interleaved]") {
  TimelineInput in = interleaved(2, 2, 2, 1, 2);
  for (auto& c : in.chunks) c.send_forward_ms = c.send_backward_ms = 0.25;
  const TimelineResult r = simulate_timeline(in);
  int wrap_sends = 0, wrap_recvs = 0;
  for (const Span& s : r.spans) {
    if (s.name == "send" && s.stage == 1 && s.peer == 0 && s.chunk == 0) ++wrap_sends;  // forwards 1 -> 0
    if (s.name == "recv" && s.stage == 0 && s.peer == 1 && s.chunk == 1 ) ++wrap_recvs;
  }
  CHECK(wrap_sends == 2 + 2);  // 2 forward wrap sends (chunk 0 -> 1) and 2 backward sends of chunk 0
  CHECK(wrap_recvs == 2 + 2);  // the forward wrap and stage 1 chunk 1's backward sends
  const ordered_json trace = chrome_trace(r, in.stages);
  bool chunk_arg = false;
  for (const auto& e : trace["traceEvents"])
    if (e.contains("args") && e["args"].contains("chunk") && e["args"]["chunk"] == 1) chunk_arg = true;
  CHECK(chunk_arg);
  in.microbatches = 3;  // not a multiple of pp
  CHECK_THROWS_AS(simulate_timeline(in), InputError);
}
