// `hetplan simulate` (one plan through the schedule-level simulator) and
// `hetplan whatif` (memory and step time of common training strategies).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/device_memory_flags.h"
#include "cli/flag_validators.h"
#include "cli/model_flags.h"
#include "metis/metis_estimate.h"
#include "sim/network.h"
#include "sim/gpu_specs.h"
#include "base/checked.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/plan_file.h"
#include "sim/plan_simulator.h"
#include "sim/report.h"
#include "sim/inference.h"
#include "sim/whatif.h"

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
  bool sequence_parallel = false, flash = false, deepspeed_buffers = false, ddp_buckets = false;
  std::string ddp_old_buckets;  // "": the activations' peak (or the plan file's)
  std::string offload = "none";
  int recompute_every = 1;
  double framework_mb = 0;
  // simulate only (add_parallel_options): 0 / off / 0 take the plan file's setting.
  int context_parallel = 0;
  bool overlap_grad_reduce = false, overlap_param_gather = false;
  double ddp_bucket_params = 0, comm_slowdown = 0;  // 0: the profiles' comm_overlap.json, else the default
};

// simulate's context parallelism and overlapped data-parallel communication (sim/sequence_parallel.h,
// sim/dp_overlap.h).
void add_parallel_options(CLI::App* s, SetupArgs& a) {
  s->add_option("--context-parallel", a.context_parallel,
                "Context-parallel size cp (ring attention): every stage's dp counts dp/cp replicas of cp ranks "
                "(Megatron's order tp, cp, dp); each rank holds and computes 1/cp of every sequence and "
                "exchanges K/V with its ring neighbours (default: the plan file's, else 1)")
      ->check(CLI::Range(1, kMaxReplicas));
  s->add_flag("--overlap-grad-reduce", a.overlap_grad_reduce,
              "Reduce gradients bucket by bucket during the backward (Megatron --overlap-grad-reduce, DeepSpeed "
              "overlap_comm, PyTorch DDP); only the tail stays exposed (sim/dp_overlap.h)");
  s->add_flag("--overlap-param-gather", a.overlap_param_gather,
              "With ZeRO >= 1: gather the updated weights bucket by bucket during the forward (Megatron "
              "--overlap-param-gather, FSDP prefetch)");
  s->add_option("--ddp-bucket-size", a.ddp_bucket_params,
                "Parameters per overlapped communication bucket (default: Megatron's max(40M, 1M x dp))")
      ->check(CLI::Range(0.0, 1e13));
  s->add_option("--comm-slowdown", a.comm_slowdown,
                "Compute time while an overlapped collective shares the GPU, over its time alone, for every "
                "collective (default: the profile folder's comm_overlap.json, measured by "
                "scripts/gpu_overlap_probe.sh for reductions and gathers apart, else 1.035; sim/dp_overlap.md)")
      ->check(CLI::Range(1.0, 10.0));
}

// --framework-mb's default for simulate: take the constant the profiles measured.
constexpr double kFrameworkFromProfiles = -1;

void add_setup_options(CLI::App* s, SetupArgs& a, double default_framework_mb) {
  a.framework_mb = default_framework_mb;
  s->add_option("--zero", a.zero, "ZeRO stage over each stage's data-parallel group (0-3)")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  s->add_option("--recompute", a.recompute, "Activation recomputation: none, selective or full")->capture_default_str();
  s->add_option("--precision", a.precision, "Training precision: fp32, fp16, bf16 or fp8")->capture_default_str();
  s->add_option("--accounting", a.accounting,
                "Model-state accounting: zero (ZeRO paper), deepspeed (memory.rst estimator), megatron, fsdp2 (PyTorch "
                "fully_shard over fp32 parameters, 16-bit compute: no 16-bit copy kept, fp32 sharded gradients), or auto "
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
                      "measured framework_mb at tp 1, else 767)"
                    : "Per-GPU framework constant: CUDA context, allocator, workspaces (MiB)");
  if (default_framework_mb >= 0) s->get_option("--framework-mb")->capture_default_str();
  s->add_option("--offload", a.offload,
                "ZeRO-Offload: none, optimizer (ZeRO-1/2/3) or all (optimizer and parameters, ZeRO-3); costed by "
                "DeepSpeed's overlap rules (sim/offload.h)")
      ->capture_default_str();
  s->add_flag("--deepspeed-buffers", a.deepspeed_buffers,
              "Count DeepSpeed's default bucket, prefetch and offload staging buffers (sim/offload.h)");
  s->add_flag("--ddp-buckets", a.ddp_buckets,
              "Without ZeRO: PyTorch DDP's gradient buckets (sim/runtime_overheads.h): a second copy of the gradients "
              "(a third at the activations' peak of the second step: the old buckets, held across DDP's rebuild; "
              "`whatif` times when they are released), "
              "bucketed all-reduces overlapped with the backward");
  s->add_option("--ddp-old-buckets", a.ddp_old_buckets,
                "With --ddp-buckets: at which of the second step's peaks DDP's old buckets, held across its rebuild "
                "until ProcessGroupNCCL's watchdog polls, are counted: none, activations (the backward's start; "
                "default), gradients (its end) or both. `whatif` times it; its --export records it");
  s->add_option("--recompute-every", a.recompute_every,
                "With --recompute full: checkpoint only every k-th block (selective activation checkpointing)")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxModelLayers));
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
  else if (a.accounting == "fsdp2") s.accounting = ZeroAccounting::kFsdp2;
  else
    throw InputError("--accounting: '" + excerpt(a.accounting) + "': expected zero, deepspeed, megatron, fsdp2 or auto");
  s.sequence_parallel = a.sequence_parallel;
  s.flash_attention = a.flash;
  s.deepspeed.model = a.deepspeed_buffers;
  s.ddp.model = a.ddp_buckets;
  if (!a.ddp_old_buckets.empty()) parse_old_buckets_phases(a.ddp_old_buckets, "--ddp-old-buckets", s.ddp);
  s.recompute_every = a.recompute_every;
  if (a.offload == "optimizer") s.offload_optimizer = true;
  else if (a.offload == "all") s.offload_optimizer = s.offload_params = true;
  else if (a.offload != "none") throw InputError("--offload: '" + excerpt(a.offload) + "': expected none, optimizer or all");
  if (s.offload_params && s.zero_stage < 3) throw InputError("--offload all: parameter offload needs --zero 3");
  if (a.framework_mb != kFrameworkFromProfiles)
    check_number(a.framework_mb, rules::non_negative_up_to(kMaxProfileMb), "--framework-mb");
  s.framework_bytes = a.framework_mb < 0 ? -1.0 : a.framework_mb * 1024 * 1024;
  s.context_parallel = std::max(1, a.context_parallel);
  s.overlap.grad_reduce = a.overlap_grad_reduce;
  s.overlap.param_gather = a.overlap_param_gather;
  s.overlap.grad_bucket_params = a.ddp_bucket_params;
  s.overlap.compute_slowdown = a.comm_slowdown;
  return s;
}

// ---------------------------------------------------------------- simulate

struct SimulateArgs {
  std::string plan, schedule = "1f1b", profiles, hostfile, clusterfile, hf_config, trace, json_out;
  std::string collectives = "measured";
  std::string cost_model = "sim";
  int max_profiled_bs = 0;  // --cost-model metis: 0, the profiles' largest
  int vp = 0;               // --vp: 0, the plan's virtual_stages
  double min_group_scale_variance = 1;
  int max_permute_len = 128;
  bool burst_clocks = false;
  SetupArgs setup;
  bool zero_given = false, recompute_given = false, schedule_given = false;  // else the plan file's setting
  bool precision_given = false, offload_given = false;                      // likewise
  std::string report, report_replay;  // --report FILE; `hetplan report --replay`
  std::string memory_headroom = kDefaultMemoryHeadroom;
};

// --report: the HTML page of the simulation (sim/report.h), with the replay's measurements if given.
void write_simulation_report(const SimulateArgs& a, const PlanFile& pf, const Cluster& cluster,
                             const PlanSimulation& sim, Schedule schedule) {
  MeasuredRun measured;
  if (!a.report_replay.empty()) measured = read_replay_json(a.report_replay);
  const ReportInput in{a.plan, to_string(schedule), &sim, rank_hosts(cluster, pf.plan),
                       a.report_replay.empty() ? nullptr : &measured};
  write_report_html(a.report, in);
  std::cout << "report: " << a.report << "\n";
}

// Each distinct rank's device memory in use, term by term (sim/device_memory.h): ranks alike in every
// term are printed once, with their ranks.
void print_device_memory_split(const PlanSimulation& sim, const DeviceMemoryOptions& dm) {
  std::cout << "device memory in use per rank (GiB): allocated peak + allocator reserve + framework + NCCL = total; "
            << "usable = the GPU's memory less the headroom ("
            << (dm.headroom_bytes > 0 ? fixed(dm.headroom_bytes / kGiB, 2) + " GiB"
                                      : fixed(100 * dm.headroom_fraction, 1) + "%")
            << ")\n| ranks | device | stage | allocated peak | allocator reserve | framework | NCCL | total | usable |\n"
            << "|---|---|---|---|---|---|---|---|---|\n";
  std::vector<bool> shown(sim.ranks.size(), false);
  for (std::size_t i = 0; i < sim.ranks.size(); ++i) {
    if (shown[i]) continue;
    const RankMemory& r = sim.ranks[i];
    const MemoryBreakdown& b = r.breakdown;
    std::string ranks;
    int run_start = -1, run_end = -1;  // ranks as runs "0-7,16-23"
    auto flush = [&] {
      if (run_start < 0) return;
      ranks += (ranks.empty() ? "" : ",") + std::to_string(run_start) +
               (run_end > run_start ? "-" + std::to_string(run_end) : std::string());
    };
    for (std::size_t k = i; k < sim.ranks.size(); ++k) {
      const RankMemory& q = sim.ranks[k];
      if (shown[k] || q.stage != r.stage || q.device != r.device || q.breakdown.gpu_total() != b.gpu_total() ||
          q.breakdown.nccl != b.nccl || q.usable_bytes != r.usable_bytes)
        continue;
      shown[k] = true;
      if (q.rank == run_end + 1 && run_start >= 0) {
        run_end = q.rank;
      } else {
        flush();
        run_start = run_end = q.rank;
      }
    }
    flush();
    std::cout << "| " << ranks << " | " << r.device << " | " << r.stage << " | " << fixed(b.allocated_peak() / kGiB, 2)
              << " | " << fixed(b.allocator_reserve / kGiB, 2) << " | " << fixed(b.framework / kGiB, 2) << " | "
              << fixed(b.nccl / kGiB, 2) << " | " << fixed(b.gpu_total() / kGiB, 2) << " | "
              << fixed(r.usable_bytes / kGiB, 2) << " |\n";
  }
}

// --cost-model metis: what the Metis formula predicts for the plan (metis/metis_estimate.h).
int run_simulate_metis(const SimulateArgs& a, const PlanFile& pf, const std::string& hostfile,
                       const std::string& clusterfile, const std::string& profile_dir) {
  if (!a.trace.empty()) throw InputError("--trace: the Metis formula has no schedule to trace; use --cost-model sim");
  const Cluster cluster = Cluster::load(hostfile, clusterfile);
  check_clusterfile_bandwidths(cluster.clusterfile(), cluster.clusterfile_path(),
                               parse_bandwidth_unit(a.setup.bandwidth_unit, "--bandwidth-unit"));
  const ProfileSet profiles = ProfileSet::load(profile_dir, pf.model.num_layers);
  MetisEstimateOptions o;
  o.max_profiled_batch_size = a.max_profiled_bs;
  o.min_group_scale_variance = a.min_group_scale_variance;
  o.max_permute_len = a.max_permute_len;
  const MetisEstimate e = metis_estimate(cluster, profiles, pf, o);

  std::cout << "plan: " << a.plan << " (" << pf.plan.device_groups.size() << " stages, " << pf.plan.batches
            << " micro-batches, gbs " << pf.gbs << "), cost model metis (the formula of search --cost-model metis)\n";
  if (e.costed) {
    const CostTerms& t = e.terms;
    std::cout << "iteration_ms: " << fixed(t.total, 3) << "\n";
    std::cout << "terms: execution " << fixed(t.execution, 3) << ", fb_sync " << fixed(t.fb_sync, 3)
              << ", parameter_update " << fixed(t.parameter_update, 3) << ", dp " << fixed(t.dp, 3) << ", pp "
              << fixed(t.pp, 3) << ", batch_generate " << fixed(t.batch_generate, 3) << "\n";
  } else {
    std::cout << "iteration_ms: skipped (Metis cannot cost this plan: " << e.skipped << ")\n";
  }
  if (e.label > 0) {
    std::cout << "search_label: the Metis search also visits this plan labelled as " << e.label
              << " stage(s) and costs only those then (the reference's quirk, metis/inter_stage.h): ";
    if (e.label_costed) std::cout << "iteration_ms " << fixed(e.label_terms.total, 3) << "\n";
    else std::cout << "skipped (" << e.label_skipped << ")\n";
  }
  if (e.visit_labels.empty())
    std::cout << "search: the Metis search never generates these device groups and micro-batches (outside its space)\n";
  if (pf.plan.cost > 0) std::cout << "plan_cost_ms: " << fixed(pf.plan.cost, 3) << " (the cost search recorded, by its cost model)\n";
  if (!e.memory_known) {
    std::cout << "memory: skipped (Metis cannot size this plan: " << e.memory_skipped << ")\n";
  } else {
    std::cout << "| stage | ranks | memory demand MB (each rank) | stage capacity MB (Metis checks against) |\n"
              << "|---|---|---|---|\n";
    int begin = 0;
    for (std::size_t s = 0; s < e.stage_memory_mb.size(); ++s) {
      const int end = begin + pf.plan.device_groups[s];
      std::cout << "| " << s << " | " << begin << "-" << end - 1 << " | " << fixed(e.stage_memory_mb[s], 1) << " | "
                << fixed(e.stage_capacity_mb[s], 1) << " |\n";
      begin = end;
    }
  }
  if (!a.json_out.empty()) {
    ordered_json j = metis_estimate_to_json(e);
    j["plan"] = plan_file_to_json(pf);
    write_json_file(a.json_out, j);
  }
  return 0;
}

int run_simulate(const SimulateArgs& a) {
  if (a.cost_model != "sim" && a.cost_model != "metis")
    throw InputError("--cost-model: '" + excerpt(a.cost_model) + "': expected sim (the default) or metis");
  const PlanFile pf = read_plan_file(a.plan);
  SetupArgs setup_args = a.setup;
  if (!a.zero_given && pf.zero_stage >= 0) setup_args.zero = pf.zero_stage;
  if (!a.recompute_given && !pf.recompute.empty()) setup_args.recompute = pf.recompute;
  if (!a.precision_given && !pf.precision.empty()) setup_args.precision = pf.precision;
  if (!a.offload_given && pf.offload_optimizer) setup_args.offload = pf.offload_params ? "all" : "optimizer";
  if (a.setup.accounting == "auto" && !pf.accounting.empty()) setup_args.accounting = pf.accounting;
  if (pf.deepspeed_buffers) setup_args.deepspeed_buffers = true;
  if (pf.ddp_buckets) setup_args.ddp_buckets = true;
  if (setup_args.ddp_old_buckets.empty()) setup_args.ddp_old_buckets = pf.ddp_old_buckets;
  // Sequence/context parallelism and overlap: the plan's, unless a flag says otherwise.
  setup_args.sequence_parallel = setup_args.sequence_parallel || pf.sequence_parallel;
  if (setup_args.context_parallel == 0) setup_args.context_parallel = pf.context_parallel;
  setup_args.overlap_grad_reduce = setup_args.overlap_grad_reduce || pf.overlap.grad_reduce;
  setup_args.overlap_param_gather = setup_args.overlap_param_gather || pf.overlap.param_gather;
  if (setup_args.ddp_bucket_params == 0) setup_args.ddp_bucket_params = pf.overlap.grad_bucket_params;
  const std::string hostfile = a.hostfile.empty() ? pf.hostfile : a.hostfile;
  const std::string clusterfile = a.clusterfile.empty() ? pf.clusterfile : a.clusterfile;
  const std::string profile_dir = a.profiles.empty() ? pf.profile_dir : a.profiles;
  if (hostfile.empty() || clusterfile.empty())
    throw InputError(a.plan + ": no 'hostfile'/'clusterfile' in the plan; pass --hostfile and --clusterfile");
  if (profile_dir.empty()) throw InputError(a.plan + ": no 'profile_dir' in the plan; pass --profiles");
  if (a.cost_model == "metis") return run_simulate_metis(a, pf, hostfile, clusterfile, profile_dir);
  const Cluster cluster = Cluster::load(hostfile, clusterfile);
  const ProfileSet profiles = ProfileSet::load(profile_dir, pf.model.num_layers);
  std::string warning;
  const ModelShape shape = plan_shape(pf, a.hf_config, a.plan, &warning);  // printed once the plan simulates

  SimulationOptions o;
  o.schedule = parse_schedule(!a.schedule_given && !pf.schedule.empty() ? pf.schedule : a.schedule, "--schedule");
  o.virtual_stages = a.vp > 0 ? a.vp : o.schedule == Schedule::kInterleaved1F1B ? pf.virtual_stages : 1;
  if (const std::string e = interleaving_error(o.schedule, static_cast<int>(pf.plan.device_groups.size()),
                                               pf.plan.batches, o.virtual_stages);
      !e.empty())
    throw InputError(a.plan + ": " + e + " (--schedule, --vp)");
  o.setup = as_profiled(make_setup(setup_args), profiles, a.setup.accounting != "auto", a.setup.flash);
  o.setup.grads_in_backward = pf.grads_in_backward;  // as the plan was costed (whatif --export)
  o.setup.fp32_residual = pf.fp32_residual;
  o.setup.eager_fp32_loss = pf.eager_fp32_loss;
  o.network.unit = parse_bandwidth_unit(a.setup.bandwidth_unit, "--bandwidth-unit");
  o.measured_collectives = parse_collectives(a.collectives);
  o.sustained_clocks = !a.burst_clocks;
  parse_memory_headroom(a.memory_headroom, "--memory-headroom", &o.device_memory);
  const PlanSimulator simulator(cluster, profiles, shape, pf.model.sequence_length, o);
  const PlanSimulation sim = simulator.simulate(pf.plan, pf.gbs);
  const TimelineResult& t = sim.timeline;
  if (!warning.empty()) std::cerr << "hetplan: warning: " << warning << "\n";

  std::cout << "plan: " << a.plan << " (" << pf.plan.device_groups.size() << " stages, " << pf.plan.batches
            << " micro-batches, gbs " << pf.gbs << "), schedule " << to_string(o.schedule) << ", ZeRO-"
            << o.setup.zero_stage << ", recompute " << to_string(o.setup.recompute)
            << (o.setup.sequence_parallel ? ", sequence parallel" : "")
            << (o.setup.context_parallel > 1 ? ", cp " + std::to_string(o.setup.context_parallel) : std::string())
            << (o.setup.overlap.grad_reduce ? ", overlapped grad reduce" : "")
            << (o.setup.overlap.param_gather ? ", overlapped param gather" : "")
            << (o.virtual_stages > 1 ? ", " + std::to_string(o.virtual_stages) + " virtual stages per rank" : "") << "\n";
  std::cout << "iteration_ms: " << fixed(t.iteration_ms, 3) << "\n";
  std::cout << "bubble_fraction: " << fixed(t.bubble_fraction, 4) << "\n";
  std::cout << "tokens_per_s: " << fixed(t.tokens_per_s, 1) << "\n";
  std::cout << "mfu: " << (t.mfu >= 0 ? fixed(t.mfu, 4) : std::string("unknown (a GPU type without a datasheet entry)"))
            << "\n";
  for (const auto& line : simulator.collective_sources()) std::cout << "network: " << line << "\n";
  // The compute stretch beside overlapped collectives, and where it came from (sim/dp_overlap.md, "SM sharing").
  const OverlapSlowdowns& probed = profiles.overlap_slowdowns();
  const bool forced = o.setup.overlap.compute_slowdown > 0;
  const double stretch_reduce = forced ? o.setup.overlap.compute_slowdown : probed.reduce;
  const double stretch_gather = forced ? o.setup.overlap.compute_slowdown : probed.gather;
  const std::string stretch_source = forced ? "--comm-slowdown"
                                     : profiles.overlap_measured() ? profile_dir + "/" + kOverlapProbeFile
                                                                   : "default (kCommComputeSlowdown)";
  if (o.setup.overlap.any())
    std::cout << "overlap: compute beside reductions x" << fixed(stretch_reduce, 3) << ", beside gathers x"
              << fixed(stretch_gather, 3) << " (" << stretch_source << ")\n";
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
  print_device_memory_split(sim, o.device_memory);
  if (sim.fits) {
    std::cout << "memory: every rank fits\n";
  } else {
    const RankMemory& r = sim.ranks[sim.first_oom_rank];
    std::cout << "memory: OUT OF MEMORY on rank " << r.rank << " (" << r.device << ", stage " << r.stage << "): needs "
              << fixed(r.breakdown.gpu_total() / kGiB, 2) << " GiB of the " << fixed(r.usable_bytes / kGiB, 2)
              << " GiB its " << fixed(r.capacity_bytes / kGiB, 2) << " GiB leave after the headroom\n";
  }
  if (!a.trace.empty()) write_json_file(a.trace, chrome_trace(t, sim.stages));
  if (!a.report.empty()) write_simulation_report(a, pf, cluster, sim, o.schedule);
  if (!a.json_out.empty()) {
    ordered_json j = simulation_to_json(sim);
    j["schedule"] = to_string(o.schedule);
    j["virtual_stages"] = o.virtual_stages;
    j["zero_stage"] = o.setup.zero_stage;
    j["recompute"] = to_string(o.setup.recompute);
    j["network"] = simulator.collective_sources();
    if (o.setup.overlap.any())
      j["overlap_compute_slowdown"] = {{"reduce", stretch_reduce}, {"gather", stretch_gather}, {"source", stretch_source}};
    // The plan as simulated: its file's keys with the flags' sequence/context parallelism and overlap.
    PlanFile simulated = pf;
    simulated.sequence_parallel = o.setup.sequence_parallel;
    simulated.context_parallel = o.setup.context_parallel;
    simulated.overlap = o.setup.overlap;
    j["plan"] = plan_file_to_json(simulated);
    write_json_file(a.json_out, j);
  }
  return 0;
}

// ------------------------------------------------------------------ whatif

struct WhatifArgs {
  std::string gpu = "A100", hostfile, clusterfile, json_out, profiles, rows, export_dir;
  std::vector<std::string> gpu_spec;
  ModelFlags model;  // whatif's defaults: ModelFlags's, max positions 4096 (set where the flags are registered)
  bool print_constants = false;
  int seq = 2048, micro_batch = 1, gpus = 8, gpus_per_node = 8, gbs = 0;
  double efficiency = 0.6, memory_efficiency = 0.75, cpu_memory_gb = 1024, memory_gb = 0;
  double intra_gbs = 0, inter_gbs = 25, h2d_gbs = 0, d2h_gbs = 0, cpu_adam_params_per_s = 0;
  int lora_rank = 16;
  std::string lora_targets = "qv";
  // --inference
  bool inference = false;
  int prompt = 512, output = 128;
  std::string weights = "bf16,fp16,int8,nf4,awq";
  std::string kv_cache = "auto";
  // Runtime overheads (sim/runtime_overheads.h)
  std::string runtime = "eager";
  double eager_op_us = 0, graph_kernel_us = 0;
  std::string host_probe;
  double host_speed = 1;
  bool unfused_attention = false;
  std::string deepspeed_config;
  bool micro_batch_given = false, gbs_given = false;
  SetupArgs setup;
};

// --deepspeed-config, read and its "auto" sizes resolved for the model; empty path when not given.
DeepSpeedRunConfig whatif_deepspeed_config(const WhatifArgs& a, const ModelShape& m) {
  DeepSpeedRunConfig c;
  if (a.deepspeed_config.empty()) return c;
  c = read_deepspeed_config(a.deepspeed_config);
  resolve_deepspeed_auto(c, m.hidden_size);
  return c;
}

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

void check_flag(long long v, double lo, double hi, const char* flag) {
  check_integer(static_cast<double>(v), rules::int_in(lo, hi), flag);
}

void check_whatif_flags(const WhatifArgs& a) {
  check_model_shape_flags(a.model);
  check_flag(a.model.max_positions, 1, static_cast<double>(kMaxSequenceLength), "--max-positions");
  check_flag(a.model.blocks, 1, kMaxModelBlocks, "--layers");
  check_flag(a.seq, 1, static_cast<double>(kMaxSequenceLength), "--seq");
  check_flag(a.micro_batch, 1, kMaxGlobalBatch, "--micro-batch");
  check_flag(a.gbs, 0, kMaxGlobalBatch, "--gbs");
  check_flag(a.gpus, 1, kMaxReplicas, "--gpus");  // every row runs all its GPUs in data parallelism
  check_flag(a.gpus_per_node, 1, kMaxSlotsPerNode, "--gpus-per-node");
  check_flag(a.lora_rank, 1, static_cast<double>(kMaxHiddenSize), "--lora-rank");
  check_flag(a.prompt, 1, static_cast<double>(kMaxSequenceLength), "--prompt");
  check_flag(a.output, 1, static_cast<double>(kMaxSequenceLength), "--output");
  check_number(a.efficiency, rules::positive_up_to(1), "--efficiency");
  check_number(a.memory_efficiency, rules::positive_up_to(1), "--memory-efficiency");
  check_number(a.cpu_memory_gb, rules::positive_up_to(1e9), "--cpu-memory-gb");
  check_number(a.memory_gb, rules::non_negative_up_to(kMaxGpuMemoryGb), "--memory-gb");
  check_number(a.cpu_adam_params_per_s, rules::non_negative_up_to(1e15), "--cpu-adam-params-per-s");
  // The one bandwidth rule (sim/network.h); 0 means "the catalogue's / the profile's / the default".
  check_bandwidth(a.inter_gbs, BandwidthUnit::kGBps, "--inter-gbs");
  if (a.intra_gbs != 0) check_bandwidth(a.intra_gbs, BandwidthUnit::kGBps, "--intra-gbs");
  if (a.h2d_gbs != 0) check_bandwidth(a.h2d_gbs, BandwidthUnit::kGBps, "--h2d-gbs");
  if (a.d2h_gbs != 0) check_bandwidth(a.d2h_gbs, BandwidthUnit::kGBps, "--d2h-gbs");
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : "; ") + s;
  return out;
}

int run_whatif_inference(const WhatifArgs& a, const WhatifInput& in, const TrainingSetup& base) {
  const GpuSpec& g = *in.gpu;
  ordered_json rows = ordered_json::array();
  const double hbm_bf16 = in.calibration.decode_hbm_efficiency_bf16;
  const double hbm_int4 = in.calibration.decode_hbm_efficiency_int4;
  const double prefill = in.calibration.prefill_compute_efficiency;
  std::cout << "model: " << in.shape.name << " (" << fixed(in.shape.parameter_count() / 1e9, 3) << "B parameters), 1 x "
            << g.name << " (" << fixed(in.memory_gb > 0 ? in.memory_gb : g.memory_gb, 0) << " GB, "
            << fixed(g.memory_bw_gbs, 0) << " GB/s; " << g.source_url << "), batch " << a.micro_batch << ", prompt "
            << a.prompt << ", output " << a.output << "\n"
            << "roofline: prefill = max(FLOPs / (16-bit peak x compute eff.), bytes / (HBM x eff.)); decode step = "
               "max(weights + KV bytes / (HBM x eff.), FLOPs / (peak x eff.)) + measured per-kernel floor and int4 "
               "per-row dequantisation where calibrated, mean over the output\n\n"
            << "| weights | TTFT ms | decode ms/token | tokens/s | weights GiB | KV cache GiB | total GiB | fits | "
               "assumptions |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const std::string& w : split_list(a.weights)) {
    InferenceSetup s;
    s.weights = parse_weight_format(w, "--weights");
    s.batch = a.micro_batch;
    s.prompt = a.prompt;
    s.output = a.output;
    s.framework_bytes = base.framework_bytes;
    const bool int4 = s.weights == WeightFormat::kInt4Nf4 || s.weights == WeightFormat::kInt4Awq;
    const double measured = int4 ? hbm_int4 : hbm_bf16;
    s.hbm_efficiency = measured > 0 ? measured : kDefaultDecodeHbmEfficiency;
    s.compute_efficiency = prefill > 0 ? prefill : kDefaultPrefillComputeEfficiency;
    s.assumptions.push_back("HBM efficiency " + fixed(s.hbm_efficiency, 2) +
                            (measured > 0 ? " measured (" + in.calibration.path + ")" : std::string(" (default)")));
    s.assumptions.push_back("compute efficiency " + fixed(s.compute_efficiency, 2) +
                            (prefill > 0 ? " measured" : std::string(" (default)")));
    if (int4) s.assumptions.push_back("dequantised inside the GEMV/GEMM kernel (fused; packed bytes move)");
    if (s.weights == WeightFormat::kInt8) s.assumptions.push_back("weight-only int8 (W8A16), fused dequantisation");
    const WhatifCalibration& c = in.calibration;
    s.launch = in.launch;
    // A measured GEMV efficiency from before the floor was charged to every kernel holds the GEMVs' floor.
    s.streamed_kernels_pay_floor = !(measured > 0 && !c.decode_hbm_efficiency_net_of_floor);
    s.kernels_per_layer = c.decode_kernels_per_layer;
    // Hugging Face's eager and SDPA attention materialise repeat_kv; generate's default cache is dynamic
    // (the context is read), a graph-captured decoder needs a static one (the whole allocation is read).
    s.kv_repeat_materialised = c.path.empty() ? true : c.kv_repeat_materialised;
    s.static_kv_cache = a.kv_cache == "auto" ? (c.path.empty() ? in.launch.runtime == LaunchRuntime::kGraphs
                                                               : c.static_kv_cache)
                                             : a.kv_cache == "static";
    s.attention_hbm_efficiency = c.attention_hbm_efficiency;
    if (s.attention_hbm_efficiency > 0)
      s.assumptions.push_back("attention HBM efficiency " + fixed(s.attention_hbm_efficiency, 2) + " measured");
    if (int4) s.int4_row_params_per_s = c.int4_row_params_per_s;
    if (int4 && s.int4_row_params_per_s > 0)
      s.assumptions.push_back("int4 kernel's per-row dequantisation " + fixed(s.int4_row_params_per_s / 1e12, 2) +
                              "e12 params/s per batch row (measured)");
    s.assumptions.push_back(
        std::string("KV cache 16-bit") + (s.static_kv_cache ? ", static (the whole allocation read each step)" : "") +
        (s.kv_repeat_materialised ? ", GQA repeat materialised (HF repeat_kv)" : "") + "; " +
        (s.kernels_per_layer > 0 ? fixed(s.kernels_per_layer, 1) + " kernels per layer (measured)"
                                 : fixed(hf_decode_kernels_per_layer(in.shape), 0) + " kernels per layer + " +
                                       fixed(hf_decode_kernels_per_step(in.shape), 0) +
                                       " per step (Hugging Face eager decoder)") +
        "; runtime: " + s.launch.describe());
    const InferenceResult r = cost_inference(in.shape, g, s, in.memory_gb);
    const std::string as = r.offered ? joined(r.assumptions) : "not offered: " + r.not_offered;
    if (!r.offered) {
      std::cout << "| " << w << " | - | - | - | - | - | - | - | " << as << " |\n";
    } else {
      std::cout << "| " << w << " | " << fixed(r.ttft_ms, 2) << " | " << fixed(r.decode_ms_per_token, 3) << " | "
                << fixed(r.tokens_per_s, 1) << " | " << fixed(r.weights_bytes / kGiB, 2) << " | "
                << fixed(r.kv_cache_bytes / kGiB, 3) << " | " << fixed(r.total_bytes() / kGiB, 2) << " | "
                << (r.fits ? "yes" : "no") << " | " << as << " |\n";
    }
    rows.push_back({{"weights", w},
                    {"offered", r.offered},
                    {"not_offered", r.not_offered},
                    {"ttft_ms", r.ttft_ms},
                    {"decode_ms_per_token", r.decode_ms_per_token},
                    {"tokens_per_s", r.tokens_per_s},
                    {"weights_bytes", r.weights_bytes},
                    {"kv_cache_bytes", r.kv_cache_bytes},
                    {"activation_bytes", r.activation_bytes},
                    {"framework_bytes", r.framework_bytes},
                    {"total_bytes", r.total_bytes()},
                    {"fits", r.fits},
                    {"assumptions", r.assumptions}});
  }
  if (!a.json_out.empty()) {
    ordered_json j;
    j["mode"] = "inference";
    j["model"] = in.shape.name;
    j["parameters"] = in.shape.parameter_count();
    j["gpu"] = g.name;
    j["gpu_source"] = g.source_url;
    j["batch"] = a.micro_batch;
    j["prompt"] = a.prompt;
    j["output"] = a.output;
    j["rows"] = rows;
    write_json_file(a.json_out, j);
  }
  return 0;
}

// A --hostfile's GPUs: all of them, paced by the slowest type by 16-bit peak (returned), with the
// clusterfile's slowest links and smallest memory.
std::string whatif_hostfile_gpus(const WhatifArgs& a, BandwidthUnit unit, WhatifInput& in) {
  if (a.clusterfile.empty()) throw InputError("--hostfile needs --clusterfile");
  const Cluster c = Cluster::load(a.hostfile, a.clusterfile);
  check_clusterfile_bandwidths(c.clusterfile(), c.clusterfile_path(), unit);
  std::string gpu;
  in.gpus = c.num_devices();
  double slowest = 1e300, intra = 1e300, inter = 1e300, capacity = 1e300;
  in.gpus_per_node = 0;
  for (const ClusterNode& n : c.nodes()) {
    const std::string& t = c.device_types()[n.type];
    const GpuSpec& g = require_gpu_spec(t, a.clusterfile + ": device type");
    if (g.peak_tflops < slowest) slowest = g.peak_tflops, gpu = t;
    in.gpus_per_node = std::max(in.gpus_per_node, n.num_devices);
    intra = std::min(intra, bytes_per_second(n.intra_bandwidth, unit) / 1e9);
    inter = std::min(inter, bytes_per_second(n.inter_bandwidth, unit) / 1e9);
    capacity = std::min(capacity, c.memory_mb(n.type) / 1024.0);
  }
  in.intra_gbs = intra, in.inter_gbs = inter, in.memory_gb = capacity;
  return gpu;
}

// The flags as a WhatifInput: the model, the batch, the GPUs (a type and count, or a hostfile), the
// efficiencies and the calibration with the host flags over it.
WhatifInput whatif_input(const WhatifArgs& a) {
  for (const auto& f : a.gpu_spec) load_gpu_spec_file(f);
  check_whatif_flags(a);
  WhatifInput in;
  in.shape = shape_from_flags(a.model, a.seq);
  in.seq = a.seq;
  in.micro_batch = a.micro_batch;
  in.gbs = a.gbs;
  in.gpus = a.gpus;
  in.gpus_per_node = a.gpus_per_node;
  in.memory_gb = a.memory_gb;
  in.intra_gbs = a.intra_gbs;
  in.inter_gbs = a.inter_gbs;
  in.cpu_memory_gb = a.cpu_memory_gb;
  in.gemm_efficiency = a.efficiency;
  in.memory_efficiency = a.memory_efficiency;
  // A DeepSpeed config's batch: train_micro_batch_size_per_gpu and gradient_accumulation_steps, where the flags
  // do not set them (a flag that contradicts the config is an error naming both).
  const DeepSpeedRunConfig ds = whatif_deepspeed_config(a, in.shape);
  if (ds.micro_batch > 0) {
    if (a.micro_batch_given && a.micro_batch != ds.micro_batch)
      throw InputError("--micro-batch " + std::to_string(a.micro_batch) + " contradicts " + a.deepspeed_config +
                       ": key 'train_micro_batch_size_per_gpu' (" + std::to_string(ds.micro_batch) + ")");
    in.micro_batch = ds.micro_batch;
  }
  in.calibration = read_whatif_calibration(a.profiles);
  // The host the probe measured (its offload figures, where it has them) over the profile's calibration.
  if (!a.host_probe.empty()) read_host_probe_offload(a.host_probe, in.calibration.host);
  if (a.h2d_gbs > 0) in.calibration.host.h2d_bytes_per_s = a.h2d_gbs * 1e9;
  if (a.d2h_gbs > 0) in.calibration.host.d2h_bytes_per_s = a.d2h_gbs * 1e9;
  if (a.cpu_adam_params_per_s > 0) in.calibration.host.cpu_adam_params_per_s = a.cpu_adam_params_per_s;
  if (a.h2d_gbs > 0 || a.d2h_gbs > 0 || a.cpu_adam_params_per_s > 0) in.calibration.host.source = "flags";
  in.launch.runtime = parse_launch_runtime(a.runtime, "--runtime");
  if (in.calibration.kernel_floor_us > 0 || in.calibration.eager_op_us > 0) in.launch.source = "measured (" + in.calibration.path + ")";
  if (in.calibration.kernel_floor_us > 0) in.launch.graph_kernel_us = in.calibration.kernel_floor_us;
  if (!a.host_probe.empty()) in.launch.host = read_host_probe(a.host_probe);
  if (a.host_speed != 1) in.launch.host = scaled_host_costs(in.launch.host, a.host_speed);
  if (in.calibration.eager_op_us > 0) {
    in.launch.host.nograd_op_us = in.calibration.eager_op_us;
    in.launch.host.source += "; eager op " + fixed(in.calibration.eager_op_us, 2) + " us (" + in.calibration.path + ")";
  }
  if (a.graph_kernel_us > 0) in.launch.graph_kernel_us = a.graph_kernel_us, in.launch.source = "flags";
  if (a.eager_op_us > 0) {
    in.launch.host.nograd_op_us = a.eager_op_us;
    in.launch.host.source += "; eager op " + fixed(a.eager_op_us, 2) + " us (--eager-op-us)";
  }
  if (a.kv_cache != "auto" && a.kv_cache != "static" && a.kv_cache != "dynamic")
    throw InputError("--kv-cache: '" + excerpt(a.kv_cache) + "': expected auto, static or dynamic");
  const BandwidthUnit unit = parse_bandwidth_unit(a.setup.bandwidth_unit, "--bandwidth-unit");
  const std::string gpu = a.hostfile.empty() ? a.gpu : whatif_hostfile_gpus(a, unit, in);
  in.gpu = &require_gpu_spec(gpu, "--gpu");
  in.gpus_per_node = std::min(in.gpus_per_node, in.gpus);
  if (ds.accumulation > 0 && !a.gbs_given) in.gbs = in.micro_batch * in.gpus * ds.accumulation;
  return in;
}

// The base setup of the rows. --precision auto: bf16 where the GPU has it, else fp16 (V100); a precision it
// lacks is an error.
TrainingSetup whatif_base_setup(const WhatifArgs& a, const GpuSpec& g, const DeepSpeedRunConfig& ds) {
  SetupArgs setup_args = a.setup;
  if (setup_args.precision == "auto" && !ds.path.empty()) setup_args.precision = ds.precision;  // its fp16/bf16
  if (setup_args.precision == "auto") setup_args.precision = g.supports(ComputePrecision::kBf16) ? "bf16" : "fp16";
  // Fused attention (SDPA, flash) is what PyTorch, DeepSpeed and Transformers run: on unless --unfused-attention.
  setup_args.flash = !a.unfused_attention;
  // --offload is for the ZeRO rows (which set their own stage): not checked against --zero here.
  setup_args.offload = "none";
  TrainingSetup base = make_setup(setup_args);
  if (a.setup.offload == "optimizer") base.offload_optimizer = true;
  else if (a.setup.offload == "all") base.offload_optimizer = base.offload_params = true;
  else if (a.setup.offload != "none")
    throw InputError("--offload: '" + excerpt(a.setup.offload) + "': expected none, optimizer or all");
  if (!ds.path.empty()) base.deepspeed = ds.buffers;  // the DeepSpeed rows' sizes and pinning
  base.deepspeed.model = false;
  if (a.setup.precision != "auto") require_peak(g, compute_precision(base.precision), "--precision " + a.setup.precision);
  return base;
}

// The standard rows, or the --rows named, in the order named.
std::vector<WhatifRow> whatif_rows(const WhatifArgs& a, const TrainingSetup& base, int gpus_per_node,
                                   const DeepSpeedRunConfig& ds) {
  std::vector<WhatifRow> rows = standard_whatif_rows(base, a.lora_rank, parse_targets(a.lora_targets), gpus_per_node,
                                                     a.setup.accounting != "auto");
  if (!ds.path.empty()) rows.insert(rows.begin(), deepspeed_config_row(base, ds, a.setup.accounting != "auto"));
  if (a.rows.empty()) return rows;
  std::vector<WhatifRow> chosen;
  for (const std::string& name : split_list(a.rows)) {
    auto it = std::find_if(rows.begin(), rows.end(), [&](const WhatifRow& r) { return r.name == name; });
    if (it == rows.end()) {
      std::string known;
      for (const auto& r : rows) known += (known.empty() ? "" : ", ") + r.name;
      throw InputError("--rows: '" + excerpt(name) + "': expected some of " + known);
    }
    chosen.push_back(*it);
  }
  return chosen;
}

void print_whatif_header(const WhatifArgs& a, const WhatifInput& in, int gbs) {
  const double params = static_cast<double>(in.shape.parameter_count());
  std::cout << "model: " << in.shape.name << " (" << fixed(params / 1e9, 3) << "B parameters), " << in.gpus << " x "
            << in.gpu->name << " (" << fixed(in.memory_gb > 0 ? in.memory_gb : in.gpu->memory_gb, 0)
            << " GB; datasheet: " << in.gpu->source_url << "), seq " << a.seq << ", micro-batch " << in.micro_batch
            << " per GPU, gbs " << gbs << "\n"
            << "cost: each row is a one-stage plan through the simulator (as `simulate`), layer times a roofline: "
               "GEMMs at the row's dense peak x "
            << fixed(in.calibration.gemm_efficiency > 0 ? in.calibration.gemm_efficiency : a.efficiency, 2)
            << ", attention at the 16-bit peak x "
            << fixed(in.calibration.attention_efficiency > 0
                         ? in.calibration.attention_efficiency
                         : (in.calibration.gemm_efficiency > 0 ? in.calibration.gemm_efficiency : a.efficiency),
                     2)
            << ", elementwise traffic at HBM x "
            << fixed(in.calibration.elementwise_efficiency > 0 ? in.calibration.elementwise_efficiency
                                                                : a.memory_efficiency,
                     2)
            << "\n";
  if (!in.calibration.path.empty()) std::cout << "calibration: " << in.calibration.path << "\n";
  std::cout << "\n| strategy | GPUs | memory/GPU GiB | CPU/node GiB | step ms | tokens/s | fits | assumptions |\n"
            << "|---|---|---|---|---|---|---|---|\n";
}

// The row's setup in words, then its assumptions.
std::vector<std::string> row_assumptions(const WhatifRow& row, const WhatifResult& r) {
  std::ostringstream setup;
  setup << row.framework << ", " << to_string(row.setup.precision) << ", ZeRO-" << row.setup.zero_stage
        << ", recompute " << to_string(row.setup.recompute);
  if (row.setup.recompute == Recompute::kFull && row.setup.recompute_every > 1)
    setup << " every " << row.setup.recompute_every;
  std::vector<std::string> assumptions{setup.str()};
  for (const auto& s : r.assumptions) assumptions.push_back(s);
  return assumptions;
}

// Prints one costed row of the table and returns it as JSON.
ordered_json print_whatif_row(const WhatifRow& row, const WhatifResult& r) {
  if (!r.offered) {
    std::cout << "| " << r.name << " | " << r.gpus << " | - | - | - | - | - | not offered: " << r.not_offered
              << " |\n";
    return {{"strategy", r.name}, {"offered", false}, {"not_offered", r.not_offered}};
  }
  const std::vector<std::string> assumptions = row_assumptions(row, r);
  const double gpu_bytes = r.memory.gpu_total();
  std::cout << "| " << r.name << " | " << r.gpus << " | " << fixed(gpu_bytes / kGiB, 2) << " | "
            << fixed(r.memory.cpu_per_node() / kGiB, 1) << " | " << fixed(r.step_ms, 1) << " | "
            << fixed(r.tokens_per_s, 0) << " | " << (r.fits ? "yes" : "no") << " | " << joined(assumptions) << " |\n";
  return {{"strategy", r.name},
          {"offered", true},
          {"framework", row.framework},
          {"gpus", r.gpus},
          {"gbs", r.gbs},
          {"accumulation", r.accumulation},
          {"zero_stage", row.setup.zero_stage},
          {"precision", to_string(row.setup.precision)},
          {"recompute", to_string(row.setup.recompute)},
          {"recompute_every", row.setup.recompute_every},
          {"offload_optimizer", row.setup.offload_optimizer},
          {"offload_params", row.setup.offload_params},
          {"memory_per_gpu_bytes", gpu_bytes},
          {"weights_bytes", r.memory.states.weights},
          {"gradients_bytes", r.memory.states.gradients},
          {"optimizer_bytes", r.memory.states.optimizer},
          {"transient_bytes", r.memory.states.transient + r.memory.recompute_workspace},
          {"activations_bytes", r.memory.activations},
          {"framework_bytes", r.memory.framework},
          {"cpu_per_node_bytes", r.memory.cpu_per_node()},
          {"step_ms", r.step_ms},
          {"gpu_ms", r.gpu_ms},
          {"host_ms", r.host_ms},
          {"tokens_per_s", r.tokens_per_s},
          {"mfu", r.mfu},
          {"fits", r.fits},
          {"assumptions", assumptions}};
}

void write_whatif_json(const WhatifArgs& a, const WhatifInput& in, int gbs, ordered_json rows) {
  ordered_json j;
  j["model"] = in.shape.name;
  j["parameters"] = in.shape.parameter_count();
  j["gpu"] = in.gpu->name;
  j["gpu_source"] = in.gpu->source_url;
  j["gpus"] = in.gpus;
  j["gpu_memory_gb"] = in.memory_gb > 0 ? in.memory_gb : in.gpu->memory_gb;
  j["sequence_length"] = a.seq;
  j["micro_batch"] = in.micro_batch;
  j["gbs"] = gbs;
  j["gemm_efficiency"] = in.calibration.gemm_efficiency > 0 ? in.calibration.gemm_efficiency : a.efficiency;
  j["memory_efficiency"] = a.memory_efficiency;
  j["calibration"] = in.calibration.path;
  j["rows"] = std::move(rows);
  write_json_file(a.json_out, j);
}

// --print-constants: the model's and the roofline's constants as JSON, on stdout and to --json.
int print_whatif_constants(const WhatifArgs& a, const WhatifInput& in) {
  const ordered_json j = whatif_constants_json(in);
  std::cout << j.dump(2) << "\n";
  if (!a.json_out.empty()) write_json_file(a.json_out, j);
  return 0;
}

int run_whatif(const WhatifArgs& a) {
  const WhatifInput in = whatif_input(a);
  if (a.print_constants) return print_whatif_constants(a, in);
  const DeepSpeedRunConfig ds = whatif_deepspeed_config(a, in.shape);
  const TrainingSetup base = whatif_base_setup(a, *in.gpu, ds);
  if (a.inference) return run_whatif_inference(a, in, base);
  const std::vector<WhatifRow> rows = whatif_rows(a, base, in.gpus_per_node, ds);
  if (!a.export_dir.empty()) {
    if (rows.size() != 1) throw InputError("--export: name one row with --rows");
    export_whatif_row(in, rows[0], a.export_dir);
  }
  const int gbs = whatif_accumulation(in) * in.micro_batch * in.gpus;  // validates the batch before any output
  print_whatif_header(a, in, gbs);
  ordered_json out_rows = ordered_json::array();
  for (const WhatifRow& row : rows) out_rows.push_back(print_whatif_row(row, cost_whatif_row(in, row)));
  if (!a.json_out.empty()) write_whatif_json(a, in, gbs, std::move(out_rows));
  return 0;
}

}  // namespace

int run_simulate_with_report(const std::string& plan, const std::string& replay, const std::string& out,
                             const std::string& hf_config) {
  SimulateArgs a;
  a.plan = plan;
  a.hf_config = hf_config;
  a.report = out;
  a.report_replay = replay;
  a.setup.framework_mb = kFrameworkFromProfiles;  // as `simulate` (its --framework-mb default)
  if (!replay.empty()) read_replay_json(replay);  // a broken replay fails before the simulation
  return run_simulate(a);
}

Runner add_simulate_command(CLI::App& app) {
  auto a = std::make_shared<SimulateArgs>();
  CLI::App* s = app.add_subcommand(
      "simulate",
      "Simulate one plan (an entry of `search --json`) as a GPipe, 1F1B or interleaved 1F1B task graph: iteration\n"
      "time, bubble,\n"
      "per-stage busy time, per-rank peak memory, tokens/s, MFU, and a Chrome trace.");
  s->add_option("--plan", a->plan, "Plan JSON: an entry of `hetplan search --json` (or the whole file: its best)")
      ->required();
  s->add_option("--schedule", a->schedule,
                "Pipeline schedule: gpipe, 1f1b or interleaved (Megatron's interleaved 1F1B; default: the plan's, "
                "else 1f1b)")
      ->capture_default_str();
  s->add_option("--vp", a->vp,
                "With --schedule interleaved: virtual stages (model chunks) per pipeline rank; each stage's layers "
                "split evenly into them (default: the plan's virtual_stages)")
      ->check(CLI::Range(2, 64));
  s->add_option("--profiles", a->profiles, "Profile folder (default: the plan's profile_dir)");
  s->add_option("--hostfile", a->hostfile, "Hostfile (default: the plan's)");
  s->add_option("--clusterfile", a->clusterfile, "Clusterfile (default: the plan's)");
  s->add_option("--hf-config", a->hf_config,
                "Hugging Face config.json for the model shape (default: the plan's model.architecture; given, it "
                "must match it; a plan without one: its GPT)");
  s->add_option("--trace", a->trace, "Write a Chrome trace (Perfetto) to this file");
  s->add_option("--report", a->report,
                "Write an HTML report to this file: the plan, a timeline per rank, memory per rank (as `hetplan report`)");
  s->add_option("--collectives", a->collectives,
                "Intra-node all-reduce bandwidth: measured (the profiles' communication.allreduce_busbw_gbs where "
                "present, taken net of the measured calls' latency, which the network model charges per "
                "collective itself) or clusterfile (its intra_bandwidth)")
      ->capture_default_str();
  s->add_flag("--burst-clocks", a->burst_clocks,
              "Cost every stage at the profiles' burst timings (by default the pace-setting stage runs at the "
              "sustained, power-limited pace the profiler measured, where it did)");
  s->add_option("--json", a->json_out, "Write the results as JSON to this file");
  s->add_option("--cost-model,--cost_model", a->cost_model,
                "sim (the simulator) or metis: the Metis reference's iteration cost and per-stage memory demand for "
                "the plan, as `search --cost-model metis` computes them (the setup, schedule and network options "
                "do not apply to it)")
      ->capture_default_str();
  s->add_option("--max_profiled_batch_size,--max-profiled-batch-size", a->max_profiled_bs,
                "With --cost-model metis: as search's (a mixed stage's batch slice above it is not costed); "
                "default: the profiles' largest")
      ->check(CLI::Range(0, kMaxProfileBs));
  s->add_option("--min_group_scale_variance,--min-group-scale-variance", a->min_group_scale_variance,
                "With --cost-model metis: as search's (which device groups its search visits)")
      ->capture_default_str()
      ->check(kPositiveNumber);
  s->add_option("--max_permute_len,--max-permute-len", a->max_permute_len,
                "With --cost-model metis: as search's (which device groups its search visits)")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxModelLayers));
  add_setup_options(s, a->setup, kFrameworkFromProfiles);
  add_parallel_options(s, a->setup);
  add_memory_headroom_option(s, &a->memory_headroom);
  CLI::Option* zero = s->get_option("--zero");
  CLI::Option* recompute = s->get_option("--recompute");
  CLI::Option* schedule = s->get_option("--schedule");
  CLI::Option* precision = s->get_option("--precision");
  CLI::Option* offload = s->get_option("--offload");
  return [a, zero, recompute, schedule, precision, offload] {
    // A plan from `search --cost-model sim --zero/--recompute auto` carries
    // the setting it was costed with; the flags, when given, win.
    a->zero_given = zero->count() > 0;
    a->recompute_given = recompute->count() > 0;
    a->schedule_given = schedule->count() > 0;
    a->precision_given = precision->count() > 0;
    a->offload_given = offload->count() > 0;
    return run_simulate(*a);
  };
}

Runner add_whatif_command(CLI::App& app) {
  auto a = std::make_shared<WhatifArgs>();
  CLI::App* s = app.add_subcommand(
      "whatif",
      "Memory per GPU, step time and tokens/s of the usual training setups (single GPU, DDP, ZeRO-1/2/3 with or\n"
      "without offload, FSDP full/hybrid, fp32/fp16/bf16/FP8, every-2nd-layer checkpointing, torch.compile,\n"
      "LoRA/QLoRA alone or with ZeRO-2/3, an 8- or 4-bit base with 8-bit Adam) for one model on one GPU type of\n"
      "the catalogue, each costed by the simulator `simulate` uses. With --inference: TTFT, decode latency and\n"
      "memory for bf16/fp16 and weight-only int8/int4.");
  a->model.max_positions = 4096;
  add_model_shape_flags(s, a->model);
  CLI::Option* layers = s->add_option("--layers", a->model.blocks, "Transformer blocks")->capture_default_str();
  s->add_option("--max-positions", a->model.max_positions, "Max positions (learned for gpt2; at least --seq)")
      ->capture_default_str();
  s->add_option("--seq", a->seq, "Sequence length")->capture_default_str()->check(kPositiveNumber);
  CLI::Option* micro_batch =
      s->add_option("--micro-batch", a->micro_batch, "Sequences per GPU per micro-batch (--inference: the batch)")
          ->capture_default_str()
          ->check(kPositiveNumber);
  CLI::Option* gbs =
      s->add_option("--gbs", a->gbs, "Global batch (default: micro-batch x GPUs; more means gradient accumulation)");
  s->add_option("--deepspeed-config", a->deepspeed_config,
                "A DeepSpeed ds_config.json: adds its row (ds_config: zero_optimization.stage, offload_optimizer/"
                "offload_param device and pin_memory) first, gives every DeepSpeed row its reduce_bucket_size, "
                "allgather_bucket_size, stage3_prefetch_bucket_size, stage3_max_live_parameters, "
                "stage3_param_persistence_threshold, overlap_comm and pinning, and sets the precision (fp16/bf16 "
                "enabled, unless --precision), the micro-batch (train_micro_batch_size_per_gpu) and the accumulation "
                "(gradient_accumulation_steps, unless --gbs). \"auto\" sizes follow the Hugging Face Trainer's rules");
  s->add_option("--gpu", a->gpu, "GPU type of the catalogue (sim/data/gpus.json): " + gpu_names())
      ->capture_default_str();
  s->add_option("--gpu-spec", a->gpu_spec,
                "JSON file adding or overriding catalogue entries (the form of sim/data/gpus.json); repeatable");
  s->add_option("--gpus", a->gpus, "GPUs")->capture_default_str();
  s->add_option("--gpus-per-node", a->gpus_per_node, "GPUs per node")->capture_default_str();
  s->add_option("--memory-gb", a->memory_gb, "Memory per GPU (default: the catalogue's)");
  s->add_option("--hostfile", a->hostfile, "Hostfile instead of --gpu/--gpus (its slowest GPU type sets the pace)");
  s->add_option("--clusterfile", a->clusterfile, "Clusterfile for --hostfile");
  s->add_option("--profiles", a->profiles,
                "Profile folder whose whatif_calibration.json (scripts/gpu_whatif_calibrate.sh) gives measured host "
                "bandwidth, CPU Adam, QLoRA dequantisation and decode efficiencies");
  s->add_option("--efficiency", a->efficiency, "Achieved fraction of the dense peak on GEMMs")->capture_default_str();
  s->add_option("--memory-efficiency", a->memory_efficiency, "Achieved fraction of HBM bandwidth on elementwise kernels")
      ->capture_default_str();
  s->add_option("--intra-gbs", a->intra_gbs, "Intra-node GB/s (default: the catalogue's link)");
  s->add_option("--inter-gbs", a->inter_gbs, "Inter-node GB/s per GPU")->capture_default_str();
  s->add_option("--h2d-gbs", a->h2d_gbs, "Pinned host-to-device GB/s per GPU (default: measured, else 80% of PCIe)");
  s->add_option("--d2h-gbs", a->d2h_gbs, "Pinned device-to-host GB/s per GPU (default: measured, else 80% of PCIe)");
  s->add_option("--cpu-adam-params-per-s", a->cpu_adam_params_per_s,
                "CPU Adam parameters/s of the whole host, all cores (default: measured, else 100 GB/s / 30 B)");
  s->add_option("--cpu-memory-gb", a->cpu_memory_gb, "CPU memory per node (GB) for the fits column")
      ->capture_default_str();
  s->add_option("--lora-rank", a->lora_rank, "LoRA rank")->capture_default_str();
  s->add_option("--lora-targets", a->lora_targets, "LoRA projections: letters of qkvogud")->capture_default_str();
  s->add_option("--rows", a->rows, "Comma-separated row names to cost (default: all)");
  s->add_option("--export", a->export_dir,
                "Write the one --rows row's simulator inputs (profiles, hostfile, clusterfile, plan.json) to this "
                "folder, for `hetplan simulate --plan DIR/plan.json`");
  s->add_flag("--inference", a->inference, "Inference instead of training: TTFT, decode latency, memory");
  s->add_option("--prompt", a->prompt, "--inference: prompt tokens")->capture_default_str();
  s->add_option("--output", a->output, "--inference: generated tokens")->capture_default_str();
  s->add_option("--weights", a->weights, "--inference: weight formats (bf16, fp16, int8, nf4, awq)")
      ->capture_default_str();
  s->add_option("--json", a->json_out, "Write the table as JSON to this file");
  s->add_flag("--print-constants", a->print_constants,
              "Print the model's FLOP and byte counts, the roofline's efficiencies and the GPU's datasheet numbers "
              "as JSON (also to --json), and cost nothing (scripts/gpu_whatif_calibrate.py reads them)");
  s->add_option("--runtime", a->runtime,
                "Launch model (sim/runtime_overheads.h): eager (PyTorch issuing each op from Python: the CPU runs "
                "ahead of the GPU until the step ends, so a step takes max(GPU, host), the host's time itemised "
                "from the code's ops, autograd nodes, checkpoint regions, DDP/FSDP2 hooks and optimizer tensors) or "
                "graphs (CUDA graphs: no host; the GPU's per-kernel floor). Every row prints the runtime it assumed "
                "and, in eager mode, the host's time")
      ->capture_default_str();
  s->add_option("--host-probe", a->host_probe,
                "The host's per-op costs for --runtime eager: a host_probe_micro.json written by "
                "scripts/gpu_host_probe.sh (a host_probe_dist.json beside it adds DDP's and FSDP2's hook costs, a "
                "host_probe_offload.json the host's CPU AdamW, cast and pinned-copy rates for ZeRO-Offload rows); "
                "default: the H200 host's probe (logs/validate/host-probe-h200/)");
  s->add_option("--host-speed", a->host_speed,
                "The host's time per op against --host-probe's (or the default probe's) when it was measured: every "
                "host cost times this (1.2: the host 20% slower now). scripts/gpu_whatif_validate.sh takes it from a "
                "short re-probe right before each case")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 20.0));
  s->add_option("--eager-op-us", a->eager_op_us,
                "Host time of an op issued from Python with autograd off (decode), in microseconds (default: the "
                "profile's whatif_calibration.json inference.eager_op_us, else the host probe's)");
  s->add_option("--graph-kernel-us", a->graph_kernel_us,
                "GPU floor per kernel of a CUDA graph in microseconds (default: the profile's kernel_floor_us, else 2.16)");
  s->add_option("--kv-cache", a->kv_cache,
                "--inference: static (preallocated to prompt + output; the whole allocation is read each step) or "
                "dynamic (grown per token); auto: dynamic when eager (generate's default), static with graphs")
      ->capture_default_str();
  s->add_flag("--unfused-attention", a->unfused_attention,
              "Attention stores its scores (no SDPA/flash kernel); by default whatif assumes fused attention, as "
              "PyTorch, DeepSpeed and Transformers run it");
  add_setup_options(s, a->setup, 1024);
  a->setup.precision = "auto";
  s->get_option("--precision")
      ->description("Training precision: auto (bf16, or fp16 where the GPU lacks bf16), fp32, fp16, bf16 or fp8")
      ->default_str("auto");
  s->get_option("--flash-attention")->description("Fused attention (the whatif default; see --unfused-attention)");
  s->get_option("--offload")
      ->description("ZeRO-Offload for the ZeRO rows that do not choose their own (FSDP, LoRA/QLoRA+ZeRO): none, "
                    "optimizer, or all (optimizer, and parameters on the ZeRO-3 rows); never for rows without ZeRO");
  return [a, layers, micro_batch, gbs] {
    a->model.blocks_given = layers->count() > 0;
    a->micro_batch_given = micro_batch->count() > 0;
    a->gbs_given = gbs->count() > 0;
    return run_whatif(*a);
  };
}

}  // namespace hetplan::cli
