#include "sim/sequence_parallel.h"

#include <algorithm>

#include "sim/dp_overlap.h"

namespace hetplan {

SpCollectiveExtra sp_collective_extra_s(double all_reduce_s, double gather_s, int blocks, bool embedding, bool head) {
  const double block = 2 * (2 * gather_s - all_reduce_s);  // per pass: 2 all-reduces -> 2 gathers + 2 scatters
  SpCollectiveExtra e;
  e.forward_s = blocks * block + (embedding ? gather_s - all_reduce_s : 0.0) + (head ? gather_s : 0.0);
  e.backward_s = blocks * block + (embedding ? gather_s : 0.0) + (head ? gather_s - all_reduce_s : 0.0);
  return e;
}

double cp_kv_step_bytes(const ModelShape& m, long long seq, int cp, int tp, double samples) {
  const double tokens = samples * static_cast<double>(seq) / cp;
  const double kv = static_cast<double>(m.num_kv_heads) * m.head_dim / tp;
  return 2.0 /* K and V */ * tokens * kv * 2.0 /* bf16 */;
}

namespace {

// Bytes of a cp rank's attention output (or its dQ): samples x seq / cp tokens x num_heads x head_dim / tp, bf16.
double cp_output_bytes(const ModelShape& m, long long seq, int cp, int tp, double samples) {
  const double tokens = samples * static_cast<double>(seq) / cp;
  return tokens * static_cast<double>(m.num_heads) * m.head_dim / tp * 2.0 /* bf16 */;
}

}  // namespace

RingMergeBytes ring_merge_bytes(const ModelShape& m, long long seq, int cp, int tp, double samples) {
  if (cp <= 1) return {};
  const double out = cp_output_bytes(m, seq, cp, tp, samples);
  const double kv = cp_kv_step_bytes(m, seq, cp, tp, samples);
  const double steps = cp - 1;
  return {3.0 * steps * out, 3.0 * steps * (out + kv / 2)};
}

RingMergeBytes ring_copy_bytes(const ModelShape& m, long long seq, int cp, int tp, double samples) {
  if (cp <= 1) return {};
  const double out = cp_output_bytes(m, seq, cp, tp, samples);
  const double kv = cp_kv_step_bytes(m, seq, cp, tp, samples);
  return {2.0 * kv, 2.0 * kv + 5.0 * (cp - 1) * out};
}

double ring_forward_stretch_s(int cp, double step_comm_s, double attention_s, double slowdown) {
  if (cp <= 1) return 0;
  return (cp - 1) * overlap_slowdown_s(step_comm_s, attention_s / cp, slowdown);
}

double ring_backward_stretch_s(int cp, double step_comm_s, double attention_s, double slowdown) {
  if (cp <= 1) return 0;
  const double s = step_comm_s, window = 2 * attention_s / cp;
  return 2 * overlap_slowdown_s(s, window, slowdown) + (cp - 2) * overlap_slowdown_s(2 * s, window, slowdown);
}

double attention_flop_share(const ModelShape& m, long long seq) {
  const double total = m.block_forward_flops_per_token(seq);
  return total > 0 ? m.attention_forward_flops_per_token(static_cast<double>(seq)) / total : 0.0;
}

double ring_exposed_s(int cp, double step_comm_s, double attention_s) {
  if (cp <= 1) return 0;
  return (cp - 1) * std::max(0.0, step_comm_s - attention_s / cp);
}

double ring_backward_exposed_s(int cp, double step_comm_s, double attention_s) {
  if (cp <= 1) return 0;
  const double s = step_comm_s, window = 2 * attention_s / cp;
  return 2 * std::max(0.0, s - window) + (cp - 2) * std::max(0.0, 2 * s - window) + s;
}

}  // namespace hetplan
