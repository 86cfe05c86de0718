// `hetplan simulate` (one plan through the schedule-level simulator) and
// `hetplan whatif` (memory and step time of common training strategies).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "sim/gpu_specs.h"
#include "sim/checked.h"
#include "sim/input_error.h"
#include "sim/json_util.h"
#include "sim/plan_file.h"
#include "sim/plan_simulator.h"

namespace hetplan::cli {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Options both commands share: training setup and network units.
struct SetupArgs {
  int zero = 0;
  std::string recompute = "none", precision = "bf16", accounting = "auto", bandwidth_unit = "GB/s";
  bool sequence_parallel = false, flash = false;
  double framework_mb = 0;
};

// --framework-mb's default for simulate: take the constant the profiles measured.
constexpr double kFrameworkFromProfiles = -1;

void add_setup_options(CLI::App* s, SetupArgs& a, double default_framework_mb) {
  a.framework_mb = default_framework_mb;
  s->add_option("--zero", a.zero, "ZeRO stage over each stage's data-parallel group (0-3)")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  s->add_option("--recompute", a.recompute, "Activation recomputation: none, selective or full")->capture_default_str();
  s->add_option("--precision", a.precision, "Training precision: fp32, bf16 or fp8")->capture_default_str();
  s->add_option("--accounting", a.accounting,
                "Model-state accounting: zero (ZeRO paper), deepspeed (memory.rst estimator), megatron, or auto "
                "(simulate: megatron when the profiles record 18 bytes per parameter, as hetplan profile's do; "
                "else zero)")
      ->capture_default_str();
  s->add_flag("--sequence-parallel", a.sequence_parallel, "Megatron sequence parallelism (activations split by tp)");
  s->add_flag("--flash-attention", a.flash,
              "Attention scores are never stored (as selective recomputation; simulate: also when the profiles "
              "record fused attention)");
  s->add_option("--framework-mb", a.framework_mb,
                default_framework_mb < 0
                    ? "Per-GPU framework constant: CUDA context, allocator, workspaces (MiB; default: the profiles' "
                      "measured framework_mb, else 0)"
                    : "Per-GPU framework constant: CUDA context, allocator, workspaces (MiB)");
  if (default_framework_mb >= 0) s->get_option("--framework-mb")->capture_default_str();
  s->add_option("--bandwidth-unit", a.bandwidth_unit, "Unit of the clusterfile's bandwidths: GB/s, GiB/s or bytes/s")
      ->capture_default_str();
}

TrainingSetup make_setup(const SetupArgs& a) {
  TrainingSetup s;
  s.zero_stage = a.zero;
  s.recompute = parse_recompute(a.recompute, "--recompute");
  s.precision = parse_precision(a.precision, "--precision");
  if (a.accounting == "zero" || a.accounting == "auto") s.accounting = ZeroAccounting::kZeroPaper;
  else if (a.accounting == "deepspeed") s.accounting = ZeroAccounting::kDeepSpeed;
  else if (a.accounting == "megatron") s.accounting = ZeroAccounting::kMegatron;
  else throw InputError("--accounting: '" + excerpt(a.accounting) + "': expected zero, deepspeed, megatron or auto");
  s.sequence_parallel = a.sequence_parallel;
  s.flash_attention = a.flash;
  if (a.framework_mb != kFrameworkFromProfiles)
    check_number(a.framework_mb, rules::non_negative_up_to(kMaxProfileMb), "--framework-mb");
  s.framework_bytes = a.framework_mb < 0 ? -1.0 : a.framework_mb * 1024 * 1024;
  return s;
}

// ---------------------------------------------------------------- simulate

struct SimulateArgs {
  std::string plan, schedule = "1f1b", profiles, hostfile, clusterfile, hf_config, trace, json_out;
  std::string collectives = "measured";
  bool burst_clocks = false;
  SetupArgs setup;
  bool zero_given = false, recompute_given = false, schedule_given = false;  // else the plan file's setting
};

int run_simulate(const SimulateArgs& a) {
  const PlanFile pf = read_plan_file(a.plan);
  SetupArgs setup_args = a.setup;
  if (!a.zero_given && pf.zero_stage >= 0) setup_args.zero = pf.zero_stage;
  if (!a.recompute_given && !pf.recompute.empty()) setup_args.recompute = pf.recompute;
  const std::string hostfile = a.hostfile.empty() ? pf.hostfile : a.hostfile;
  const std::string clusterfile = a.clusterfile.empty() ? pf.clusterfile : a.clusterfile;
  const std::string profile_dir = a.profiles.empty() ? pf.profile_dir : a.profiles;
  if (hostfile.empty() || clusterfile.empty())
    throw InputError(a.plan + ": no 'hostfile'/'clusterfile' in the plan; pass --hostfile and --clusterfile");
  if (profile_dir.empty()) throw InputError(a.plan + ": no 'profile_dir' in the plan; pass --profiles");
  const Cluster cluster = Cluster::load(hostfile, clusterfile);
  const ProfileSet profiles = ProfileSet::load(profile_dir, pf.model.num_layers);
  ModelShape shape = a.hf_config.empty() ? shape_from_model_config(pf.model) : read_hf_config(a.hf_config);
  if (a.hf_config.empty()) shape.validate(a.plan + ": key 'model'");

  SimulationOptions o;
  o.schedule = parse_schedule(!a.schedule_given && !pf.schedule.empty() ? pf.schedule : a.schedule, "--schedule");
  o.setup = as_profiled(make_setup(setup_args), profiles, a.setup.accounting != "auto", a.setup.flash);
  o.network.unit = parse_bandwidth_unit(a.setup.bandwidth_unit, "--bandwidth-unit");
  o.measured_collectives = parse_collectives(a.collectives);
  o.sustained_clocks = !a.burst_clocks;
  const PlanSimulator simulator(cluster, profiles, shape, pf.model.sequence_length, o);
  const PlanSimulation sim = simulator.simulate(pf.plan, pf.gbs);
  const TimelineResult& t = sim.timeline;

  std::cout << "plan: " << a.plan << " (" << pf.plan.device_groups.size() << " stages, " << pf.plan.batches
            << " micro-batches, gbs " << pf.gbs << "), schedule " << to_string(o.schedule) << ", ZeRO-"
            << o.setup.zero_stage << ", recompute " << to_string(o.setup.recompute) << "\n";
  std::cout << "iteration_ms: " << fixed(t.iteration_ms, 3) << "\n";
  std::cout << "bubble_fraction: " << fixed(t.bubble_fraction, 4) << "\n";
  std::cout << "tokens_per_s: " << fixed(t.tokens_per_s, 1) << "\n";
  std::cout << "mfu: " << (t.mfu >= 0 ? fixed(t.mfu, 4) : std::string("unknown (a GPU type without a datasheet entry)"))
            << "\n";
  for (const auto& line : simulator.collective_sources()) std::cout << "network: " << line << "\n";
  for (const auto& st : sim.stages)
    if (st.power_limited)
      std::cout << "power: " << st.label << " sets the pace; at sustained clocks it computes "
                << fixed(st.sustained_factor, 3) << "x its burst time\n";
  if (pf.plan.cost > 0) std::cout << "plan_cost_ms: " << fixed(pf.plan.cost, 3) << " (the cost search recorded, by its cost model)\n";
  std::cout << "| stage | forward ms | backward ms | busy ms | allreduce ms | in flight | peak GiB | capacity GiB |\n"
            << "|---|---|---|---|---|---|---|---|\n";
  for (std::size_t i = 0; i < sim.stages.size(); ++i) {
    double peak = 0, cap = 0;
    for (const auto& r : sim.ranks)
      if (r.stage == static_cast<int>(i) && r.breakdown.gpu_total() >= peak) {
        peak = r.breakdown.gpu_total();
        cap = r.capacity_bytes;
      }
    std::cout << "| " << sim.stages[i].label << " | " << fixed(sim.stages[i].forward_ms, 3) << " | "
              << fixed(sim.stages[i].backward_ms, 3) << " | " << fixed(t.busy_ms[i], 3) << " | "
              << fixed(sim.stages[i].allreduce_ms, 3) << " | " << t.peak_in_flight[i] << " | " << fixed(peak / kGiB, 2)
              << " | " << fixed(cap / kGiB, 2) << " |\n";
  }
  if (sim.fits) {
    std::cout << "memory: every rank fits\n";
  } else {
    const RankMemory& r = sim.ranks[sim.first_oom_rank];
    std::cout << "memory: OUT OF MEMORY on rank " << r.rank << " (" << r.device << ", stage " << r.stage << "): needs "
              << fixed(r.breakdown.gpu_total() / kGiB, 2) << " GiB of " << fixed(r.capacity_bytes / kGiB, 2)
              << " GiB\n";
  }
  if (!a.trace.empty()) write_json_file(a.trace, chrome_trace(t, sim.stages));
  if (!a.json_out.empty()) {
    ordered_json j = simulation_to_json(sim);
    j["schedule"] = to_string(o.schedule);
    j["zero_stage"] = o.setup.zero_stage;
    j["recompute"] = to_string(o.setup.recompute);
    j["network"] = simulator.collective_sources();
    j["plan"] = plan_file_to_json(pf);
    write_json_file(a.json_out, j);
  }
  return 0;
}

// ------------------------------------------------------------------ whatif

struct WhatifArgs {
  std::string hf_config, family = "llama", gpu = "A100", hostfile, clusterfile, json_out;
  long long vocab = 32000, hidden = 4096, ffn = 0, max_positions = 4096;
  int layers = 32, heads = 32, kv_heads = 0;
  int seq = 2048, micro_batch = 1, gpus = 8, gpus_per_node = 8, gbs = 0;
  double efficiency = 0.4, fp8_speedup = 1.5, pcie_gbs = 25, cpu_adam_params_per_s = 1e9, cpu_memory_gb = 1024;
  double intra_gbs = 0, inter_gbs = 25;
  int lora_rank = 16;
  std::string lora_targets = "qv";
  SetupArgs setup;
};

unsigned parse_targets(const std::string& s) {
  unsigned m = 0;
  for (char c : s) {
    switch (c) {
      case 'q': m |= kTargetQ; break;
      case 'k': m |= kTargetK; break;
      case 'v': m |= kTargetV; break;
      case 'o': m |= kTargetO; break;
      case 'g': m |= kTargetGate; break;
      case 'u': m |= kTargetUp; break;
      case 'd': m |= kTargetDown; break;
      default:
        throw InputError("--lora-targets: '" + excerpt(s) + "': expected letters of qkvogud (q, k, v, o, gate, up, down)");
    }
  }
  return m;
}

struct Row {
  std::string name;
  TrainingSetup setup;
  double compute_factor = 1;  // of the full fine-tune's compute time
  std::vector<std::string> assumptions;
};

void check_flag(long long v, double lo, double hi, const char* flag) {
  check_integer(static_cast<double>(v), rules::int_in(lo, hi), flag);
}

void check_whatif_flags(const WhatifArgs& a) {
  check_flag(a.vocab, 1, static_cast<double>(kMaxVocabSize), "--vocab-size");
  check_flag(a.hidden, 1, static_cast<double>(kMaxHiddenSize), "--hidden-size");
  check_flag(a.ffn, 0, static_cast<double>(kMaxFfnSize), "--ffn-size");
  check_flag(a.max_positions, 1, static_cast<double>(kMaxSequenceLength), "--max-positions");
  check_flag(a.layers, 1, kMaxModelLayers - 2, "--layers");
  check_flag(a.heads, 1, kMaxAttentionHeads, "--heads");
  check_flag(a.kv_heads, 0, kMaxAttentionHeads, "--kv-heads");
  check_flag(a.seq, 1, static_cast<double>(kMaxSequenceLength), "--seq");
  check_flag(a.micro_batch, 1, kMaxGlobalBatch, "--micro-batch");
  check_flag(a.gbs, 0, kMaxGlobalBatch, "--gbs");
  check_flag(a.gpus, 1, kMaxClusterGpus, "--gpus");
  check_flag(a.gpus_per_node, 1, kMaxSlotsPerNode, "--gpus-per-node");
  check_flag(a.lora_rank, 1, static_cast<double>(kMaxHiddenSize), "--lora-rank");
  check_number(a.efficiency, rules::positive_up_to(1), "--efficiency");
  check_number(a.fp8_speedup, rules::positive_up_to(100), "--fp8-speedup");
  check_number(a.cpu_adam_params_per_s, rules::positive_up_to(1e15), "--cpu-adam-params-per-s");
  check_number(a.cpu_memory_gb, rules::positive_up_to(1e9), "--cpu-memory-gb");
  // The one bandwidth rule (sim/network.h); --intra-gbs 0 means the GPU's NVLink.
  check_bandwidth(a.pcie_gbs, BandwidthUnit::kGBps, "--pcie-gbs");
  check_bandwidth(a.inter_gbs, BandwidthUnit::kGBps, "--inter-gbs");
  if (a.intra_gbs != 0) check_bandwidth(a.intra_gbs, BandwidthUnit::kGBps, "--intra-gbs");
}

int run_whatif(const WhatifArgs& a) {
  check_whatif_flags(a);
  ModelShape shape;
  if (!a.hf_config.empty()) {
    shape = read_hf_config(a.hf_config);
  } else if (a.family == "gpt2") {
    shape = gpt2_shape(a.vocab, a.hidden, a.layers, a.heads, std::max<long long>(a.max_positions, a.seq));
    if (a.ffn > 0) shape.ffn_hidden_size = a.ffn;
  } else if (a.family == "llama") {
    shape = llama_shape(a.vocab, a.hidden, a.layers, a.heads, a.kv_heads > 0 ? a.kv_heads : a.heads,
                        a.ffn > 0 ? a.ffn : 11008, false, a.max_positions);
  } else {
    throw InputError("--family: '" + excerpt(a.family) + "': expected gpt2 or llama");
  }
  shape.validate("model flags");

  // The GPUs: a type and count, or a hostfile (its slowest type by peak, all its GPUs).
  std::string gpu = a.gpu;
  int gpus = a.gpus, per_node = a.gpus_per_node;
  double capacity_gb = 0, intra = a.intra_gbs * 1e9, inter = a.inter_gbs * 1e9;
  const BandwidthUnit unit = parse_bandwidth_unit(a.setup.bandwidth_unit, "--bandwidth-unit");
  if (!a.hostfile.empty()) {
    if (a.clusterfile.empty()) throw InputError("--hostfile needs --clusterfile");
    const Cluster c = Cluster::load(a.hostfile, a.clusterfile);
    check_clusterfile_bandwidths(c.clusterfile(), c.clusterfile_path(), unit);
    gpus = c.num_devices();
    double slowest = 1e300;
    per_node = 0;
    intra = inter = 1e300;
    capacity_gb = 1e300;
    for (const ClusterNode& n : c.nodes()) {
      const std::string& t = c.device_types()[n.type];
      const GpuSpec* g = find_gpu_spec(t);
      if (!g) throw InputError(a.clusterfile + ": device type '" + t + "' has no datasheet entry for the roofline");
      if (g->peak_tflops < slowest) slowest = g->peak_tflops, gpu = t;
      per_node = std::max(per_node, n.num_devices);
      intra = std::min(intra, bytes_per_second(n.intra_bandwidth, unit));
      inter = std::min(inter, bytes_per_second(n.inter_bandwidth, unit));
      capacity_gb = std::min(capacity_gb, c.memory_mb(n.type) / 1024.0);
    }
  }
  const GpuSpec* spec = find_gpu_spec(gpu);
  if (!spec) {
    std::string known;
    for (const auto& s : gpu_specs()) known += (known.empty() ? "" : ", ") + s.name;
    throw InputError("--gpu: '" + gpu + "': expected one of " + known);
  }
  if (capacity_gb == 0) capacity_gb = spec->memory_gb;
  if (intra == 0) intra = spec->nvlink_gbs * 1e9;
  if (gpus < 1 || per_node < 1) throw InputError("--gpus and --gpus-per-node: expected positive counts");
  per_node = std::min(per_node, gpus);
  const auto per_step = checked_mul(a.micro_batch, gpus);
  if (!per_step || *per_step > kMaxGlobalBatch)
    throw InputError("--micro-batch x GPUs: " + std::to_string(a.micro_batch) + " x " + std::to_string(gpus) +
                     " sequences per step is more than " + std::to_string(kMaxGlobalBatch) +
                     " (use a smaller --micro-batch or fewer GPUs)");
  const int gbs = a.gbs > 0 ? a.gbs : *per_step;
  if (gbs % *per_step != 0)
    throw InputError("--gbs: expected a multiple of --micro-batch x GPUs (" + std::to_string(*per_step) + ")");
  const int accumulation = gbs / *per_step;

  const TrainingSetup base = make_setup(a.setup);
  const double params = static_cast<double>(shape.parameter_count());
  const double tokens = static_cast<double>(gbs) * a.seq;

  std::vector<Row> rows;
  auto row = [&](const std::string& name, auto edit) {
    Row r{name, base, 1, {}};
    edit(r);
    rows.push_back(r);
  };
  row("DDP", [](Row& r) { r.setup.zero_stage = 0; });
  row("ZeRO-1", [](Row& r) { r.setup.zero_stage = 1; });
  row("ZeRO-2", [](Row& r) { r.setup.zero_stage = 2; });
  row("ZeRO-2+offload", [](Row& r) {
    r.setup.zero_stage = 2;
    r.setup.offload_optimizer = true;
  });
  row("ZeRO-3", [](Row& r) { r.setup.zero_stage = 3; });
  row("ZeRO-3+offload", [](Row& r) {
    r.setup.zero_stage = 3;
    r.setup.offload_optimizer = r.setup.offload_params = true;
  });
  row("8-bit weights", [](Row& r) {
    r.setup.zero_stage = 0;
    r.setup.base_weights = int8_blockwise();
    r.assumptions.push_back("weight-only int8 compute copy (8.5 bits); dequantisation time ignored");
  });
  row("4-bit weights", [](Row& r) {
    r.setup.zero_stage = 0;
    r.setup.base_weights = nf4_double_quant();
    r.assumptions.push_back("weight-only NF4 compute copy (4.127 bits); dequantisation time ignored");
  });
  row("full fine-tune", [](Row& r) { r.setup.zero_stage = 0; });
  auto lora = [&](Row& r, Finetune kind, bool gc) {
    r.setup.zero_stage = 0;
    r.setup.finetune = kind;
    r.setup.lora_rank = a.lora_rank;
    r.setup.lora_targets = parse_targets(a.lora_targets);
    if (kind == Finetune::kQlora) r.setup.base_weights = nf4_double_quant();
    if (gc) r.setup.recompute = Recompute::kFull;
    // No weight gradients for the frozen base: forward + input-gradient backward, 2/3 of full training.
    r.compute_factor = 2.0 / 3;
    r.assumptions.push_back("frozen base: backward computes input gradients only (2/3 of full compute)");
    if (kind == Finetune::kQlora) r.assumptions.push_back("NF4 dequantisation time ignored");
  };
  row("LoRA", [&](Row& r) { lora(r, Finetune::kLora, false); });
  row("LoRA+GC", [&](Row& r) { lora(r, Finetune::kLora, true); });
  row("QLoRA", [&](Row& r) { lora(r, Finetune::kQlora, false); });
  row("QLoRA+GC", [&](Row& r) { lora(r, Finetune::kQlora, true); });
  row("bf16", [](Row& r) { r.setup.precision = Precision::kBf16, r.setup.recompute = Recompute::kNone; });
  row("bf16+selective", [](Row& r) { r.setup.precision = Precision::kBf16, r.setup.recompute = Recompute::kSelective; });
  row("FP8", [&](Row& r) {
    r.setup.precision = Precision::kFp8, r.setup.recompute = Recompute::kNone;
    r.assumptions.push_back("FP8 GEMM speed-up " + fixed(a.fp8_speedup, 2) + "x assumed (no FP8 profiles)");
  });
  row("FP8+selective", [&](Row& r) {
    r.setup.precision = Precision::kFp8, r.setup.recompute = Recompute::kSelective;
    r.assumptions.push_back("FP8 GEMM speed-up " + fixed(a.fp8_speedup, 2) + "x assumed (no FP8 profiles)");
  });

  const double peak = spec->peak_tflops * 1e12 * a.efficiency;
  const int nodes = (gpus + per_node - 1) / per_node;
  // Ring all-reduce of B bytes over the GPUs: inside a node at NVLink speed, across nodes hierarchically.
  auto allreduce_s = [&](double bytes) {
    if (gpus == 1) return 0.0;
    const double in_node = per_node > 1 ? 2.0 * (per_node - 1) / per_node * bytes / intra : 0.0;
    const double across = nodes > 1 ? 2.0 * (nodes - 1) / nodes * (bytes / per_node) / inter : 0.0;
    return in_node + across;
  };

  ordered_json out_rows = ordered_json::array();
  std::cout << "model: " << shape.name << " (" << fixed(params / 1e9, 3) << "B parameters), " << gpus << " x " << gpu
            << " (" << fixed(capacity_gb, 0) << " GB), seq " << a.seq << ", micro-batch " << a.micro_batch << ", gbs "
            << gbs << "\n"
            << "step time: roofline, model FLOPs / (GPUs x " << fixed(spec->peak_tflops, 0) << " TFLOP/s x "
            << fixed(a.efficiency, 2) << " efficiency) + gradient communication (not overlapped) + offload traffic\n\n"
            << "| strategy | memory/GPU GiB | CPU/node GiB | step ms | tokens/s | fits | assumptions |\n"
            << "|---|---|---|---|---|---|---|\n";
  for (Row& r : rows) {
    RankShard shard;
    shard.first_layer = 0;
    shard.end_layer = shape.metis_num_layers();
    shard.dp = gpus;
    shard.micro_batch = a.micro_batch;
    shard.seq = a.seq;
    shard.in_flight = 1;
    shard.gpus_per_node = per_node;
    const MemoryBreakdown m = rank_memory(shape, r.setup, shard);
    // Compute: 3 x forward FLOPs; full recomputation adds a forward, selective the attention scores.
    const double factor = r.compute_factor + recomputed_forward_fraction(shape, r.setup.recompute, a.seq) / 3;
    double compute_s = shape.training_flops(tokens, a.seq) * factor / (gpus * peak);
    if (r.setup.precision == Precision::kFp8) compute_s /= a.fp8_speedup;
    const double trainable = r.setup.finetune == Finetune::kFull ? params : shard_params(shape, 0, shard.end_layer, 1, r.setup).lora;
    double comm_s = allreduce_s(trainable * 2) * (r.setup.zero_stage >= 3 ? 1.5 : 1.0);
    double offload_s = 0;
    if (r.setup.offload_optimizer) {
      // Gradients down and updated weights up over PCIe, and CPU Adam over this rank's partition.
      const double part = trainable / gpus;
      offload_s = 2 * part * 2 / (a.pcie_gbs * 1e9) + part / a.cpu_adam_params_per_s;
      r.assumptions.push_back("PCIe " + fixed(a.pcie_gbs, 0) + " GB/s, CPU Adam " +
                              fixed(a.cpu_adam_params_per_s / 1e9, 1) + "e9 params/s per GPU");
    }
    if (r.setup.offload_params) {
      // Every forward and backward fetches the rank's weights from CPU memory.
      offload_s += accumulation * 2 * (params / gpus * 2) / (a.pcie_gbs * 1e9);
    }
    const double step_ms = (compute_s + comm_s + offload_s) * 1e3;
    const double gpu_bytes = m.gpu_total();
    const bool fits = gpu_bytes <= capacity_gb * kGiB && m.cpu_per_node() <= a.cpu_memory_gb * kGiB;
    std::string assumptions;
    for (const auto& s : r.assumptions) assumptions += (assumptions.empty() ? "" : "; ") + s;
    std::ostringstream setup;
    setup << to_string(r.setup.precision) << ", ZeRO-" << r.setup.zero_stage << ", recompute "
          << to_string(r.setup.recompute);
    if (assumptions.empty()) assumptions = setup.str();
    else assumptions = setup.str() + "; " + assumptions;
    std::cout << "| " << r.name << " | " << fixed(gpu_bytes / kGiB, 2) << " | " << fixed(m.cpu_per_node() / kGiB, 1)
              << " | " << fixed(step_ms, 1) << " | " << fixed(tokens / (step_ms / 1e3), 0) << " | "
              << (fits ? "yes" : "no") << " | " << assumptions << " |\n";
    out_rows.push_back({{"strategy", r.name},
                        {"memory_per_gpu_bytes", gpu_bytes},
                        {"weights_bytes", m.states.weights},
                        {"gradients_bytes", m.states.gradients},
                        {"optimizer_bytes", m.states.optimizer},
                        {"activations_bytes", m.activations + m.recompute_workspace},
                        {"cpu_per_node_bytes", m.cpu_per_node()},
                        {"step_ms", step_ms},
                        {"tokens_per_s", tokens / (step_ms / 1e3)},
                        {"fits", fits},
                        {"assumptions", assumptions}});
  }
  if (!a.json_out.empty()) {
    ordered_json j;
    j["model"] = shape.name;
    j["parameters"] = shape.parameter_count();
    j["gpu"] = gpu;
    j["gpus"] = gpus;
    j["gpu_memory_gb"] = capacity_gb;
    j["sequence_length"] = a.seq;
    j["micro_batch"] = a.micro_batch;
    j["gbs"] = gbs;
    j["rows"] = out_rows;
    write_json_file(a.json_out, j);
  }
  return 0;
}

}  // namespace

Runner add_simulate_command(CLI::App& app) {
  auto a = std::make_shared<SimulateArgs>();
  CLI::App* s = app.add_subcommand(
      "simulate",
      "Simulate one plan (an entry of `search --json`) as a GPipe or 1F1B task graph: iteration time, bubble,\n"
      "per-stage busy time, per-rank peak memory, tokens/s, MFU, and a Chrome trace.");
  s->add_option("--plan", a->plan, "Plan JSON: an entry of `hetplan search --json` (or the whole file: its best)")
      ->required();
  s->add_option("--schedule", a->schedule, "Pipeline schedule: gpipe or 1f1b")->capture_default_str();
  s->add_option("--profiles", a->profiles, "Profile folder (default: the plan's profile_dir)");
  s->add_option("--hostfile", a->hostfile, "Hostfile (default: the plan's)");
  s->add_option("--clusterfile", a->clusterfile, "Clusterfile (default: the plan's)");
  s->add_option("--hf-config", a->hf_config, "Hugging Face config.json for the model shape (default: the plan's GPT)");
  s->add_option("--trace", a->trace, "Write a Chrome trace (Perfetto) to this file");
  s->add_option("--collectives", a->collectives,
                "Intra-node all-reduce bandwidth: measured (the profiles' communication.allreduce_busbw_gbs where "
                "present) or clusterfile (its intra_bandwidth)")
      ->capture_default_str();
  s->add_flag("--burst-clocks", a->burst_clocks,
              "Cost every stage at the profiles' burst timings (by default the pace-setting stage runs at the "
              "sustained, power-limited pace the profiler measured, where it did)");
  s->add_option("--json", a->json_out, "Write the results as JSON to this file");
  add_setup_options(s, a->setup, kFrameworkFromProfiles);
  CLI::Option* zero = s->get_option("--zero");
  CLI::Option* recompute = s->get_option("--recompute");
  CLI::Option* schedule = s->get_option("--schedule");
  return [a, zero, recompute, schedule] {
    // A plan from `search --cost-model sim --zero/--recompute auto` carries
    // the setting it was costed with; the flags, when given, win.
    a->zero_given = zero->count() > 0;
    a->recompute_given = recompute->count() > 0;
    a->schedule_given = schedule->count() > 0;
    return run_simulate(*a);
  };
}

Runner add_whatif_command(CLI::App& app) {
  auto a = std::make_shared<WhatifArgs>();
  CLI::App* s = app.add_subcommand(
      "whatif",
      "Memory per GPU, step time and tokens/s of DDP, ZeRO-1/2/3 (+offload), 8/4-bit weights, LoRA/QLoRA (+GC)\n"
      "and bf16/FP8 (+selective checkpointing) for one model on one GPU type or a hostfile.");
  s->add_option("--hf-config", a->hf_config, "Hugging Face config.json (gpt2, llama, mistral)");
  s->add_option("--family", a->family, "Without --hf-config: gpt2 or llama")->capture_default_str();
  s->add_option("--vocab-size", a->vocab, "Vocabulary")->capture_default_str();
  s->add_option("--hidden-size", a->hidden, "Hidden size")->capture_default_str();
  s->add_option("--layers", a->layers, "Transformer blocks")->capture_default_str();
  s->add_option("--heads", a->heads, "Attention heads")->capture_default_str();
  s->add_option("--kv-heads", a->kv_heads, "Key/value heads (GQA; default: --heads)");
  s->add_option("--ffn-size", a->ffn, "MLP hidden size (default: 4h for gpt2, 11008 for llama)");
  s->add_option("--max-positions", a->max_positions, "Max positions (learned for gpt2)")->capture_default_str();
  s->add_option("--seq", a->seq, "Sequence length")->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--micro-batch", a->micro_batch, "Sequences per GPU per step")->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--gbs", a->gbs, "Global batch (default: micro-batch x GPUs; more means gradient accumulation)");
  s->add_option("--gpu", a->gpu, "GPU type (A100, H100, H200, V100)")->capture_default_str();
  s->add_option("--gpus", a->gpus, "GPUs")->capture_default_str();
  s->add_option("--gpus-per-node", a->gpus_per_node, "GPUs per node")->capture_default_str();
  s->add_option("--hostfile", a->hostfile, "Hostfile instead of --gpu/--gpus (its slowest GPU type sets the pace)");
  s->add_option("--clusterfile", a->clusterfile, "Clusterfile for --hostfile");
  s->add_option("--efficiency", a->efficiency, "Achieved fraction of peak FLOP/s")->capture_default_str();
  s->add_option("--fp8-speedup", a->fp8_speedup, "Assumed FP8 over bf16 speed-up")->capture_default_str();
  s->add_option("--intra-gbs", a->intra_gbs, "Intra-node GB/s (default: the GPU's NVLink)");
  s->add_option("--inter-gbs", a->inter_gbs, "Inter-node GB/s per GPU")->capture_default_str();
  s->add_option("--pcie-gbs", a->pcie_gbs, "GPU-CPU GB/s for offload")->capture_default_str();
  s->add_option("--cpu-adam-params-per-s", a->cpu_adam_params_per_s, "CPU Adam throughput per GPU process")
      ->capture_default_str();
  s->add_option("--cpu-memory-gb", a->cpu_memory_gb, "CPU memory per node (GB) for the fits column")
      ->capture_default_str();
  s->add_option("--lora-rank", a->lora_rank, "LoRA rank")->capture_default_str();
  s->add_option("--lora-targets", a->lora_targets, "LoRA projections: letters of qkvogud")->capture_default_str();
  s->add_option("--json", a->json_out, "Write the table as JSON to this file");
  add_setup_options(s, a->setup, 1024);
  return [a] { return run_whatif(*a); };
}

}  // namespace hetplan::cli
