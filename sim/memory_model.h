// MemoryModel: bytes one rank holds while training, split into weights,
// gradients, optimizer state, activations, transient working sets and a
// framework constant, plus the CPU memory that offloading needs.
//
// Model states follow a named accounting (what each framework keeps per
// parameter; see ZeroAccounting) and the ZeRO stage over the data-parallel
// group. Activations per transformer layer follow Korthikanti et al. 2022,
// "Reducing Activation Recomputation in Large Transformer Models", Sec. 4,
// generalised to GQA, SwiGLU and models without dropout term by term; with
// tp and sequence parallelism, and none / selective / full recomputation.
// A pipeline stage holds the activations of its in-flight micro-batches:
// 1F1B holds min(pp - stage, m), GPipe all m.
#pragma once

#include <string>

#include "sim/dp_overlap.h"
#include "sim/model_shape.h"
#include "sim/offload.h"
#include "sim/runtime_overheads.h"
#include "sim/schedule.h"

namespace hetplan {

enum class Precision { kFp32, kBf16, kFp8, kFp16 };  // kFp16: fp16 AMP with loss scaling (bf16's bytes)
enum class Recompute { kNone, kSelective, kFull };
enum class Finetune { kFull, kLora, kQlora };

// What a framework keeps per parameter in mixed precision (bytes):
//   kZeroPaper:  Rajbhandari et al. 2020 (ZeRO), Sec. 3.1/5: 2 (fp16 weights) + 2 (fp16 grads) + K = 12 (fp32
//                master, momentum, variance); stage 1 partitions K, stage 2 also the grads, stage 3 also weights.
//   kDeepSpeed:  DeepSpeed's memory.rst estimator: 2 (16-bit weights) + 2 (16-bit grads, whole up to stage 2)
//                + 16 (fp32 master, fp32 grads, momentum, variance) partitioned from stage 1; at stage 3 the
//                16-bit grads exist only for the layer being computed.
//   kMegatron:   Megatron-LM (theoretical_memory_usage.py, distributed optimizer): 2 (bf16 weights) + 4 (fp32
//                main_grad) + 12 (fp32 master, Adam states); stage 1 = distributed optimizer.
//   kFsdp2:      PyTorch FSDP2 (fully_shard) over fp32 parameters with MixedPrecisionPolicy(param_dtype 16-bit,
//                reduce_dtype fp32): 4 (the fp32 sharded parameter: it is the master) + 4 (its fp32 sharded
//                gradient, the reduce-scatter's output) + 8 (Adam), all sharded at stage 3. No 16-bit copy
//                persists: the 16-bit weights exist only while a unit is all-gathered (cast from the fp32 shard
//                into the all-gather input). Per unit in the backward: the gathered 16-bit weights and their
//                16-bit unsharded gradient (transient), and that gradient cast to reduce_dtype as the
//                reduce-scatter's input (fp32, allocated in the backward with the gradients)
//                (sim/runtime_overheads.md, FSDP2's memory).
enum class ZeroAccounting { kZeroPaper, kDeepSpeed, kMegatron, kFsdp2 };

// Weight quantisation of a frozen (or compute-only) copy: `bits` per weight
// plus per-block constants, optionally quantised again (QLoRA's double quantisation).
struct QuantSpec {
  double bits = 16;
  double block = 0;            // weights per first-level constant (0: no constants)
  double constant_bits = 0;    // first-level constant size
  double second_block = 0;     // first-level constants per second-level constant (0: none)
  double second_constant_bits = 0;
  double bits_per_param() const;
};
QuantSpec bf16_weights();
// NF4 with double quantisation: Dettmers et al. 2023 (QLoRA), Sec. 3: block 64 with fp32 constants
// quantised to 8 bits in blocks of 256 -> 4 + 8/64 + 32/(64*256) = 4.127 bits.
QuantSpec nf4_double_quant();
// LLM.int8()-style 8-bit weights with one fp32 absmax constant per block of 64 -> 8.5 bits.
QuantSpec int8_blockwise();

struct TrainingSetup {
  Precision precision = Precision::kBf16;
  ZeroAccounting accounting = ZeroAccounting::kZeroPaper;
  int zero_stage = 0;
  bool offload_optimizer = false;  // ZeRO-Offload: master, optimizer and fp32 grads in CPU memory
  bool offload_params = false;     // ZeRO-3 / ZeRO-Infinity: 16-bit weights in CPU memory too
  bool zero_init = true;           // DeepSpeed's zero.Init: the model is built already partitioned
  DeepSpeedBuffers deepspeed;      // DeepSpeed's bucket/prefetch buffers (sim/offload.h); off by default
  DdpBuckets ddp;                  // PyTorch DDP's gradient buckets (sim/runtime_overheads.h); off by default
  // PyTorch's optimizer.zero_grad(set_to_none=True) (its default since 2.0): the gradients are allocated
  // during the backward while the activations (and autocast's weight copies) are released, so the peak
  // holds the larger of the two, not both; rank_memory counts only the gradients beyond them.
  bool grads_in_backward = false;
  // torch.autocast over fp32 parameters: the embedding's output, and so the residual stream (each block's input
  // and both norm inputs), stays fp32; only the GEMM inputs are cast. Stored at 4 bytes, not 2.
  bool fp32_residual = false;
  // The loss as a PyTorch model computes it (Hugging Face's, nanoGPT's): logits.float() then F.cross_entropy
  // (log_softmax, nll_loss), not a fused vocab-parallel loss. At the backward's start three fp32 tensors of the
  // logits' size are live at once: log_softmax's saved output, nll_loss's gradient and log_softmax's gradient.
  bool eager_fp32_loss = false;
  int recompute_every = 1;         // with kFull: only every k-th block is checkpointed (torchtitan's selective
                                   // "every k-th layer" AC); the others keep all activations
  int shard_group = 0;             // ZeRO/FSDP partitions over groups of this many ranks (FSDP HYBRID_SHARD: a
                                   // node), replicated across groups; 0: the whole data-parallel group
  bool adam_8bit = false;          // bitsandbytes 8-bit Adam: m and v in 8 bits, one fp32 absmax per 2048 (2.004 B/param)
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;  // Megatron --sequence-parallel (with tp; sim/sequence_parallel.h)
  // `hetplan replay`'s pipeline sends keep their tensors until the stage's last op (RankRun::run_schedule
  // waits for them then): each micro-batch's output sent on and input gradient sent back stay allocated
  // after its backward, a growing sum over the iteration (RankShard). Megatron waits each send with its
  // op, so they are not counted by default; validation against replay turns it on (simulate --held-sends).
  bool sends_held = false;
  int context_parallel = 1;        // cp: ranks of a ring-attention group, carved from each stage's dp
                                   // (Megatron's order: tp, cp, dp); 1: none (sim/sequence_parallel.h)
  CommOverlap overlap;             // bucketed data-parallel communication during compute (sim/dp_overlap.h)
  bool flash_attention = false;  // the a*s^2 terms are never stored (as selective recomputation)
  Finetune finetune = Finetune::kFull;
  int lora_rank = 16;
  unsigned lora_targets = kTargetQ | kTargetV;
  QuantSpec base_weights = bf16_weights();  // frozen base for LoRA/QLoRA, or the compute copy
  double framework_bytes = 0;               // CUDA context, allocator and library workspaces
                                            // (PlanSimulator: < 0 takes the profiles' framework_mb)
  double cpu_buffer_factor = 1.5;           // DeepSpeed's additional_buffer_factor
};

// What one rank holds: Metis layers [first_layer, end_layer) at (tp, dp), as
// stage `stage` of `pp`, micro-batches of `micro_batch` sequences of `seq` tokens.
// With the schedule known (`microbatches` > 0: `schedule` over that many micro-batches,
// `virtual_stages` v chunks per stage), the activations are those of the stage's op
// order at its worst moment (for_each_backward, sim/schedule.h): each chunk
// (chunk_layers: the embedding with chunk 0, the head with chunk v - 1, uneven block
// counts) times its own micro-batches live there, plus the stage-boundary tensors replay
// keeps: the input received for each live micro-batch of a chunk that does not start the
// model (measured profiles count each layer's output, not that input; the analytic terms
// count a block's input, so there it is in them already), and, with
// TrainingSetup::sends_held, every boundary tensor sent so far whose micro-batch has been
// backwarded on that chunk (replay waits for its sends when the stage's ops end, and a
// send keeps its tensor until then). A one-chunk stage's walk is taken in closed form
// (one_chunk_backwards: the steady backwards bisected, the cool-down's walked), O(pp log m)
// rather than O(m), with the same values.
// `microbatches` 0 (whatif, a caller without a schedule): `in_flight` alike (micro-batch,
// chunk) pairs, each 1 / v of the layers' activations, and no boundary tensors.
struct RankShard {
  int first_layer = 0, end_layer = 0;
  int tp = 1, dp = 1, pp = 1, stage = 0;
  long long micro_batch = 1, seq = 1024;
  int in_flight = 1;
  int virtual_stages = 1;
  Schedule schedule = Schedule::k1F1B;
  int microbatches = 0;  // > 0: the schedule above runs this many (REQUIRES: StageOps' preconditions)
  int gpus_per_node = 8;  // for the CPU memory of offloading and model loading
};

struct ModelStateBytes {
  double weights = 0, gradients = 0, optimizer = 0;
  double transient = 0;  // gathered ZeRO-3 layer, dequantised QLoRA weight
  double cpu_per_node = 0;
  double total_gpu() const { return weights + gradients + optimizer + transient; }
};

struct MemoryBreakdown {
  ModelStateBytes states;
  double activations = 0;          // in-flight micro-batches
  double recompute_workspace = 0;  // one layer's full activations while it is recomputed, or (measured
                                   // activations) the most a layer's forward or backward holds beyond them
  double framework = 0;
  // What a running rank holds beyond the allocator's peak (sim/device_memory.h; 0 where the caller
  // does not price them, as whatif): NCCL's communicators and the caching allocator's reserve.
  double nccl = 0;
  double allocator_reserve = 0;
  // The peak the caching allocator sees: the model states plus the
  // activations and working set of the forward/backward phase.
  double allocated_peak() const { return states.total_gpu() + activations + recompute_workspace; }
  // The device memory in use: what a search's plan must fit (with the headroom) and what replay
  // measures as device_used_mb.
  double gpu_total() const { return allocated_peak() + allocator_reserve + framework + nccl; }
  double cpu_per_node() const { return states.cpu_per_node; }
};

// Activations of a rank's layers as `hetplan profile` measured them on its
// GPU type, at its tp and micro-batch size (execution_memory.layer_activation_mb
// and layer_working_mb): per Metis layer, for one micro-batch of the profiled
// size, the MiB its forward stores until its backward and the most its forward
// or backward holds beyond what is stored at that moment. rank_memory takes
// them in place of the analytic terms, scaled by `scale` (the rank's share of
// the micro-batch over the profiled one), and by the analytic ratio when the
// plan recomputes differently from the profiled run. The rank's peak is then
// found layer by layer: what one layer holds while it runs (its working set,
// a re-materialised block under full recomputation, the ZeRO-3 unit gathered
// for it), or while its ZeRO-2/3 gradient bucket is reduce-scattered, over the
// activations the micro-batch still stores at that moment.
// Plain data: the arrays point into the ProfileSet and must outlive the call;
// indexed by the rank's Metis layers [first_layer, end_layer).
struct MeasuredActivations {
  const double* activation_mb = nullptr;
  const double* working_mb = nullptr;
  double scale = 1;
  Recompute recompute = Recompute::kNone;  // how the profiled run recomputed
  // Whether the profiled run split the sequence over tp (`hetplan profile` never does). A plan with
  // sequence parallelism over a profile without it stores 1 / tp of the residual-stream tensors the
  // layers keep (rank_memory; sim/sequence_parallel.md, "Memory").
  bool sequence_parallel = false;
};

// Model states of a rank whose model-parallel shard has `trainable` trainable
// parameters and `frozen_weight_bytes` of frozen weights, with ZeRO over `dp`
// ranks. `largest_module` is the largest single module's parameter count (the
// ZeRO-3 gather unit). CPU memory follows DeepSpeed's memory.rst rules.
ModelStateBytes model_state_bytes(double trainable, double frozen_weight_bytes, double largest_module,
                                  const TrainingSetup& setup, int dp, int gpus_per_node);

// Bytes of activations one transformer layer keeps for one micro-batch of b
// sequences of s tokens (the terms of Korthikanti et al. 2022, Sec. 4.1).
// `fp32_residual`: TrainingSetup::fp32_residual (the norm inputs, and a fully recomputed block's stored input,
// at 4 bytes).
double layer_activation_bytes(const ModelShape& m, long long s, long long b, int tp, bool sequence_parallel,
                              Recompute recompute, bool flash_attention, Precision precision,
                              bool fp32_residual = false);
// The embedding stage's extra bytes per micro-batch (token ids, embedding dropout mask).
double embedding_activation_bytes(const ModelShape& m, long long s, long long b, int tp, bool sequence_parallel);
// The head stage's extra bytes per micro-batch (final norm and LM head inputs, fp32 logits: one copy for a fused
// loss, three for TrainingSetup::eager_fp32_loss). `fp32_residual`: the final norm's input at 4 bytes.
double head_activation_bytes(const ModelShape& m, long long s, long long b, int tp, bool sequence_parallel,
                             bool fp32_residual = false, bool eager_fp32_loss = false);

// Parameters of Metis layers [first, end): split by tp where Megatron splits
// them, and the LoRA adapters of those layers.
struct ShardParams {
  double sharded = 0, replicated = 0;  // before the tp split
  double linear_weights = 0;           // of `sharded`, the block projections (what LoRA freezes and QLoRA quantises)
  double lora = 0;                     // adapter parameters (before the tp split)
  double largest_module = 0;
  // The largest Metis layer's parameters (before the tp split): FSDP's and
  // replay's ZeRO unit (one transformer block, or the embedding or head).
  double largest_layer = 0;
  double on_rank(int tp) const { return sharded / tp + replicated; }
};
ShardParams shard_params(const ModelShape& m, int first, int end, int pp, const TrainingSetup& setup);

MemoryBreakdown rank_memory(const ModelShape& m, const TrainingSetup& setup, const RankShard& shard);
// The same, given shard_params(m, shard.first_layer, shard.end_layer, shard.pp, setup) (the cost path
// computes it once per stage and setting).
MemoryBreakdown rank_memory(const ModelShape& m, const TrainingSetup& setup, const RankShard& shard,
                            const ShardParams& params, const MeasuredActivations* measured = nullptr);

// The share of a transformer block's forward FLOPs that recomputation runs
// again during the backward: all of it for full recomputation, the attention
// scores and their softmax (QK^T and AV, 4 s a d FLOPs per token) for
// selective (Korthikanti et al. 2022, Sec. 5), nothing without. The embedding
// and the head are never recomputed.
double recomputed_forward_fraction(const ModelShape& m, Recompute r, long long seq);

// Bytes per trainable parameter of the gradient the data-parallel group
// reduces: the fp32 main gradient where the setup keeps one (Megatron's
// accounting, fp32 training, fp32 LoRA adapters), FSDP2's reduce_dtype fp32
// (kFsdp2), else the 16-bit gradient.
double reduced_gradient_bytes(const TrainingSetup& s);

const char* to_string(Recompute r);
const char* to_string(Precision p);
// Parses "none|selective|full" and "fp32|fp16|bf16|fp8"; throws InputError naming `where`.
Recompute parse_recompute(const std::string& s, const std::string& where);
Precision parse_precision(const std::string& s, const std::string& where);

}  // namespace hetplan
