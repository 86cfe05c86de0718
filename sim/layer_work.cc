#include "sim/layer_work.h"

#include "base/input_error.h"

namespace hetplan {

namespace {

// Megatron's vocabulary-parallel cross-entropy on fp32 logits, per logit of this rank's slice: forward the
// cast from 16 bits (read 2, write 4), the row maximum (read 4), the shift and the exp (read and write 4 each),
// the row sum (read 4), the normalisation (read and write 4): 38; backward the clone of the softmax (8), the
// scaling by the loss gradient (8) and the cast back to 16 bits (read 4, write 2): 22.
constexpr double kCrossEntropyBytesPerLogit = 38.0 + 22.0;

int gemm_passes(Recompute r) { return r == Recompute::kFull ? 4 : 3; }

}  // namespace

double main_grad_accumulation_bytes(MainGrads g, double v) {
  switch (g) {
    case MainGrads::k16Bit: return 3 * v;
    case MainGrads::kFp32: return v + 4 + 4;
    case MainGrads::kFp32Cast: return v + 4 + 4 + 4 + 4;
  }
  return 3 * v;
}

const char* to_string(MainGrads g) {
  switch (g) {
    case MainGrads::k16Bit: return "16bit";
    case MainGrads::kFp32: return "fp32";
    case MainGrads::kFp32Cast: return "fp32-cast";
  }
  return "?";
}

MainGrads parse_main_grads(const std::string& name, const std::string& where) {
  for (MainGrads g : {MainGrads::k16Bit, MainGrads::kFp32, MainGrads::kFp32Cast})
    if (name == to_string(g)) return g;
  throw InputError(where + ": '" + excerpt(name) + "': expected 16bit, fp32 or fp32-cast");
}

LayerGemms layer_gemms(const ModelShape& s, LayerKind kind, long long tokens, int tp, Recompute recompute) {
  LayerGemms g;
  const int passes = gemm_passes(recompute);
  const long long h = s.hidden_size;
  if (kind == LayerKind::kEmbedding) return g;
  if (kind == LayerKind::kHead) {
    g.push_back({tokens, h, s.vocab_size / tp, 3});  // never recomputed
    return g;
  }
  const long long q = static_cast<long long>(s.num_heads) * s.head_dim / tp;
  const long long kv = static_cast<long long>(s.num_kv_heads) * s.head_dim / tp;
  const long long f = s.ffn_hidden_size / tp;
  g.push_back({tokens, h, q + 2 * kv, passes});  // fused QKV, column-parallel
  g.push_back({tokens, q, h, passes});           // attention output, row-parallel
  if (s.mlp == MlpKind::kSwiGlu) g.push_back({tokens, h, f, passes});  // gate
  g.push_back({tokens, h, f, passes});                                  // up (GELU's fc)
  g.push_back({tokens, f, h, passes});                                  // down (GELU's proj)
  return g;
}

double layer_gemm_weight_params(const ModelShape& s, LayerKind kind, int tp) {
  double params = 0;
  for (const GemmDims& g : layer_gemms(s, kind, 1, tp, Recompute::kNone))
    params += static_cast<double>(g.k) * static_cast<double>(g.n);
  return params;
}

int column_parallel_input_groups(const ModelShape& s, LayerKind kind, int groups[2][2]) {
  if (kind == LayerKind::kEmbedding) return 0;
  if (kind == LayerKind::kHead) {
    groups[0][0] = 0, groups[0][1] = 1;  // the logits GEMM
    return 1;
  }
  // layer_gemms' order: QKV, attention output, [gate,] up, down.
  groups[0][0] = 0, groups[0][1] = 1;
  groups[1][0] = 2, groups[1][1] = s.mlp == MlpKind::kSwiGlu ? 4 : 3;
  return 2;
}

double layer_attention_flops(const ModelShape& s, LayerKind kind, long long bs, long long seq, int tp,
                             Recompute recompute) {
  if (kind != LayerKind::kBlock) return 0.0;
  const double passes = recompute == Recompute::kNone ? 3.0 : 4.0;
  return passes * static_cast<double>(bs) * static_cast<double>(seq) *
         s.attention_forward_flops_per_token(static_cast<double>(seq)) / tp;
}

ScoreTraffic layer_score_traffic(const ModelShape& s, LayerKind kind, long long bs, long long seq, int tp,
                                 Recompute recompute, double v) {
  ScoreTraffic t;
  if (kind != LayerKind::kBlock) return t;
  const bool again = recompute != Recompute::kNone;  // the forward once more (full, or selective's core)
  const double seqd = static_cast<double>(seq);
  t.scores = static_cast<double>(bs) * (static_cast<double>(s.num_heads) / tp) * seqd * seqd;
  t.gemm_passes = 2 + 4 + (again ? 2 : 0);
  t.gemm_flops_per_score = 2.0 * static_cast<double>(s.head_dim);
  t.gemm_bytes_per_score = v;
  const double mask = s.dropout ? 1.0 : 0.0;  // a byte per score
  const double forward = 2 * v + (s.dropout ? 2 * v + mask : 0.0);
  const double backward = 3 * v + (s.dropout ? 2 * v + mask : 0.0);
  t.stream_bytes_per_score = forward * (again ? 2 : 1) + backward;
  return t;
}

int layer_allreduces(LayerKind kind, int tp) {
  if (tp <= 1) return 0;
  return kind == LayerKind::kBlock ? 4 : 1;
}

double layer_elementwise_bytes(const ModelShape& s, LayerKind kind, long long tokens, int tp, Recompute recompute,
                               double v, bool sequence_parallel) {
  const double t = static_cast<double>(tokens), h = static_cast<double>(s.hidden_size);
  // Forward traffic, in values per token; the backward moves about twice the forward's.
  double fwd = 0;
  double fixed = 0;  // bytes not of the forward's pattern (the embedding table's gradient, the cross-entropy)
  if (kind == LayerKind::kEmbedding) {
    fwd = 2 * h + (s.learned_positions ? 3 * h : 0);  // gather (+ position add)
    fixed = 2.0 * static_cast<double>(s.vocab_size) / tp * h * v;  // its gradient: zeroed, then scatter-added into
  } else if (kind == LayerKind::kHead) {
    fwd = 2 * h;  // final norm
    fixed = t * kCrossEntropyBytesPerLogit * static_cast<double>(s.vocab_size) / tp;
  } else {
    const double q = static_cast<double>(s.num_heads) * s.head_dim / tp;
    const double kv = static_cast<double>(s.num_kv_heads) * s.head_dim / tp;
    const double f = static_cast<double>(s.ffn_hidden_size) / tp;
    double between = 2 * 2 * h + 2 * 3 * h;  // two norms (read, write), two residual adds (read two, write one)
    if (s.norm == NormKind::kRmsNorm) between += 2 * 2 * h;  // computed in fp32 as Hugging Face does: a cast each way
    if (s.dropout) between += 2 * 2.5 * h;  // two dropouts on h (read, write, a byte mask)
    fwd = sequence_parallel ? between / tp : between;  // the tp regions' outside: split by sequence parallelism
    if (!s.learned_positions) fwd += 2 * (q + kv);  // RoPE on q and k
    fwd += s.mlp == MlpKind::kSwiGlu ? 5 * f : 2 * f;  // silu(gate) * up; GELU
  }
  const double passes = (kind == LayerKind::kBlock && recompute == Recompute::kFull) ? 4.0 : 3.0;
  return passes * t * fwd * v + fixed;
}

int layer_kernel_count(const ModelShape& s, LayerKind kind, Recompute recompute) {
  int fwd = 0;
  if (kind == LayerKind::kEmbedding) {
    fwd = s.learned_positions ? 3 : 1;
  } else if (kind == LayerKind::kHead) {
    fwd = 12;  // norm, projection, vocab-parallel cross-entropy
  } else {
    fwd = 14;  // norms, QKV, attention, output, adds, MLP
    if (s.norm == NormKind::kRmsNorm) fwd += 2 * 5;  // fp32 RMSNorm: cast, pow, mean, rsqrt, mul
    if (!s.learned_positions) fwd += 10;             // RoPE on q and k
    if (s.mlp == MlpKind::kSwiGlu) fwd += 3;
    if (s.dropout) fwd += 2;
  }
  const int passes = (kind == LayerKind::kBlock && recompute == Recompute::kFull) ? 4 : 3;
  return fwd * passes;
}

}  // namespace hetplan
