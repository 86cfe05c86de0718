// MemoryModel: ZeRO model states, Korthikanti et al.'s activation formulas,
// in-flight micro-batch counts, and published estimator outputs (DeepSpeed's
// memory.rst examples, Megatron-LM's theoretical memory) within 2%.
#include <catch2/catch.hpp>
#include <cmath>

#include "base/input_error.h"
#include "sim/memory_model.h"

using namespace hetplan;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Relative error of `got` against a published `want`.
double rel(double got, double want) { return std::abs(got - want) / want; }

}  // namespace

// Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", Figure 1: Psi = 7.5B parameters, N_d = 64, K = 12:
// baseline (2 + 2 + K) Psi = 120 GB; P_os 4 Psi + K Psi / N_d = 31.4 GB;
// P_os+g 2 Psi + (2 + K) Psi / N_d = 16.6 GB; P_os+g+p (2 + 2 + K) Psi / N_d = 1.9 GB.
TEST_CASE("ZeRO stages follow the ZeRO paper's formulas", "[memory]") {
  TrainingSetup s;
  s.accounting = ZeroAccounting::kZeroPaper;
  const double psi = 7.5e9;
  auto gpu = [&](int stage) {
    s.zero_stage = stage;
    return model_state_bytes(psi, 0, /*largest_module=*/0, s, 64, 8).total_gpu();
  };
  CHECK(gpu(0) == Approx(120e9).epsilon(1e-12));
  CHECK(gpu(1) == Approx(31.40625e9).epsilon(1e-12));
  CHECK(gpu(2) == Approx(16.640625e9).epsilon(1e-12));
  CHECK(gpu(3) == Approx(1.875e9).epsilon(1e-12));
  // Figure 1 rounds these to one decimal.
  CHECK(std::round(gpu(1) / 1e8) / 10 == Approx(31.4));
  CHECK(std::round(gpu(2) / 1e8) / 10 == Approx(16.6));
  CHECK(std::round(gpu(3) / 1e8) / 10 == Approx(1.9));
  // Stage 3 adds the gathered module: 16-bit weights and gradients (4 bytes per parameter).
  s.zero_stage = 3;
  CHECK(model_state_bytes(psi, 0, 1e6, s, 64, 8).transient == Approx(4e6));
}

// DeepSpeed, docs/code-docs/source/memory.rst (deepspeed.readthedocs.io/en/latest/memory.html),
// "estimate_zero2_model_states_mem_needs_all_cold(total_params=2851e6, num_gpus_per_node=8, num_nodes=1)":
//     per CPU  |  per GPU |   Options
//     127.45GB |   5.31GB | offload_optimizer=cpu
//     127.45GB |  15.93GB | offload_optimizer=none
// (the _all_live example for t5-3b prints 127.48 / 5.31 / 15.93; its model has a few more parameters).
TEST_CASE("DeepSpeed ZeRO-2 estimator outputs within 2%", "[memory][published]") {
  TrainingSetup s;
  s.accounting = ZeroAccounting::kDeepSpeed;
  s.zero_stage = 2;
  s.offload_optimizer = true;
  ModelStateBytes m = model_state_bytes(2851e6, 0, 32e6, s, 8, 8);
  CHECK(rel(m.total_gpu() / kGiB, 5.31) < 0.02);
  CHECK(rel(m.cpu_per_node / kGiB, 127.45) < 0.02);
  s.offload_optimizer = false;
  m = model_state_bytes(2851e6, 0, 32e6, s, 8, 8);
  CHECK(rel(m.total_gpu() / kGiB, 15.93) < 0.02);
  CHECK(rel(m.cpu_per_node / kGiB, 127.45) < 0.02);
  // The same numbers at the doc's rounding: 6 Psi bytes = 15.93 GiB.
  CHECK(std::round(m.total_gpu() / kGiB * 100) / 100 == Approx(15.93));
}

// Same page, "estimate_zero3_model_states_mem_needs_all_cold(total_params=2851e6, largest_layer_params=32e6,
// num_gpus_per_node=8, num_nodes=1)":
//      71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
//     127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
//      63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1
//     127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0
//       1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1
//     127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0
TEST_CASE("DeepSpeed ZeRO-3 estimator outputs within 2%", "[memory][published]") {
  struct Row {
    bool offload_param, offload_optimizer, zero_init;
    double cpu_gb, gpu_gb;
  };
  const Row rows[] = {{true, true, true, 71.69, 0.12},    {true, true, false, 127.45, 0.12},
                      {false, true, true, 63.72, 0.78},   {false, true, false, 127.45, 0.78},
                      {false, false, true, 1.43, 6.09},   {false, false, false, 127.45, 6.09}};
  for (const Row& r : rows) {
    TrainingSetup s;
    s.accounting = ZeroAccounting::kDeepSpeed;
    s.zero_stage = 3;
    s.offload_params = r.offload_param;
    s.offload_optimizer = r.offload_optimizer;
    s.zero_init = r.zero_init;
    const ModelStateBytes m = model_state_bytes(2851e6, 0, 32e6, s, 8, 8);
    INFO("offload_param " << r.offload_param << " offload_optimizer " << r.offload_optimizer << " zero_init "
                          << r.zero_init);
    CHECK(rel(m.total_gpu() / kGiB, r.gpu_gb) < 0.02);
    CHECK(rel(m.cpu_per_node / kGiB, r.cpu_gb) < 0.02);
  }
}

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models", Table 2 (bytes of activations per transformer layer):
//   no parallelism                     sbh (34 + 5 a s / h)
//   tensor parallel (baseline)         sbh (10 + 24 / t + 5 a s / (h t))
//   tensor + sequence parallel         sbh / t (34 + 5 a s / h)
//   tensor parallel + selective        sbh (10 + 24 / t)
//   tensor + sequence + selective      sbh 34 / t
//   full recomputation                 2 sbh  (Sec. 4.3; 2 sbh / t with sequence parallelism)
// with the GPT-3 175B row of their Table 3: a = 96, h = 12288, s = 2048, t = 8.
TEST_CASE("Korthikanti activation formulas", "[memory]") {
  const ModelShape m = gpt2_shape(51200, 12288, 96, 96, 2048);
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8;
  const double sbh = s * b * h;
  auto act = [&](int tp, bool sp, Recompute r) {
    return layer_activation_bytes(m, 2048, 1, tp, sp, r, false, Precision::kBf16);
  };
  CHECK(act(1, false, Recompute::kNone) == Approx(sbh * (34 + 5 * a * s / h)).epsilon(1e-12));
  CHECK(act(8, false, Recompute::kNone) == Approx(sbh * (10 + 24 / t + 5 * a * s / (h * t))).epsilon(1e-12));
  CHECK(act(8, true, Recompute::kNone) == Approx(sbh / t * (34 + 5 * a * s / h)).epsilon(1e-12));
  CHECK(act(8, false, Recompute::kSelective) == Approx(sbh * (10 + 24 / t)).epsilon(1e-12));
  CHECK(act(8, true, Recompute::kSelective) == Approx(sbh * 34 / t).epsilon(1e-12));
  CHECK(act(1, false, Recompute::kFull) == Approx(2 * sbh).epsilon(1e-12));
  CHECK(act(8, true, Recompute::kFull) == Approx(2 * sbh / t).epsilon(1e-12));
  // Sec. 4.2: for GPT-3, 5as/h = 80, so selective recomputation removes 80/(34+80) = 70% of the activations.
  CHECK(5 * a * s / h == Approx(80));
  CHECK(1 - act(1, false, Recompute::kSelective) / act(1, false, Recompute::kNone) == Approx(80.0 / 114));
  // Flash attention stores no a s^2 terms, as selective recomputation.
  CHECK(layer_activation_bytes(m, 2048, 1, 8, true, Recompute::kNone, true, Precision::kBf16) ==
        Approx(act(8, true, Recompute::kSelective)));
}

TEST_CASE("activations of GQA, SwiGLU models without dropout, term by term", "[memory]") {
  // Llama-3.1-8B: h 4096, 32 heads, 8 KV heads of 128, f 14336, no dropout.
  const ModelShape m = llama_shape(128256, 4096, 32, 32, 8, 14336, false, 131072);
  const double s = 4096, b = 1, h = 4096, kv = 1024, f = 14336, a = 32;
  // Norm inputs 4sbh, GEMM inputs 2sbh + 2sbh; Q 2sbh, K 2sb kv, V 2sb kv, o-proj input 2sbh;
  // gate, silu(gate), up, product 8sbf; softmax output 2 a s^2 b (no dropout masks).
  const double want = s * b * (4 * h + 4 * h + 2 * h + 2 * kv + 2 * kv + 2 * h + 8 * f) + 2 * a * s * s * b;
  CHECK(layer_activation_bytes(m, 4096, 1, 1, false, Recompute::kNone, false, Precision::kBf16) ==
        Approx(want).epsilon(1e-12));
}

TEST_CASE("in-flight micro-batches: 1F1B holds pp - stage, GPipe all", "[memory]") {
  // Narayanan et al. 2021 (Megatron-LM, SC21), Sec. 2.2.1: 1F1B limits in-flight micro-batches to the
  // pipeline depth p; GPipe keeps all m.
  CHECK(in_flight_microbatches(Schedule::k1F1B, 4, 0, 8) == 4);
  CHECK(in_flight_microbatches(Schedule::k1F1B, 4, 1, 8) == 3);
  CHECK(in_flight_microbatches(Schedule::k1F1B, 4, 3, 8) == 1);
  CHECK(in_flight_microbatches(Schedule::k1F1B, 4, 0, 2) == 2);  // fewer micro-batches than stages
  CHECK(in_flight_microbatches(Schedule::kGpipe, 4, 0, 8) == 8);
  CHECK(in_flight_microbatches(Schedule::kGpipe, 4, 3, 8) == 8);
}

// Korthikanti et al. (arXiv 2205.05198), Figure 1: parameters and optimizer state per GPU of the four models of their
// Table 5, as the Calculon authors transcribe it (calculon-ai/calculon calculon/llm/validation.py, seqsel_fig1
// 'par_opt', GiB): 22B 45.5625, 175B 45.5625, 530B 31.640625, 1T 32.958984375. Each is exactly 18 bytes per
// parameter of the blocks' 12 h^2 L / (tp pp) on a GPU (tp 8): 16-bit parameters with fp32 gradients, Megatron-LM's
// count (docs/distrib_optimizer.md, 2022-05-16; 20 with 16-bit gradients). hetplan's Megatron accounting gives the
// same to the byte; the ZeRO paper's (16-bit gradients, 16 B) does not. scripts/published_configs.py reads the runs'
// gradient precision from this figure (gradient accumulation fusion on: sim/layer_kernels.md).
TEST_CASE("Megatron accounting reproduces Korthikanti et al.'s Figure 1 (18 bytes per parameter)", "[memory][published]") {
  struct Row {
    double h;
    int layers, pp;
    double gib;
  };
  const Row rows[] = {{6144, 48, 1, 45.5625}, {12288, 96, 8, 45.5625}, {20480, 105, 35, 31.640625},
                      {25600, 128, 64, 32.958984375}};
  TrainingSetup megatron;
  megatron.precision = Precision::kFp16;
  megatron.accounting = ZeroAccounting::kMegatron;
  TrainingSetup zero_paper = megatron;
  zero_paper.accounting = ZeroAccounting::kZeroPaper;
  for (const Row& r : rows) {
    const double params = 12 * r.h * r.h * r.layers / (8 * r.pp);
    CHECK(model_state_bytes(params, 0, 0, megatron, 1, 8).total_gpu() == Approx(r.gib * kGiB).epsilon(1e-12));
    CHECK(model_state_bytes(params, 0, 0, zero_paper, 1, 8).total_gpu() == Approx(r.gib * kGiB * 16 / 18).epsilon(1e-12));
  }
}

// Megatron-LM, megatron/training/theoretical_memory_usage.py (NVIDIA/Megatron-LM @ d98e8a6):
// weights + optimizer = params on the most loaded shard x (6 + 12 / dp) with the distributed optimizer
// (18 without); activations (sequence parallel + selective) = sbh (18 + 4 f / h) per layer x num_layers
// (the first stage holds pp micro-batches of L/pp layers) + 8 sbp (token ids) + sbhp (embedding dropout),
// x min(1, m / pp), + 4 sbh (1 + V / h) when pp = 1, all / tp. Evaluated by hand for two configurations:
//  A: L 32, h 4096, a 32, f 16384, s 2048, b 1, V 51200, tp 2, pp 4, dp 4, distributed optimizer, m 8:
//     weights (12h^2 * 8 + hV) / 2 + (4h * 32 + 2h) / 4 = 910,297,088 params x 9 B = 8,192,673,792 B;
//     activations (34 sbh * 32 + 8 sb * 4 + sbh * 4) / 2 = 4,580,212,736 B; total 12,772,886,528 B.
//  B: L 24, h 2048, a 16, f 8192, s 2048, b 2, V 50304, tp 4, pp 1, dp 2, no distributed optimizer, m 4:
//     weights 5,903,032,320 B (18 B per parameter); activations 1,927,815,168 B; total 7,830,847,488 B.
TEST_CASE("Megatron theoretical memory within 2%", "[memory][published]") {
  TrainingSetup s;
  s.accounting = ZeroAccounting::kMegatron;
  s.sequence_parallel = true;
  s.recompute = Recompute::kSelective;
  {
    const ModelShape m = gpt2_shape(51200, 4096, 32, 32, 2048);
    s.zero_stage = 1;  // distributed optimizer
    RankShard r;
    r.first_layer = 0;
    r.end_layer = 9;  // embedding + 8 of 32 blocks: stage 0 of 4
    r.tp = 2, r.dp = 4, r.pp = 4, r.stage = 0, r.micro_batch = 1, r.seq = 2048;
    r.in_flight = in_flight_microbatches(Schedule::k1F1B, 4, 0, 8);
    const MemoryBreakdown mem = rank_memory(m, s, r);
    CHECK(rel(mem.states.total_gpu(), 8'192'673'792.0) < 0.02);
    CHECK(rel(mem.activations, 4'580'212'736.0) < 0.02);
    CHECK(rel(mem.gpu_total(), 12'772'886'528.0) < 0.02);
  }
  {
    const ModelShape m = gpt2_shape(50304, 2048, 24, 16, 2048);
    s.zero_stage = 0;
    RankShard r;
    r.first_layer = 0;
    r.end_layer = 26;
    r.tp = 4, r.dp = 2, r.pp = 1, r.stage = 0, r.micro_batch = 2, r.seq = 2048;
    r.in_flight = in_flight_microbatches(Schedule::k1F1B, 1, 0, 4);
    const MemoryBreakdown mem = rank_memory(m, s, r);
    CHECK(rel(mem.states.total_gpu(), 5'903'032'320.0) < 0.02);
    CHECK(rel(mem.activations, 1'927'815'168.0) < 0.02);
    CHECK(rel(mem.gpu_total(), 7'830'847'488.0) < 0.02);
  }
}

TEST_CASE("LoRA and QLoRA hold a frozen base and small trainable adapters", "[memory]") {
  const ModelShape m = llama_shape(32000, 4096, 32, 32, 32, 11008, false, 4096);  // Llama-2-7B
  RankShard r;
  r.end_layer = m.metis_num_layers();
  r.seq = 512;
  TrainingSetup full;
  TrainingSetup lora;
  lora.finetune = Finetune::kLora;
  lora.lora_rank = 16;
  lora.lora_targets = kTargetQ | kTargetV;
  TrainingSetup qlora = lora;
  qlora.finetune = Finetune::kQlora;
  qlora.base_weights = nf4_double_quant();

  // Adapters: r (in + out) per adapted projection: 16 * (4096 + 4096) * 2 per layer * 32 layers = 8,388,608
  // (the "trainable params: 4,194,304" PEFT prints for r=8 on q,v of Llama-2-7B doubles at r=16).
  const ShardParams p = shard_params(m, 0, r.end_layer, 1, lora);
  CHECK(p.lora == 8'388'608.0);
  const MemoryBreakdown ml = rank_memory(m, lora, r);
  CHECK(ml.states.gradients == Approx(4 * 8'388'608.0));
  CHECK(ml.states.optimizer == Approx(8 * 8'388'608.0));
  // bf16 base: every parameter at 2 bytes, plus fp32 adapters.
  CHECK(ml.states.weights == Approx(2.0 * 6'738'415'616 + 4 * 8'388'608.0));

  // QLoRA: projections at 4.127 bits (Dettmers et al. 2023, Sec. 3: 4 + 0.127 bits with double quantisation),
  // embeddings, norms and head in bf16.
  CHECK(nf4_double_quant().bits_per_param() == Approx(4.0 + 8.0 / 64 + 32.0 / (64 * 256)));
  CHECK(nf4_double_quant().bits_per_param() == Approx(4.127).epsilon(1e-3));
  const MemoryBreakdown mq = rank_memory(m, qlora, r);
  const double linear = 32.0 * (4 * 4096.0 * 4096 + 3 * 4096.0 * 11008);
  const double other = 6'738'415'616.0 - linear;
  CHECK(mq.states.weights == Approx(linear * nf4_double_quant().bits_per_param() / 8 + other * 2 + 4 * 8'388'608.0));
  CHECK(mq.states.total_gpu() < ml.states.total_gpu() / 2.5);
  // Full fine-tuning needs far more than either.
  CHECK(rank_memory(m, full, r).states.total_gpu() > 10 * mq.states.total_gpu());
}

TEST_CASE("offload moves optimizer state to CPU and full recomputation keeps 2sbh per layer", "[memory]") {
  const ModelShape m = gpt2_shape(50257, 1600, 48, 25, 1024);
  TrainingSetup s;
  s.zero_stage = 2;
  RankShard r;
  r.end_layer = m.metis_num_layers();
  r.dp = 8;
  r.gpus_per_node = 2;  // CPU: max(4 x 2, 16) bytes per parameter offloaded vs 4 x 2 to build the model
  const MemoryBreakdown on = rank_memory(m, s, r);
  s.offload_optimizer = true;
  const MemoryBreakdown off = rank_memory(m, s, r);
  CHECK(off.states.optimizer == 0);
  CHECK(off.states.weights == on.states.weights);
  CHECK(off.cpu_per_node() > on.cpu_per_node());
  s.recompute = Recompute::kFull;
  const MemoryBreakdown full = rank_memory(m, s, r);
  const double blocks = 48 * 2.0 * 1024 * 1600;
  CHECK(full.activations == Approx(blocks + embedding_activation_bytes(m, 1024, 1, 1, false) +
                                   head_activation_bytes(m, 1024, 1, 1, false)));
  CHECK(full.recompute_workspace ==
        Approx(layer_activation_bytes(m, 1024, 1, 1, false, Recompute::kNone, false, Precision::kBf16)));
  s.framework_bytes = 1e9;
  CHECK(rank_memory(m, s, r).gpu_total() == Approx(full.gpu_total() + 1e9));
  CHECK_THROWS_AS(parse_recompute("some", "--recompute"), InputError);
}

// torch.autocast over fp32 parameters (TrainingSetup::fp32_residual): the embedding's output is fp32, so the
// residual stream is; each block keeps its two norm inputs at 4 bytes instead of 2 (+4 sbh over the bf16
// block), and a fully recomputed block keeps its fp32 input (4 sbh instead of 2 sbh). GPT-2 1.3B shape of
// scripts/gpu_whatif_validate.py, fused attention, no dropout: 36 sbh against 32 sbh.
TEST_CASE("autocast's fp32 residual stream: norm inputs and checkpointed inputs at 4 bytes", "[memory][whatif]") {
  ModelShape m = gpt2_shape(50304, 2048, 24, 16, 2048);
  m.dropout = false;
  const double sbh = 2048.0 * 4 * 2048;
  auto act = [&](Recompute r, bool fp32) {
    return layer_activation_bytes(m, 2048, 4, 1, false, r, true, Precision::kBf16, fp32);
  };
  // bf16 block (fused attention): norm inputs 4, GEMM inputs 4, q k v 6, proj input 2, GELU in/out 16.
  CHECK(act(Recompute::kNone, false) == Approx(32 * sbh).epsilon(1e-12));
  CHECK(act(Recompute::kNone, true) == Approx(36 * sbh).epsilon(1e-12));
  CHECK(act(Recompute::kFull, false) == Approx(2 * sbh).epsilon(1e-12));
  CHECK(act(Recompute::kFull, true) == Approx(4 * sbh).epsilon(1e-12));
  // The head's final-norm input too.
  const double sb = 2048.0 * 4, V = 50304;
  CHECK(head_activation_bytes(m, 2048, 4, 1, false) == Approx(4 * sb * 2048 + 4 * sb * V).epsilon(1e-12));
  CHECK(head_activation_bytes(m, 2048, 4, 1, false, true) == Approx(6 * sb * 2048 + 4 * sb * V).epsilon(1e-12));
}

// logits.float() + F.cross_entropy (TrainingSetup::eager_fp32_loss): at the backward's start log_softmax's saved
// fp32 output, nll_loss's fp32 gradient and log_softmax's gradient are live together: 12 sbV bytes, split by
// a vocab-parallel head, against a fused loss's single fp32 copy (4 sbV).
TEST_CASE("eager fp32 cross-entropy keeps three fp32 copies of the logits", "[memory][whatif]") {
  ModelShape m = gpt2_shape(50304, 2048, 24, 16, 2048);
  const double sb = 2048.0 * 2, V = 50304, h = 2048;
  CHECK(head_activation_bytes(m, 2048, 2, 1, false, false, true) == Approx(4 * sb * h + 12 * sb * V).epsilon(1e-12));
  CHECK(head_activation_bytes(m, 2048, 2, 2, false, false, true) == Approx(4 * sb * h + 6 * sb * V).epsilon(1e-12));
  // Through rank_memory: one rank holding the whole model, the head's share of the activations.
  TrainingSetup s;
  s.flash_attention = true;
  RankShard r;
  r.first_layer = 0;
  r.end_layer = m.metis_num_layers();
  r.micro_batch = 2;
  r.seq = 2048;
  const double fused = rank_memory(m, s, r).activations;
  s.eager_fp32_loss = true;
  CHECK(rank_memory(m, s, r).activations - fused == Approx(8 * sb * V).epsilon(1e-9));
}

// PyTorch FSDP2 (fully_shard) over fp32 parameters with MixedPrecisionPolicy(param_dtype bf16, reduce_dtype fp32),
// as torch/distributed/fsdp/_fully_shard documents it: the sharded parameter stays fp32 (it is what the optimizer
// updates: no separate master), the 16-bit weights exist only in the all-gather of a unit, the gradient is
// reduce-scattered in reduce_dtype into an fp32 sharded gradient. Per parameter over dp 2: fp32 shard 4/2, Adam
// 8/2, fp32 gradient 4/2; no 16-bit copy. A unit in its backward: gathered 16-bit weights and 16-bit gradient
// (2 + 2 per unit parameter, transient), and that gradient cast to fp32 as the reduce-scatter's input (4 per
// unit parameter, allocated in the backward with the gradients).
TEST_CASE("FSDP2 accounting: fp32 shards and gradients, no 16-bit copy, an fp32 reduce-scatter input",
          "[memory][whatif]") {
  TrainingSetup s;
  s.zero_stage = 3;
  s.accounting = ZeroAccounting::kFsdp2;
  const double psi = 1e9, unit = 1e8;
  const ModelStateBytes f = model_state_bytes(psi, 0, unit, s, 2, 8);
  CHECK(f.weights == Approx(4 * psi / 2));
  CHECK(f.optimizer == Approx(8 * psi / 2));
  CHECK(f.gradients == Approx(4 * psi / 2 + 4 * unit));
  CHECK(f.transient == Approx((2 + 2) * unit));
  CHECK(reduced_gradient_bytes(s) == 4);  // the reduce-scatter runs in fp32
  // The ZeRO paper's accounting of the same stage keeps a 16-bit weight shard and 16-bit gradients besides the
  // fp32 master: the same 16 bytes per parameter, but 2 more of them persist through the backward.
  s.accounting = ZeroAccounting::kZeroPaper;
  const ModelStateBytes z = model_state_bytes(psi, 0, unit, s, 2, 8);
  CHECK(z.weights + z.optimizer - (f.weights + f.optimizer) == Approx(2 * psi / 2));
  CHECK(reduced_gradient_bytes(s) == 2);
}

// A stage's activations at the worst moment of its op order (RankShard with `microbatches`): each chunk's
// store times its own live micro-batches (for_each_backward), the input received for each, and (replay's
// held sends, TrainingSetup::sends_held) the boundary tensors its sends keep until the stage's ops end. A GPT of 10 blocks (hidden 2560, micro-batch 2 of
// 2048 tokens: one boundary tensor X = 2 * 2048 * 2560 * 2 B = 20 MiB) at pp 4, stages [0,3) [3,6) [6,9)
// [9,12); measured stores (MiB): embedding 20, block 300, head 800; working sets 50, 40, 1500.
TEST_CASE("interleaved and 1F1B activations follow the op order chunk by chunk", "[memory][interleaved]") {
  constexpr double kMiB = 1024.0 * 1024.0;
  const ModelShape m = gpt2_shape(50304, 2560, 10, 20, 2048);
  REQUIRE(m.metis_num_layers() == 12);
  std::vector<double> stored(12, 300.0), working(12, 40.0);
  stored[0] = 20, working[0] = 50, stored[11] = 800, working[11] = 1500;
  TrainingSetup s;
  s.sends_held = true;  // as replay runs it (the figures of suite34-h100x4-run1's pp 4 rows)
  auto activations = [&](Schedule schedule, int v, int stage, int microbatches, double* workspace) {
    const int partition[] = {0, 3, 6, 9, 12};
    RankShard r;
    r.first_layer = partition[stage];
    r.end_layer = partition[stage + 1];
    r.pp = 4, r.stage = stage, r.micro_batch = 2, r.seq = 2048;
    r.schedule = schedule;
    r.virtual_stages = v;
    r.in_flight = in_flight_microbatches(schedule, 4, stage, 8, v);
    r.microbatches = microbatches;
    MeasuredActivations ma;
    ma.activation_mb = stored.data() + r.first_layer;
    ma.working_mb = working.data() + r.first_layer;
    const MemoryBreakdown b = rank_memory(m, s, r, shard_params(m, r.first_layer, r.end_layer, 4, s), &ma);
    *workspace = b.recompute_workspace / kMiB;
    return b.activations / kMiB;
  };
  double ws = 0;
  // Interleaved, rank 1: chunk 0 holds 2 blocks (620 MiB with its input), chunk 1 one (320). The worst
  // moment is its fifth backward (chunk 0): 8 micro-batches live on chunk 0, 1 on chunk 1, and chunk 1's
  // four backwarded micro-batches each keep their sent output and input gradient:
  // 8 * 620 + 320 + 4 * 40 = 5440, with a block's 40 working.
  CHECK(activations(Schedule::kInterleaved1F1B, 2, 1, 8, &ws) == Approx(5440).epsilon(1e-9));
  CHECK(ws == Approx(40));
  // (The uniform rule: 9 pairs of half the stage's 900 MiB = 4050.)
  CHECK(activations(Schedule::kInterleaved1F1B, 2, 1, 0, &ws) == Approx(4050).epsilon(1e-9));
  // Rank 3: chunk 0 one block (320 with its input), chunk 1 a block and the head (1120), whose backward
  // holds 1500 more. Worst: its twelfth backward (chunk 1), 4 live on chunk 0 and 1 on chunk 1, after 7
  // backwards on chunk 1 (each keeps its input gradient: 20) and 4 on chunk 0 (output and gradient: 40):
  // 4 * 320 + 1120 + 140 + 160 = 2700, and the head's 1500.
  CHECK(activations(Schedule::kInterleaved1F1B, 2, 3, 8, &ws) == Approx(2700).epsilon(1e-9));
  CHECK(ws == Approx(1500));
  // Rank 0: chunk 0 the embedding and a block (320, no input received; it sends its output only: 20 kept),
  // chunk 1 a block (320 with its input; 40 kept). Worst: its sixth backward (chunk 0): 7 and 4 live,
  // after 4 backwards on chunk 1 and 1 on chunk 0: 11 * 320 + 160 + 20 = 3700.
  CHECK(activations(Schedule::kInterleaved1F1B, 2, 0, 8, &ws) == Approx(3700).epsilon(1e-9));
  // 1F1B, rank 1: 3 live (900 + its 20 input each) until the sixth backward, after 5 backwarded keeping 40:
  // 2760 + 200 = 2960 (the count alone: 3 * 900 = 2700).
  CHECK(activations(Schedule::k1F1B, 1, 1, 8, &ws) == Approx(2960).epsilon(1e-9));
  CHECK(activations(Schedule::k1F1B, 1, 1, 0, &ws) == Approx(2700).epsilon(1e-9));
  // 1000 micro-batches (the closed form of one chunk's walk, one_chunk_backwards): 3 live until the last
  // steady backward, the 998th, after 997 kept 40 each: 2760 + 39880 = 42640 (the cool-down's 2 * 920 +
  // 998 * 40 = 41760 and 40880 are less).
  CHECK(activations(Schedule::k1F1B, 1, 1, 1000, &ws) == Approx(42640).epsilon(1e-9));
  CHECK(ws == Approx(40));
  // Without the held sends (Megatron): the live micro-batches and their inputs only. Interleaved rank 1:
  // 8 * 620 + 320 = 5280; 1F1B rank 1: 3 * 920 = 2760.
  s.sends_held = false;
  CHECK(activations(Schedule::kInterleaved1F1B, 2, 1, 8, &ws) == Approx(5280).epsilon(1e-9));
  CHECK(activations(Schedule::k1F1B, 1, 1, 8, &ws) == Approx(2760).epsilon(1e-9));
}

// Sequence parallelism over measured profiles (taken without it): replay's GPT splits the residual stream
// between its layers, so each stored layer output that stays inside the GPT (the embedding's, a block's)
// and each block's residual after attention keep 1 / tp of b s h x 2 bytes; the all-gathered GEMM inputs,
// the GPT's own output and the head's tensors stay whole. GPT of 10 blocks, tp 4, micro-batch 2 x 2048,
// h 2560: one tensor is 20 MiB, 15 MiB saved per split tensor.
TEST_CASE("sequence parallelism over measured profiles splits the residual stream only", "[memory][seqpar]") {
  constexpr double kMiB = 1024.0 * 1024.0;
  const ModelShape m = gpt2_shape(50304, 2560, 10, 20, 2048);
  std::vector<double> stored(12, 140.0), working(12, 110.0);
  stored[0] = 20, stored[11] = 216;
  auto activations = [&](bool sp, int first, int end, Recompute recompute) {
    TrainingSetup s;
    s.sequence_parallel = sp;
    s.recompute = recompute;
    RankShard r;
    r.first_layer = first;
    r.end_layer = end;
    r.tp = 4, r.pp = end == 12 && first == 0 ? 1 : 2, r.stage = first == 0 ? 0 : 1;
    r.micro_batch = 2, r.seq = 2048;
    MeasuredActivations ma;
    ma.activation_mb = stored.data() + first;
    ma.working_mb = working.data() + first;
    return rank_memory(m, s, r, shard_params(m, first, end, r.pp, s), &ma).activations / kMiB;
  };
  // The whole model: the embedding's output and two tensors of each of the 10 blocks: 21 x 15 MiB.
  CHECK(activations(false, 0, 12, Recompute::kNone) - activations(true, 0, 12, Recompute::kNone) ==
        Approx(21 * 15.0).epsilon(1e-9));
  // A stage [0, 6) ending in block 5, whose output leaves the GPT whole: 1 + 4 x 2 + 1 tensors.
  CHECK(activations(false, 0, 6, Recompute::kNone) - activations(true, 0, 6, Recompute::kNone) ==
        Approx(10 * 15.0).epsilon(1e-9));
  // A stage [6, 12) ending in the head: blocks 6..10 keep both tensors split, the head nothing: 10.
  CHECK(activations(false, 6, 12, Recompute::kNone) - activations(true, 6, 12, Recompute::kNone) ==
        Approx(10 * 15.0).epsilon(1e-9));
}

// The analytic terms count each block's input (its first norm's), so a stage's received input is in them:
// walking the op order adds no boundary tensor for it (the measured path above does), only the held sends.
TEST_CASE("analytic activations already hold the received input", "[memory][interleaved]") {
  const ModelShape m = gpt2_shape(50304, 2560, 10, 20, 2048);
  TrainingSetup s;
  s.flash_attention = true;
  RankShard r;
  r.first_layer = 3, r.end_layer = 6, r.pp = 4, r.stage = 1, r.micro_batch = 2, r.seq = 2048;
  r.in_flight = 3;  // 1F1B, stage 1 of 4
  const double counted = rank_memory(m, s, r).activations;
  r.schedule = Schedule::k1F1B;
  r.microbatches = 8;
  CHECK(rank_memory(m, s, r).activations == Approx(counted).epsilon(1e-12));
  // With replay's held sends: before the sixth backward, 5 backwarded micro-batches keep their sent output
  // and input gradient (2 x 20 MiB each): 3 live, as before, plus 200 MiB.
  s.sends_held = true;
  CHECK(rank_memory(m, s, r).activations == Approx(counted + 10 * 2.0 * 2048 * 2560 * 2).epsilon(1e-12));
}
