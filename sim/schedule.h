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
//   Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2; Megatron-LM's
//   forward_backward_pipelining_with_interleaving): each stage (pipeline
//   rank) holds v model chunks; chunk c of stage s is virtual stage
//   c * pp + s of the pp * v the model is cut into. A stage runs m * v
//   forwards and m * v backwards; its k-th forward is on chunk
//   (k mod pp*v) / pp and micro-batch (k / (pp*v)) * pp + k mod pp (groups
//   of pp micro-batches go through one chunk, then the next), its k-th
//   backward on the same micro-batch and chunk v - 1 - that. Warm-up:
//   min(2 (pp - stage - 1) + (v - 1) pp, m v) forwards, then forward/backward
//   pairs, then the cool-down (Megatron's count, its
//   microbatch_group_size_per_vp_stage left at pp). Megatron requires m to
//   be a multiple of pp for it (else micro-batch ids run past m); so do we
//   (interleaving_error).
// GPipe and 1F1B are the interleaved order's special case v = 1 with their
// own warm-up, so one order serves all three.
//
// REQUIRES (everywhere): pp >= 1, 0 <= stage < pp, microbatches >= 1,
// virtual_stages >= 1 (> 1 only with kInterleaved1F1B), and for
// kInterleaved1F1B interleaving_error(...) empty.
// Everything here is a pure function of its arguments: thread-safe, no
// allocation, nothing stored.
#pragma once

#include <algorithm>
#include <string>

namespace hetplan {

enum class Schedule { kGpipe, k1F1B, kInterleaved1F1B };

const char* to_string(Schedule s);
// "gpipe" / "GPipe", "1f1b" / "1F1B" or "interleaved" / "interleaved-1f1b"; anything else is an
// InputError naming `where`.
Schedule parse_schedule(const std::string& s, const std::string& where);

// Why `schedule` cannot run pp stages of `virtual_stages` chunks each over `microbatches`, as one line
// (empty: it can). Interleaved 1F1B: virtual_stages >= 2 and microbatches a multiple of pp (Megatron's
// rule); the others: virtual_stages == 1.
std::string interleaving_error(Schedule schedule, int pp, int microbatches, int virtual_stages);

// The virtual stage (place in the model's order of pp * v pieces) of chunk `chunk` of stage `stage`.
inline int virtual_stage(int pp, int stage, int chunk) { return chunk * pp + stage; }

// Transformer blocks among Metis layers [begin, end) of a model of num_layers (layer 0 the embedding,
// num_layers - 1 the head).
inline int stage_blocks(int begin, int end, int num_layers) {
  return std::max(0, std::min(end, num_layers - 1) - std::max(begin, 1));
}

// How a plan's stage of Metis layers [begin, end) splits into v chunks: its blocks as evenly as possible
// (the first chunks one more), the embedding with chunk 0 and the head with chunk v - 1 (Megatron's even
// virtual split, which does not count them). A plan keeps each stage's layers; chunk c of stage s holds
// the c-th piece, and the model runs the pieces in virtual-stage order (all stages' chunk 0, then chunk
// 1, ...). Sets chunk `chunk`'s piece [*first, *last) of [begin, end) (the plan's numbering: a stage's
// pieces stay contiguous there; chunk_model_layers gives where they sit in the model).
// REQUIRES: stage_blocks(begin, end, num_layers) >= v >= 1, 0 <= chunk < v.
inline void chunk_layers(int begin, int end, int num_layers, int v, int chunk, int* first, int* last) {
  const int lo = std::max(begin, 1), n = stage_blocks(begin, end, num_layers), base = n / v, extra = n % v;
  *first = chunk == 0 ? begin : lo + chunk * base + std::min(chunk, extra);
  *last = chunk == v - 1 ? end : lo + (chunk + 1) * base + std::min(chunk + 1, extra);
}

// The model layers [*first, *last) of chunk `chunk` of stage `stage`, for a plan whose stage i keeps
// Metis layers [partition[i], partition[i + 1]) (partition: pp + 1 entries from 0 to the model's layers):
// the pieces (chunk_layers) laid end to end in virtual-stage order. Layer 0 (the embedding) stays on
// virtual stage 0 and the last (the head) on the last one; every other piece is blocks, so a piece costs
// the same at either numbering. O(pp * v).
inline void chunk_model_layers(const int* partition, int pp, int v, int stage, int chunk, int* first, int* last) {
  int at = 0;
  for (int k = 0; k <= virtual_stage(pp, stage, chunk); ++k) {
    int a = 0, b = 0;
    chunk_layers(partition[k % pp], partition[k % pp + 1], partition[pp], v, k / pp, &a, &b);
    *first = at;
    at += b - a;
  }
  *last = at;
}

// One compute op of a stage: the forward or the backward of one micro-batch on one model chunk.
struct PipelineOp {
  int micro_batch = 0;
  int chunk = 0;  // the stage's model chunk, 0 <= chunk < v (always 0 without interleaving)
  bool forward = true;
};

// Forwards (of a micro-batch on one chunk) a stage runs before its first backward, beyond the one right
// before it under 1F1B: GPipe m, 1F1B min(pp - stage - 1, m), interleaved
// min(2 (pp - stage - 1) + (v - 1) pp, m v).
inline int warmup_forwards(Schedule schedule, int pp, int stage, int microbatches, int virtual_stages = 1) {
  if (schedule == Schedule::kGpipe) return microbatches;
  if (schedule == Schedule::k1F1B) return std::min(pp - stage - 1, microbatches);
  return std::min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp, microbatches * virtual_stages);
}

// (Micro-batch, chunk) pairs whose activations stage `stage` of `pp` holds at its peak (forwarded, not
// yet backwarded): GPipe m, 1F1B min(pp - stage, m), interleaved min(warm-up + 1, m v) (at least 1).
// Under interleaving each counts one chunk's activations: the first stage holds
// ((v + 1) pp - 1) / v stage-sized micro-batches, pp + (pp - 1) / v, Korthikanti et al. 2022's
// pp (1 + (pp - 1) / (pp v)).
inline int in_flight_microbatches(Schedule schedule, int pp, int stage, int microbatches, int virtual_stages = 1) {
  if (schedule == Schedule::kGpipe) return microbatches;
  const int total = microbatches * (schedule == Schedule::kInterleaved1F1B ? virtual_stages : 1);
  return std::max(1, std::min(warmup_forwards(schedule, pp, stage, microbatches, virtual_stages) + 1, total));
}

// The op order of one stage: ops [0, size()), op(q) in O(1). A value; iterate it or index it.
class StageOps {
 public:
  StageOps(Schedule schedule, int pp, int stage, int microbatches, int virtual_stages = 1)
      : pp_(pp),
        v_(schedule == Schedule::kInterleaved1F1B ? virtual_stages : 1),
        total_(microbatches * v_),
        warmup_(warmup_forwards(schedule, pp, stage, microbatches, v_)) {}

  int size() const { return 2 * total_; }
  int warmup() const { return warmup_; }
  int chunks() const { return v_; }

  // The q-th op, 0 <= q < size(): warm-up forwards, then forward/backward pairs, then the cool-down.
  PipelineOp operator[](int q) const {
    if (q < warmup_) return nth(q, true);
    if (q < warmup_ + 2 * (total_ - warmup_)) {
      const int r = q - warmup_;
      const bool forward = (r % 2) == 0;
      return nth(forward ? warmup_ + r / 2 : r / 2, forward);
    }
    return nth(q - total_, false);
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
  // The k-th forward or backward: groups of pp micro-batches per chunk (chunks in reverse for backwards).
  PipelineOp nth(int k, bool forward) const {
    const int in_group = k % (pp_ * v_);
    const int chunk = in_group / pp_;
    return {(k / (pp_ * v_)) * pp_ + k % pp_, forward ? chunk : v_ - 1 - chunk, forward};
  }

  int pp_;
  int v_;
  int total_;
  int warmup_;
};

// The most model chunks a stage may hold (plan files and --vp accept up to 64).
inline constexpr int kMaxVirtualStages = 64;

// What a stage holds at each of its backwards, in its op order (StageOps): calls
// visit(chunk, live, done) just before each backward, where `chunk` is the backward's model chunk,
// live[c] the micro-batches forwarded on chunk c and not yet backwarded (the one about to be
// backwarded among them), done[c] those already backwarded on chunk c (c < the stage's chunks).
// A stage's activations peak just before one of its backwards (every forward adds, every backward
// frees), so the memory model takes its peak over these points (sim/memory_model.h); which chunks are
// live there matters where chunks differ (the embedding on the first stage's chunk 0, the head on the
// last stage's chunk v - 1, uneven block counts). At pp 4, v 2 the first backward of stage 1 finds
// 5 micro-batches live on chunk 0 and 4 on chunk 1, its fourth 8 and 1: not m v / v of each.
// O(m v) time; allocates nothing. REQUIRES: as StageOps, virtual_stages <= kMaxVirtualStages.
template <class Visit>
void for_each_backward(Schedule schedule, int pp, int stage, int microbatches, int virtual_stages, Visit&& visit) {
  int live[kMaxVirtualStages] = {}, done[kMaxVirtualStages] = {};
  for (const PipelineOp op : StageOps(schedule, pp, stage, microbatches, virtual_stages)) {
    if (op.forward) {
      ++live[op.chunk];
      continue;
    }
    visit(op.chunk, static_cast<const int*>(live), static_cast<const int*>(done));
    --live[op.chunk];
    ++done[op.chunk];
  }
}

// for_each_backward's visits on a stage of one chunk (GPipe, 1F1B, or interleaving at v = 1), in closed
// form: with w = StageOps' warm-up, the first `steady` = m - w backwards (the forward/backward pairs) find
// live = w + 1 and done = 0, 1, ..., steady - 1; the last w (the cool-down) live = w, w - 1, ..., 1 and
// done = steady, ..., m - 1. So a per-backward sum that grows with done (the memory model's walk) takes
// its largest steady value at the last steady backward, and only the cool-down needs a visit each:
// O(w) instead of O(m) (1F1B: w < pp). REQUIRES: as StageOps.
struct OneChunkBackwards {
  int warmup = 0;  // w; the cool-down's backwards
  int steady = 0;  // m - w
};

inline OneChunkBackwards one_chunk_backwards(Schedule schedule, int pp, int stage, int microbatches) {
  const int w = StageOps(schedule, pp, stage, microbatches, 1).warmup();
  return {w, microbatches - w};
}

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

// A third family of chains, 1F1B only: micro-batch 0 arrives at j, j runs its ops in order, and at h
// micro-batches i_1 < ... < i_h ("trips") the chain leaves j after i's forward, makes i's round trip
// through the stages after j and comes back to j's backward of i, skipping the ops j runs in between
// (under 1F1B, between F_i and B_i: the forwards i + 1 .. i + w and the backwards i - w .. i - 1 that
// exist, w = j's warm-up forwards); then j runs every op after its backward of m - 1. Trips must not
// overlap: the op right after j's backward of i is its forward of i + w + 1, so i_{k+1} >= i_k + w + 1.
// Counted here: the trips 0, w + 1, 2 (w + 1), ..., (h - 2)(w + 1) and m - 1 (h >= 2; the two ends skip
// only w forwards, resp. w backwards, a trip in between both), at most most_trips = 1 + (m - 1) / (w + 1)
// of them; with h = 1 the trip 0 alone (then every op after j's backward of 0: start_path_counts' chain).
// j's ops on the chain: for h >= 2, m - (h - 1) w forwards and as many backwards (every backward but
// micro-batch 0's accumulates); `trips`: the round trips, the first micro-batch 0's (no accumulation), the
// other trips - 1 with accumulation, each after one forward send of j. The chain's length is affine in h,
// so its largest over h is at h = 2 or h = most_trips: `trips` = 0 asks for most_trips, and a larger h is
// taken as most_trips. Under GPipe and interleaving, and with no stage after j: all zero (no such chain
// is claimed).
struct MultiTripCounts {
  int forwards = 0, backwards = 0, accumulations = 0, trips = 0;
};

inline int most_trips(Schedule schedule, int after, int m) {
  if (schedule != Schedule::k1F1B || after < 1 || m < 1) return 0;
  const int w = warmup_forwards(schedule, after + 1, 0, m);
  return 1 + (m - 1) / (w + 1);
}

inline MultiTripCounts multi_trip_counts(Schedule schedule, int after, int m, int trips = 0) {
  const int most = most_trips(schedule, after, m);
  if (most < 1) return {};
  const int h = trips < 1 || trips > most ? most : trips;
  const int w = warmup_forwards(schedule, after + 1, 0, m);
  if (h == 1) return {1 + std::max(0, m - 1 - w), m, m - 1, 1};  // then the forwards after B_0 too
  const int ops = m - (h - 1) * w;
  return {ops, ops, ops - 1, h};
}

}  // namespace hetplan
