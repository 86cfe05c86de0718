#include "sim/memory_model.h"

#include <algorithm>

#include "base/input_error.h"

namespace hetplan {

double QuantSpec::bits_per_param() const {
  double b = bits;
  if (block > 0) {
    if (second_block > 0)
      b += second_constant_bits / block + constant_bits / (block * second_block);
    else
      b += constant_bits / block;
  }
  return b;
}

QuantSpec bf16_weights() { return QuantSpec{16, 0, 0, 0, 0}; }
QuantSpec nf4_double_quant() { return QuantSpec{4, 64, 32, 256, 8}; }
QuantSpec int8_blockwise() { return QuantSpec{8, 64, 32, 0, 0}; }

namespace {

struct PerParam {
  double weight, grad16, grad32, master, optimizer;  // bytes per trainable parameter
};

PerParam per_param(const TrainingSetup& s) {
  if (s.precision == Precision::kFp32) return {4, 4, 0, 0, 8};
  // FP8 training (Transformer Engine) keeps the bf16 weights and adds an fp8 copy for the GEMMs.
  const double w = 2 + (s.precision == Precision::kFp8 ? 1 : 0);
  switch (s.accounting) {
    case ZeroAccounting::kZeroPaper: return {w, 2, 0, 4, 8};
    case ZeroAccounting::kDeepSpeed: return {w, 2, 4, 4, 8};
    case ZeroAccounting::kMegatron: return {w, 0, 4, 4, 8};
    case ZeroAccounting::kFsdp2: return {4, 0, 4, 0, 8};  // the fp32 shard is the weight and the master
  }
  return {w, 2, 0, 4, 8};
}

// Whether the last Metis layer of a stage holding layers [first, ...] of a
// pp-stage pipeline has an LM head of its own: untied, or tied with an
// embedding on another stage (Megatron keeps a copy there). Otherwise the head
// is the embedding this stage holds.
bool head_has_own_weights(const ModelShape& m, int pp, int first) { return !m.tied_embeddings || (pp > 1 && first > 0); }

}  // namespace

ModelStateBytes model_state_bytes(double trainable, double frozen_weight_bytes, double largest_module,
                                  const TrainingSetup& s, int dp, int gpus_per_node) {
  const int z = s.zero_stage;
  const double n = std::max(dp, 1);
  PerParam p = per_param(s);
  if (s.finetune != Finetune::kFull) p = {4, 0, 4, 0, 8};  // PEFT adapters train in fp32: weight, grad, m, v
  if (s.adam_8bit) p.optimizer = 2 + 2 * 4 / 2048.0;  // bitsandbytes blockwise 8-bit states

  ModelStateBytes out;
  // Weights: trainable compute copy plus the frozen base. A quantised
  // compute copy (8- or 4-bit weights) replaces the 16-bit one.
  double weight_bytes = p.weight;
  if (s.finetune == Finetune::kFull && s.base_weights.bits < 16) weight_bytes = s.base_weights.bits_per_param() / 8;
  double weights = trainable * weight_bytes + frozen_weight_bytes;
  double grads16 = trainable * p.grad16;
  double grads32 = trainable * p.grad32;
  double master_opt = trainable * (p.master + p.optimizer);

  // DeepSpeed partitions its fp32 gradients with the optimizer state from
  // stage 1 and keeps the 16-bit gradients whole until stage 3 (memory.rst:
  // "4 * params + 16 * params / total gpus" for ZeRO-2); the ZeRO paper and
  // Megatron partition gradients from stage 2.
  const bool deepspeed = s.accounting == ZeroAccounting::kDeepSpeed && s.precision != Precision::kFp32 &&
                         s.finetune == Finetune::kFull;
  if (z >= 1) master_opt /= n;
  if (deepspeed) {
    if (z >= 1) grads32 /= n;
    if (z >= 3) grads16 = 0;
  } else if (z >= 2) {
    grads16 /= n;
    grads32 /= n;
  }
  const bool fsdp2 = s.accounting == ZeroAccounting::kFsdp2 && s.precision != Precision::kFp32 &&
                     s.finetune == Finetune::kFull;
  if (z >= 3 && fsdp2) {
    weights /= n;
    // The unit being computed is all-gathered in 16 bits and its unsharded gradient computed in 16 bits; that
    // gradient is cast to reduce_dtype (fp32) as the reduce-scatter's input, allocated in the backward like the
    // sharded gradients it becomes, so it sits with them (rank_memory weighs them against the activations).
    out.transient = largest_module * (2 + 2);
    grads32 += largest_module * 4;
  } else if (z >= 3) {
    weights /= n;
    // The module being computed is gathered whole, with its gradients (DeepSpeed memory.rst:
    // largest_layer_memory = 4 * largest_layer_params for 16-bit weights and gradients).
    out.transient = largest_module * (p.weight + (p.grad16 > 0 ? p.grad16 : p.grad32));
  } else if (z == 2 && p.grad32 > 0 && !deepspeed) {
    // Sharded fp32 gradients: a unit's full fp32 gradient bucket while it is reduce-scattered.
    out.transient = largest_module * p.grad32;
  }
  if (s.offload_optimizer) {
    grads16 = grads32 = master_opt = 0;
  }
  if (s.offload_params && z >= 3) weights = 0;
  out.weights = weights;
  out.gradients = grads16 + grads32;
  out.optimizer = master_opt;

  // CPU memory per node, by DeepSpeed's rules (memory.rst, "General RAM"): a
  // model built in fp32 by each of the node's processes (4 * n_gpus bytes per
  // parameter) unless zero.Init partitions it as it is built, and the
  // offloaded fp32 states (16 bytes; 18 with the 16-bit weights) of the
  // node's share of the partitions.
  const double params = trainable + frozen_weight_bytes / 2;
  const double g = gpus_per_node;
  const double node_share = std::min(1.0, g / n);
  double cpu;
  if (z <= 2) {
    cpu = s.offload_optimizer ? params * std::max(4 * g, 16.0) : params * 4 * g;
  } else if (s.offload_optimizer && s.offload_params) {
    cpu = s.zero_init ? params * 18 * node_share : params * std::max(4 * g, 18 * node_share);
  } else if (s.offload_optimizer) {
    cpu = s.zero_init ? params * 16 * node_share : params * std::max(4 * g, 16 * node_share);
  } else {
    cpu = s.zero_init ? largest_module * 4 * g : params * 4 * g;
  }
  out.cpu_per_node = cpu * s.cpu_buffer_factor;
  return out;
}

double layer_activation_bytes(const ModelShape& m, long long s_len, long long b_len, int tp, bool sp,
                              Recompute recompute, bool flash, Precision precision, bool fp32_residual) {
  const double s = static_cast<double>(s_len), b = static_cast<double>(b_len), h = static_cast<double>(m.hidden_size);
  const double t = tp;
  const double q = static_cast<double>(m.num_heads) * m.head_dim;
  const double kv = static_cast<double>(m.num_kv_heads) * m.head_dim;
  const double f = static_cast<double>(m.ffn_hidden_size);
  const double a = m.num_heads;
  // Bytes of a stored 16-bit tensor element; GEMM inputs are kept in fp8 by FP8 training.
  const double e = precision == Precision::kFp32 ? 4 : 2;
  const double eg = precision == Precision::kFp8 ? 1 : e;
  const double sb = s * b;
  // The residual stream's element: fp32 under torch.autocast over fp32 parameters.
  const double er = fp32_residual ? 4 : e;

  if (recompute == Recompute::kFull) {
    // Only the layer's input survives (Korthikanti et al. Sec. 4.3: 2sbh, split by t with sequence parallelism).
    return sb * h * er / (sp ? t : 1);
  }
  // Terms no tensor parallelism splits (sequence parallelism does): the two
  // norm inputs, the inputs of the QKV and first MLP GEMMs, the dropout masks.
  double replicated = sb * h * (2 * er) + sb * h * (2 * eg);
  if (m.dropout) replicated += 2 * sb * h;  // 1-byte masks after attention and MLP
  // Terms split by tp: Q and K for the scores, V, the output projection's input.
  double split = sb * (q * e + kv * e) + sb * kv * e + sb * q * eg;
  if (m.mlp == MlpKind::kGelu)
    split += sb * f * e + sb * f * eg;  // GELU input, GELU output (the second GEMM's input)
  else
    split += 3 * sb * f * e + sb * f * eg;  // gate, silu(gate), up, and the product (down's input)
  // LoRA adapters keep x A (b s r) for B's gradient; x itself is the GEMM input already counted.
  // The attention matrix: softmax output (2 a s^2 b), its dropout mask (a s^2 b) and the dropout output
  // (2 a s^2 b). Selective recomputation (Sec. 4.2) and flash attention store none of it.
  double scores = 0;
  if (recompute == Recompute::kNone && !flash) scores = a * s * s * b * (e + (m.dropout ? 1 + e : 0));
  return (sp ? replicated / t : replicated) + (split + scores) / t;
}

double embedding_activation_bytes(const ModelShape& m, long long s, long long b, int tp, bool sp) {
  // Megatron's theoretical_memory_usage.py: token ids (8 bytes each) and the embedding dropout mask.
  const double sb = static_cast<double>(s) * static_cast<double>(b);
  return 8 * sb + (m.dropout ? sb * m.hidden_size / (sp ? tp : 1) : 0);
}

double head_activation_bytes(const ModelShape& m, long long s, long long b, int tp, bool sp, bool fp32_residual,
                             bool eager_fp32_loss) {
  // Final norm input and LM head input (2 bytes each; the norm's 4 with an fp32 residual stream), fp32 logits
  // for the loss, split by the vocab-parallel head: one copy for a fused loss; three for logits.float() +
  // F.cross_entropy at the backward's start (log_softmax's saved output, nll_loss's gradient, and
  // log_softmax's gradient being written).
  const double sb = static_cast<double>(s) * static_cast<double>(b);
  const double inputs = (fp32_residual ? 4 : 2) + 2;
  const double logit_copies = eager_fp32_loss ? 3 : 1;
  return inputs * sb * m.hidden_size / (sp ? tp : 1) + logit_copies * 4 * sb * static_cast<double>(m.vocab_size) / tp;
}

ShardParams shard_params(const ModelShape& m, int first, int end, int pp, const TrainingSetup& s) {
  ShardParams out;
  const int last = m.metis_num_layers() - 1;
  const BlockLinears linears = m.block_linears();
  double lora_per_block = 0;
  for (const auto& l : linears)
    if (s.lora_targets & l.target) lora_per_block += static_cast<double>(s.lora_rank) * (l.in + l.out);
  double largest_linear = 0;
  for (const auto& l : linears) largest_linear = std::max(largest_linear, static_cast<double>(l.params()));
  const double vh = static_cast<double>(m.vocab_size) * m.hidden_size;
  // Every block's terms are alike: computed once, added per block (the same sums).
  long long sharded_params = 0;  // ModelShape::block_sharded_params
  for (const auto& l : linears) sharded_params += l.params();
  const double block_sharded = static_cast<double>(sharded_params);
  const double block_replicated = static_cast<double>(m.block_replicated_params());
  double lw = 0;
  for (const auto& l : linears) lw += static_cast<double>(l.in) * l.out;
  for (int layer = first; layer < end; ++layer) {
    if (layer == 0) {
      out.sharded += vh;  // vocab-parallel embedding
      out.replicated += static_cast<double>(m.embedding_params()) - vh;
      out.largest_module = std::max(out.largest_module, vh);
      out.largest_layer = std::max(out.largest_layer, static_cast<double>(m.embedding_params()));
    } else if (layer == last) {
      out.replicated += m.norm_params();
      // Untied: the LM head. Tied with the embedding on another stage: Megatron keeps a copy here.
      if (head_has_own_weights(m, pp, first)) {
        out.sharded += vh;
        out.largest_module = std::max(out.largest_module, vh);
        out.largest_layer = std::max(out.largest_layer, vh + m.norm_params());
      }
    } else {
      out.sharded += block_sharded;
      out.replicated += block_replicated;
      out.linear_weights += lw;
      out.lora += lora_per_block;
      out.largest_module = std::max(out.largest_module, largest_linear);
      out.largest_layer = std::max(out.largest_layer, block_sharded + block_replicated);
    }
  }
  return out;
}

namespace {

// Whether rank_memory takes the activations from the stage's op order: the schedule is known and every
// chunk has a block (chunk_layers' precondition; a plan that interleaves has them).
bool scheduled_peak_applies(const RankShard& r, int num_layers) {
  if (r.microbatches <= 0) return false;
  const int v = r.schedule == Schedule::kInterleaved1F1B ? r.virtual_stages : 1;
  return v >= 1 && v <= kMaxVirtualStages && (v == 1 || stage_blocks(r.first_layer, r.end_layer, num_layers) >= v);
}

// The rank's activations at the worst moment of its op order (RankShard's comment): sets
// out->activations (the live chunks' stores and the boundary tensors held) and
// out->recompute_workspace (the working set of the backward that runs then). `chunk_terms(a, b, &stored,
// &peak)` gives one micro-batch's store on layers [a, b) and the most a layer there holds beyond it.
// `inputs_counted`: those stores include each layer's input (the analytic terms count a block's first norm
// input), so a chunk's received input is in them already; measured ones count each layer's output instead.
// REQUIRES: scheduled_peak_applies(r, num_layers).
template <class ChunkTerms>
void scheduled_peak(const ModelShape& m, const TrainingSetup& s, const RankShard& r, int num_layers,
                    bool inputs_counted, ChunkTerms&& chunk_terms, MemoryBreakdown* out) {
  const int v = r.schedule == Schedule::kInterleaved1F1B ? r.virtual_stages : 1;
  const int last_vstage = r.pp * v - 1;
  // One boundary tensor: the micro-batch's hidden states (every tp rank receives and sends them whole).
  const double boundary = static_cast<double>(r.micro_batch) * r.seq * m.hidden_size *
                          (s.precision == Precision::kFp32 ? 4.0 : 2.0);
  double stored[kMaxVirtualStages], peak[kMaxVirtualStages], input[kMaxVirtualStages], sent[kMaxVirtualStages];
  for (int c = 0; c < v; ++c) {
    int a = r.first_layer, b = r.end_layer;
    if (v > 1) chunk_layers(r.first_layer, r.end_layer, num_layers, v, c, &a, &b);
    chunk_terms(a, b, &stored[c], &peak[c]);
    const int k = virtual_stage(r.pp, r.stage, c);
    input[c] = k > 0 && !inputs_counted ? boundary : 0.0;  // received from the virtual stage before
    // Kept after the micro-batch's backward on this chunk (replay's held sends): its output sent on, its
    // input's gradient sent back.
    sent[c] = s.sends_held ? (k < last_vstage ? boundary : 0.0) + (k > 0 ? boundary : 0.0) : 0.0;
  }
  double best = -1, best_activations = 0, best_workspace = 0;
  // The first visit with the largest held + peak (what the walk over for_each_backward keeps).
  auto visit = [&](int chunk, const int* live, const int* done) {
    double held = 0;
    for (int c = 0; c < v; ++c) held += live[c] * (stored[c] + input[c]) + done[c] * sent[c];
    if (held + peak[chunk] > best) {
      best = held + peak[chunk];
      best_activations = held;
      best_workspace = peak[chunk];
    }
  };
  if (v == 1 && sent[0] >= 0) {
    // One chunk: the same visits in closed form (one_chunk_backwards). Over the steady backwards live is
    // fixed and done grows, so held + peak never falls (rounding is monotone): the first steady visit
    // that reaches the last one's value is found by bisection, then the cool-down is walked.
    const OneChunkBackwards ob = one_chunk_backwards(r.schedule, r.pp, r.stage, r.microbatches);
    int live = ob.warmup + 1, done = 0;
    if (ob.steady > 0) {
      auto value = [&](int d) { return 0.0 + (live * (stored[0] + input[0]) + d * sent[0]) + peak[0]; };
      const double top = value(ob.steady - 1);
      int lo = 0, hi = ob.steady - 1;  // value(hi) == top
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (value(mid) >= top) hi = mid; else lo = mid + 1;
      }
      done = lo;
      visit(0, &live, &done);
    }
    for (int k = 0; k < ob.warmup; ++k) {
      live = ob.warmup - k;
      done = ob.steady + k;
      visit(0, &live, &done);
    }
  } else {
    for_each_backward(r.schedule, r.pp, r.stage, r.microbatches, v, visit);
  }
  out->activations = best_activations;
  out->recompute_workspace = best_workspace;
}

}  // namespace

MemoryBreakdown rank_memory(const ModelShape& m, const TrainingSetup& s, const RankShard& r) {
  return rank_memory(m, s, r, shard_params(m, r.first_layer, r.end_layer, r.pp, s));
}

namespace {

// What the model states leave for the activation and peak terms to use.
struct RankStates {
  double zero_transient = 0;       // ZeRO's gathered unit as model_state_bytes counted it
  double gradients_allocated = 0;  // the gradients before DDP's persistent buckets
  double ddp_old = 0;              // DDP's old buckets at the second step (0 with ZeRO)
};

// The rank's weights, gradients, optimizer states and their transients (out->states), PyTorch DDP's persistent
// buckets included.
RankStates add_model_states(const ModelShape& m, const TrainingSetup& s, const RankShard& r, const ShardParams& p,
                            MemoryBreakdown* out) {
  RankStates rs;
  const double tp = r.tp;
  double trainable, frozen_bytes = 0;
  if (s.finetune == Finetune::kFull) {
    trainable = p.on_rank(r.tp);
  } else {
    trainable = p.lora / tp;
    // Frozen base: block projections in the base format, everything else (embeddings, norms, head) in bf16.
    const double base_bits = s.finetune == Finetune::kQlora ? s.base_weights.bits_per_param() : 16.0;
    frozen_bytes = p.linear_weights / tp * base_bits / 8 + (p.on_rank(r.tp) - p.linear_weights / tp) * 2;
  }
  // ZeRO's gather unit: DeepSpeed's is a module; FSDP's (and replay's) a layer.
  const double unit = s.accounting == ZeroAccounting::kDeepSpeed ? p.largest_module : p.largest_layer;
  const int shard_dp = s.shard_group > 0 ? std::min(r.dp, s.shard_group) : r.dp;  // HYBRID_SHARD: within a group
  out->states = model_state_bytes(trainable, frozen_bytes, unit / tp, s, shard_dp, r.gpus_per_node);
  rs.zero_transient = out->states.transient;
  if (s.finetune == Finetune::kQlora && p.linear_weights > 0) {
    // The projection being computed is dequantised to bf16 for its GEMM.
    double largest_linear = 0;
    for (const auto& l : m.block_linears()) largest_linear = std::max(largest_linear, static_cast<double>(l.in) * l.out);
    out->states.transient += largest_linear / tp * 2;
  }
  // DeepSpeed's gradient buckets, offload staging and ZeRO-3 prefetch (sim/offload.h); 0 unless setup.deepspeed.model.
  out->states.transient += deepspeed_buffer_bytes(s, p.largest_module / tp);
  rs.gradients_allocated = out->states.gradients;
  // PyTorch DDP's buckets: a second copy of the gradients (sim/runtime_overheads.h); not with ZeRO. At the
  // second step the old buckets too, at the peaks where they are still held (add_peak_gradients).
  if (s.zero_stage == 0) {
    out->states.gradients += ddp_bucket_bytes(s.ddp, trainable * reduced_gradient_bytes(s));
    rs.ddp_old = ddp_old_bucket_bytes(s.ddp, trainable * reduced_gradient_bytes(s));
  }
  return rs;
}

// The analytic activation terms of a transformer block on this rank, which both activation paths read.
struct BlockTerms {
  int last = 0;               // the head's Metis layer
  bool any_block = false;     // the rank holds a transformer block
  double block_avg = 0;       // one micro-batch's stored bytes of an average block (every k-th checkpointed)
  double one_layer_full = 0;  // a block re-materialised by full recomputation, during its backward
  bool walk = false;          // the schedule's per-backward walk sets the peak (scheduled_peak_applies)
};

BlockTerms block_terms(const ModelShape& m, const TrainingSetup& s, const RankShard& r) {
  BlockTerms b;
  b.last = m.metis_num_layers() - 1;
  b.any_block = std::max(r.first_layer, 1) < std::min(r.end_layer, b.last);
  const double block_bytes = b.any_block ? layer_activation_bytes(m, r.seq, r.micro_batch, r.tp, s.sequence_parallel,
                                                                  s.recompute, s.flash_attention, s.precision,
                                                                  s.fp32_residual)
                                         : 0.0;
  b.block_avg = block_bytes;
  const double keep = b.any_block && s.recompute == Recompute::kFull
                          ? layer_activation_bytes(m, r.seq, r.micro_batch, r.tp, s.sequence_parallel,
                                                   Recompute::kNone, s.flash_attention, s.precision, s.fp32_residual)
                          : 0.0;
  // Every k-th block checkpointed, the rest keep everything: the average block.
  if (s.recompute == Recompute::kFull && s.recompute_every > 1 && b.any_block)
    b.block_avg = (block_bytes + (s.recompute_every - 1) * keep) / s.recompute_every;
  if (s.recompute == Recompute::kFull && b.any_block) b.one_layer_full = keep;
  b.walk = scheduled_peak_applies(r, b.last + 1);
  return b;
}

// Activations from the analytic per-layer terms (out->activations, out->recompute_workspace).
void add_analytic_activations(const ModelShape& m, const TrainingSetup& s, const RankShard& r, const BlockTerms& b,
                              MemoryBreakdown* out) {
  int adapters = 0;
  for (const auto& l : m.block_linears()) adapters += (s.lora_targets & l.target) ? 1 : 0;
  const double adapter_bytes = 2.0 * r.seq * r.micro_batch * s.lora_rank * adapters;  // x A of each adapter
  // What one micro-batch stores on layers [a, b) (analytic terms).
  auto analytic_stored = [&](int first, int end) {
    double sum = 0;
    for (int layer = first; layer < end; ++layer) {
      if (layer == 0) {
        sum += embedding_activation_bytes(m, r.seq, r.micro_batch, r.tp, s.sequence_parallel);
      } else if (layer == b.last) {
        sum += head_activation_bytes(m, r.seq, r.micro_batch, r.tp, s.sequence_parallel, s.fp32_residual,
                                     s.eager_fp32_loss);
      } else {
        sum += b.block_avg;
        if (s.finetune != Finetune::kFull) sum += adapter_bytes;
      }
    }
    return sum;
  };
  out->activations = analytic_stored(r.first_layer, r.end_layer) * r.in_flight / r.virtual_stages;
  out->recompute_workspace = b.one_layer_full;
  if (b.walk)
    scheduled_peak(m, s, r, b.last + 1, /*inputs_counted=*/true, [&](int first, int end, double* stored, double* peak) {
      *stored = analytic_stored(first, end);
      *peak = b.one_layer_full;
    }, out);
}

// Activations as measured on the GPU (out->activations, out->recompute_workspace; the ZeRO unit transient
// moves from out->states.transient to the layer-by-layer peak where layers are ZeRO's units).
void add_measured_activations(const ModelShape& m, const TrainingSetup& s, const RankShard& r,
                              const MeasuredActivations& measured, const BlockTerms& b, double zero_transient,
                              MemoryBreakdown* out) {
  const double tp = r.tp;
  const int last = b.last;
  // Measured on the GPU: what the kernels really keep. A plan that recomputes
  // differently from the profiled run scales the stored bytes by the analytic
  // ratio of the two settings; a full recomputation the profile did not run
  // re-materialises one block during that block's backward.
  constexpr double kMiB = 1024.0 * 1024.0;
  double ratio = 1;
  bool rematerialise = false;
  if (measured.recompute != s.recompute && b.any_block) {
    // Only the blocks recompute: the embedding and the head store the same either way.
    const double then = layer_activation_bytes(m, r.seq, r.micro_batch, r.tp, s.sequence_parallel,
                                               measured.recompute, s.flash_attention, s.precision, s.fp32_residual);
    if (then > 0) ratio = b.block_avg / then;
    rematerialise = s.recompute == Recompute::kFull;
  }
  // ZeRO-2/3 with layer units (FSDP, Megatron, replay): the unit of the layer
  // running is gathered (ZeRO-3), and its fp32 gradient bucket lives until
  // it is reduce-scattered. DeepSpeed's module units stay in states.transient.
  const bool layer_units = s.zero_stage >= 2 && s.accounting != ZeroAccounting::kDeepSpeed &&
                           s.finetune == Finetune::kFull && s.precision != Precision::kFp32;
  const double gathered_b = s.zero_stage >= 3 ? 2 + (s.precision == Precision::kFp8 ? 1 : 0) : 0;
  const double bucket_b = 4 + 2;  // the fp32 bucket and the 16-bit gradient being added into it
  if (layer_units) out->states.transient -= zero_transient;  // counted layer by layer below
  const double vh = static_cast<double>(m.vocab_size) * m.hidden_size;
  const double embedding_unit = vh / tp + (static_cast<double>(m.embedding_params()) - vh);
  const double block_unit = static_cast<double>(m.block_sharded_params()) / tp + m.block_replicated_params();
  // What one micro-batch stores on layers [a, b), and the most beyond it that a layer's forward or
  // backward holds while the layers after it have freed theirs.
  // Sequence parallelism the profiled run did not have (replay's GPT, profiler/gpt.h): the residual
  // stream between the layers of a GPT (a stage, or a chunk) is split over tp, so a layer's stored output
  // (the profile counts each layer's output, the next one's norm input) and a block's residual after
  // attention (the second norm's input) are 1 / tp as large; the inputs of the column-parallel GEMMs are
  // all-gathered and kept whole, as are the GPT's own output (the stage's last layer) and the head's.
  // (Megatron keeps those GEMM inputs sharded too and gathers them again in the backward: the analytic
  // layer_activation_bytes.) Where the plan recomputes differently from the profile, the analytic ratio
  // above is taken alone.
  const bool sp_split =
      s.sequence_parallel && r.tp > 1 && !measured.sequence_parallel && measured.recompute == s.recompute;
  const double residual = static_cast<double>(r.micro_batch) * r.seq * m.hidden_size * (s.fp32_residual ? 4.0 : 2.0);
  const double sp_saved = sp_split ? residual * (1.0 - 1.0 / r.tp) : 0.0;
  auto measured_terms = [&](int a, int e, double* stored, double* peak) {
    double later = 0;
    *stored = *peak = 0;
    for (int l = e - 1; l >= a; --l) {
      const int i = l - r.first_layer;
      const bool block = l > 0 && l < last;
      const int split_tensors = l == last ? 0 : (l + 1 < e ? 1 : 0) + (block ? 1 : 0);
      const double held =
          std::max(0.0, measured.activation_mb[i] * kMiB * measured.scale * (block ? ratio : 1.0) -
                            split_tensors * sp_saved);
      *stored += held;
      double unit_l = block_unit;
      if (l == 0) unit_l = embedding_unit;
      if (l == last)  // the head, or the tied embedding gathered for it on the same stage
        unit_l = (head_has_own_weights(m, r.pp, r.first_layer) ? vh / tp : embedding_unit) + m.norm_params();
      const double running = measured.working_mb[i] * kMiB * measured.scale +
                             (block && rematerialise ? b.one_layer_full : 0.0) +
                             (layer_units ? gathered_b * unit_l : 0.0);
      *peak = std::max(*peak, running - later);
      if (layer_units) *peak = std::max(*peak, (gathered_b + bucket_b) * unit_l - later - held);
      later += held;
    }
  };
  double stored = 0, peak = 0;
  measured_terms(r.first_layer, r.end_layer, &stored, &peak);
  out->activations = stored * r.in_flight / r.virtual_stages;
  out->recompute_workspace = peak;
  if (b.walk) scheduled_peak(m, s, r, last + 1, /*inputs_counted=*/false, measured_terms, out);
}

// Two peaks: the backward's start (the activations, and the 16-bit weight copies in Megatron's accounting,
// which the backward releases) and its end (the gradients, where allocated in the backward). DDP's old
// buckets add to the peaks they are still held at; the rank's peak is the larger (out->states.gradients
// carries the excess).
void add_peak_gradients(const TrainingSetup& s, const RankStates& rs, MemoryBreakdown* out) {
  const double released = out->activations + out->recompute_workspace +
                          (s.accounting == ZeroAccounting::kMegatron ? out->states.weights : 0.0);
  const double old_at_activations = s.ddp.old_at_activation_peak ? rs.ddp_old : 0.0;
  const double old_at_gradients = s.ddp.old_at_gradient_peak ? rs.ddp_old : 0.0;
  if (s.grads_in_backward) {
    // The gradients grow as the backward releases the activations and the copies: the peak is the larger.
    const double at_start = released + old_at_activations, at_end = rs.gradients_allocated + old_at_gradients;
    out->states.gradients += std::max(at_start, at_end) - released - rs.gradients_allocated;
  } else {
    // The gradients persist through both; at the end the activations are gone.
    out->states.gradients += std::max(old_at_activations, old_at_gradients - released);
  }
}

}  // namespace

MemoryBreakdown rank_memory(const ModelShape& m, const TrainingSetup& s, const RankShard& r, const ShardParams& p,
                            const MeasuredActivations* measured) {
  MemoryBreakdown out;
  const RankStates states = add_model_states(m, s, r, p, &out);
  const BlockTerms blocks = block_terms(m, s, r);
  if (measured)
    add_measured_activations(m, s, r, *measured, blocks, states.zero_transient, &out);
  else
    add_analytic_activations(m, s, r, blocks, &out);
  add_peak_gradients(s, states, &out);
  out.framework = s.framework_bytes;
  return out;
}

double recomputed_forward_fraction(const ModelShape& m, Recompute r, long long seq) {
  switch (r) {
    case Recompute::kNone: return 0.0;
    case Recompute::kFull: return 1.0;
    case Recompute::kSelective: {
      const double scores = 4.0 * seq * m.num_heads * m.head_dim;
      return scores / m.block_forward_flops_per_token(seq);
    }
  }
  return 0.0;
}

double reduced_gradient_bytes(const TrainingSetup& s) {
  if (s.precision == Precision::kFp32 || s.finetune != Finetune::kFull) return 4;
  return s.accounting == ZeroAccounting::kMegatron || s.accounting == ZeroAccounting::kFsdp2 ? 4 : 2;
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

const char* to_string(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp8: return "fp8";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

Recompute parse_recompute(const std::string& s, const std::string& where) {
  if (s == "none") return Recompute::kNone;
  if (s == "selective") return Recompute::kSelective;
  if (s == "full") return Recompute::kFull;
  throw InputError(where + ": '" + excerpt(s) + "': expected none, selective or full");
}

Precision parse_precision(const std::string& s, const std::string& where) {
  if (s == "fp32") return Precision::kFp32;
  if (s == "bf16") return Precision::kBf16;
  if (s == "fp8") return Precision::kFp8;
  if (s == "fp16") return Precision::kFp16;
  throw InputError(where + ": '" + excerpt(s) + "': expected fp32, fp16, bf16 or fp8");
}

}  // namespace hetplan
