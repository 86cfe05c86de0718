// `hetplan replay`: run a plan on this machine's GPUs (or CPU ranks), measure
// it, and report measured against predicted.
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <thread>
#include <optional>

#include "cli/commands.h"
#include "executor/pipeline_runtime.h"
#include "profiler/device_meter.h"
#include "profiler/green_context.h"
#include "profiler/mixed_precision.h"
#include "base/statistics.h"
#include "planner/export_plan.h"
#include "sim/cluster.h"
#include "sim/gpu_specs.h"
#include "base/input_error.h"
#include "sim/memory_model.h"
#include "sim/model_shape.h"
#include "sim/plan_file.h"
#include "sim/parallel_layout.h"
#include "sim/rank_layout.h"

namespace hetplan::cli {

namespace fs = std::filesystem;
using namespace hetplan::executor;

namespace {

struct ReplayArgs {
  std::string plan, out = "replay.json", trace, schedule, dtype = "bf16", device = "auto";
  std::string profile_dir, hostfile, clusterfile, dump_dir, work_dir, hf_config, recompute;
  int iters = 10, warmup = 3, timeout_s = 300, heads = 0, zero = -1, vp = 0;
  bool overlap_grad_reduce = false, overlap_param_gather = false;
  int64_t cpu_memory_limit_mb = 0;
  double lr = 1e-4;
  std::vector<std::string> argv;
};

struct Prepared {
  PlanFile plan;
  std::unique_ptr<ProfileSet> profiles;
  std::vector<int> rank_types;  // profile type per rank, for the data load balancer
  // Each rank's device type and, for an emulated one, its declaration (the
  // clusterfile's "device_types"); empty without a hostfile and clusterfile.
  std::vector<std::string> rank_type_names;
  std::vector<std::optional<EmulatedDevice>> rank_emulation;
  std::unique_ptr<PipelineLayout> layout;
  ReplayConfig config;
};

// The model: the plan's architecture (or --hf-config, which must match it); a plan without one, its GPT with
// --heads. --heads that contradicts the plan's is an InputError naming both. One warning line, from local rank 0.
ModelShape replay_shape(const ReplayArgs& a, const PlanFile& plan, int local_rank) {
  PlanFile f = plan;
  const bool recorded = f.shape || !a.hf_config.empty();
  if (!recorded && a.heads > 0) f.model.attention_heads = a.heads;
  std::string warning;
  const ModelShape s = plan_shape(f, a.hf_config, a.plan, &warning);
  if (recorded && a.heads > 0 && a.heads != s.num_heads)
    throw InputError("--heads " + std::to_string(a.heads) + ": the plan " + a.plan + " records " +
                     std::to_string(s.num_heads) + " attention heads (model.architecture.num_heads)");
  if (!warning.empty() && local_rank <= 0) std::cerr << "hetplan: warning: " << warning << "\n";
  return s;
}

Prepared prepare(const ReplayArgs& a, int local_rank) {
  Prepared p;
  p.plan = read_plan_file(a.plan);
  const std::string profile_dir = a.profile_dir.empty() ? p.plan.profile_dir : a.profile_dir;
  const std::string hostfile = a.hostfile.empty() ? p.plan.hostfile : a.hostfile;
  const std::string clusterfile = a.clusterfile.empty() ? p.plan.clusterfile : a.clusterfile;
  const bool have_cluster = !hostfile.empty() && !clusterfile.empty() && fs::exists(hostfile) && fs::exists(clusterfile);
  const bool balance = have_cluster && !profile_dir.empty() && fs::is_directory(profile_dir);
  if (balance) p.profiles = std::make_unique<ProfileSet>(ProfileSet::load(profile_dir, p.plan.model.num_layers));
  const std::optional<Cluster> cluster =
      have_cluster ? std::optional<Cluster>(Cluster::load(hostfile, clusterfile)) : std::nullopt;
  const bool emulates = cluster && std::any_of(cluster->clusterfile().begin(), cluster->clusterfile().end(),
                                               [](const ClusterfileEntry& e) { return e.emulate.has_value(); });
  if (balance || emulates) {
    std::vector<int> ns;
    for (const auto& name : p.plan.plan.node_sequence) {
      const int t = cluster->type_index(name);
      if (t < 0) throw InputError(a.plan + ": node_sequence names '" + excerpt(name) + "', which " + hostfile + " lacks");
      ns.push_back(t);
    }
    const RankLayout rl(*cluster, ns);
    for (int t : rl.rank_types()) {
      const std::string& name = cluster->device_types()[t];
      if (balance) p.rank_types.push_back(p.profiles->type_index(name));
      p.rank_type_names.push_back(name);
      const EmulatedDevice* e = cluster->emulation(name);
      p.rank_emulation.push_back(e ? std::optional<EmulatedDevice>(*e) : std::nullopt);
    }
  }
  if (a.vp > 0) p.plan.virtual_stages = a.vp;  // else the plan's (1 when it records none)
  p.layout = std::make_unique<PipelineLayout>(p.plan, p.rank_types, p.profiles.get());

  ReplayConfig& c = p.config;
  // The model: the plan's GPT (tied, learned positions over the sequence,
  // as Metis's plans describe it) or a Hugging Face config of the same
  // layer count and hidden size.
  const ModelConfig& pm = p.plan.model;
  c.model.shape = replay_shape(a, p.plan, local_rank);
  c.model.seq_len = pm.sequence_length;
  // ZeRO: the flag, else the plan's stage.
  if (a.zero > 3) throw InputError("--zero " + std::to_string(a.zero) + ": expected 0, 1, 2 or 3");
  c.zero_stage = a.zero >= 0 ? a.zero : std::min(3, std::max(0, p.plan.zero_stage));
  // Overlapped reduction (ZeRO-2/3): the flag, or the plan's overlap.grad_reduce.
  c.overlap_grad_reduce = a.overlap_grad_reduce || p.plan.overlap.grad_reduce;
  // ZeRO-3's prefetched gathers: the flag, or the plan's overlap.param_gather.
  c.overlap_param_gather = a.overlap_param_gather || p.plan.overlap.param_gather;
  // Activation recomputation: the flag, else the setting the plan was costed with.
  if (!a.recompute.empty()) c.model.recompute = parse_recompute(a.recompute, "--recompute");
  else if (!p.plan.recompute.empty()) c.model.recompute = parse_recompute(p.plan.recompute, a.plan + ": recompute");
  c.gbs = p.plan.gbs;
  c.warmup = a.warmup;
  c.iters = a.iters;
  // The flag, else the schedule the plan was costed with, else 1F1B.
  c.schedule = !a.schedule.empty()        ? parse_schedule(a.schedule, "--schedule")
               : !p.plan.schedule.empty() ? parse_schedule(p.plan.schedule, a.plan + ": schedule")
                                          : Schedule::k1F1B;
  c.dtype = profiler::parse_dtype(a.dtype);
  c.device = profiler::parse_device(a.device, local_rank);
  c.lr = a.lr;
  c.timeout = std::chrono::seconds(a.timeout_s);
  c.dump_dir = a.dump_dir;
  // Sequence parallelism (with tp) and context parallelism: the plan's settings (the layout holds cp).
  c.model.sequence_parallel = p.plan.sequence_parallel;
  for (std::size_t s = 0; s < p.plan.plan.strategies.size(); ++s) {
    const int tp = p.plan.plan.strategies[s].tp;
    c.model.validate(tp, a.plan + ": stage " + std::to_string(s), p.layout->context_parallel());
    // Gloo's all-reduce knows no 16-bit floats; tp all-reduces activations.
    if (!c.device.is_cuda() && tp > 1 && c.dtype != torch::kFloat32)
      throw InputError(a.plan + ": stage " + std::to_string(s) + " has tp " + std::to_string(tp) +
                       ": on the CPU the Gloo backend cannot all-reduce " + a.dtype + " activations; pass --dtype fp32");
  }
  if (!c.device.is_cuda() && p.layout->context_parallel() > 1 && c.dtype != torch::kFloat32)
    throw InputError(a.plan + ": context_parallel " + std::to_string(p.layout->context_parallel()) +
                     ": on the CPU the Gloo backend cannot all-gather " + a.dtype + " keys and values; pass --dtype fp32");
  return p;
}

std::string work_dir(const ReplayArgs& a) {
  return a.work_dir.empty() ? (fs::path(a.out).parent_path() / (fs::path(a.out).stem().string() + ".ranks")).string()
                            : a.work_dir;
}

// HETPLAN_NODE=k (the torchrun export's scripts): this process runs the plan rank at LOCAL_RANK among the ranks of
// the k-th node (hostfile line) of the plan (ranks_by_node, planner/export_plan.h).
std::vector<std::string> place_on_node(const std::string& node, const ParallelLayout& placement,
                                       profiler::DistEnv& env, std::vector<std::string> hosts) {
  const std::vector<std::vector<int>> nodes = ranks_by_node(placement);
  const bool digits = node.size() <= 6 && node.find_first_not_of("0123456789") == std::string::npos;
  const int k = digits ? std::stoi(node) : -1;
  if (k < 0 || k >= static_cast<int>(nodes.size()))
    throw InputError("HETPLAN_NODE=" + excerpt(node) + ": expected a node from 0 to " +
                     std::to_string(nodes.size() - 1) + " (the plan places its ranks on " +
                     std::to_string(nodes.size()) + " hostfile lines)");
  const std::vector<int>& mine = nodes[k];
  if (static_cast<int>(mine.size()) != env.local_world_size)
    throw InputError("node " + node + " holds " + std::to_string(mine.size()) + " of the plan's ranks, but the "
                     "launcher started " + std::to_string(env.local_world_size) +
                     " processes there (LOCAL_WORLD_SIZE; torchrun's --nproc-per-node must be " +
                     std::to_string(mine.size()) + ")");
  if (env.local_rank < 0 || env.local_rank >= static_cast<int>(mine.size()))
    throw InputError("LOCAL_RANK " + std::to_string(env.local_rank) + " out of range on node " + node);
  env.rank = mine[env.local_rank];
  env.host = placement.host(env.rank);
  return hosts;
}

// Under torchrun on several hosts, the launcher's RANK follows the order in
// which hosts joined; the plan's rank of this process is the one the
// hostfile places on this host (HETPLAN_HOST, else the GROUP_RANK-th host of
// the plan) at local GPU LOCAL_RANK. Returns every rank's host; empty on one
// host, where RANK is the plan's rank.
std::vector<std::string> place_worker(const ReplayArgs& a, const PlanFile& plan, profiler::DistEnv& env) {
  const bool multi_host = !env.host.empty() || (env.group_rank >= 0 && env.local_world_size < env.world_size);
  const std::string hostfile = a.hostfile.empty() ? plan.hostfile : a.hostfile;
  const std::string clusterfile = a.clusterfile.empty() ? plan.clusterfile : a.clusterfile;
  if (!multi_host) return {};  // one host: RANK is the plan's rank
  if (hostfile.empty() || clusterfile.empty() || !fs::exists(hostfile) || !fs::exists(clusterfile))
    throw InputError(a.plan + ": replay across hosts needs the plan's hostfile and clusterfile (pass --hostfile and "
                     "--clusterfile) to find each rank's host");
  const Cluster cluster = Cluster::load(hostfile, clusterfile);
  const std::vector<int> ns = cluster.type_indices(plan.plan.node_sequence);
  if (std::find(ns.begin(), ns.end(), -1) != ns.end())
    throw InputError(a.plan + ": its node_sequence names a type that " + hostfile + " lacks");
  const RankLayout ranks(cluster, ns);
  const ParallelLayout placement(cluster, ranks);
  std::vector<std::string> hosts;
  for (int r = 0; r < placement.num_ranks(); ++r) hosts.push_back(placement.host(r));
  if (const char* node = std::getenv("HETPLAN_NODE"); node && *node) return place_on_node(node, placement, env, hosts);
  std::string host = env.host;
  if (host.empty()) {
    const std::vector<std::string> order = placement.hosts();
    if (env.group_rank >= static_cast<int>(order.size()))
      throw InputError("GROUP_RANK " + std::to_string(env.group_rank) + ": the plan places its ranks on " +
                       std::to_string(order.size()) + " hosts of " + hostfile);
    host = order[env.group_rank];
  }
  const std::vector<int> mine = placement.ranks_on(host);
  if (mine.empty())
    throw InputError("HETPLAN_HOST=" + excerpt(host) + ": " + hostfile + " places none of the plan's ranks there");
  if (static_cast<int>(mine.size()) != env.local_world_size)
    throw InputError("host " + host + " holds " + std::to_string(mine.size()) + " of the plan's ranks, but the "
                     "launcher started " + std::to_string(env.local_world_size) +
                     " processes there (LOCAL_WORLD_SIZE; torchrun's --nproc-per-node must be " +
                     std::to_string(mine.size()) + ")");
  if (env.local_rank < 0 || env.local_rank >= static_cast<int>(mine.size()))
    throw InputError("LOCAL_RANK " + std::to_string(env.local_rank) + " out of range on host " + host);
  env.rank = placement.rank_at(host, env.local_rank);
  env.host = host;
  return hosts;
}

std::string rank_name(int rank, const std::vector<std::string>& hosts) {
  return "rank " + std::to_string(rank) +
         (rank >= 0 && rank < static_cast<int>(hosts.size()) ? " (host " + hosts[rank] + ")" : "");
}

// After a failure: which ranks stopped beating, from the rendezvous store.
std::string describe_peers(profiler::Liveness& live, const profiler::DistEnv& env,
                           const std::vector<std::string>& hosts) {
  const profiler::Liveness::Report rep = live.check(std::chrono::milliseconds(1500));
  if (!rep.store_reachable)
    return "; the rendezvous store at " + env.master_addr + ":" + std::to_string(env.master_port) +
           " is unreachable (" + (env.agent_store ? "torchrun's agent on the master host" : rank_name(0, hosts)) +
           " serves it: that process or its host is down)";
  std::string out;
  for (int r : rep.stopped) {
    const bool never = std::find(rep.never.begin(), rep.never.end(), r) != rep.never.end();
    out += "; " + rank_name(r, hosts) + (never ? " never joined" : " stopped responding (it died, or its host is down)");
  }
  return out;
}

int run_worker(const ReplayArgs& a, profiler::DistEnv env) {
  profiler::ignore_broken_pipes();
  const std::string dir = work_dir(a);
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::vector<std::string> hosts;
  std::unique_ptr<profiler::Liveness> live;
  try {
    if (a.cpu_memory_limit_mb > 0 && !profiler::DeviceMeter::set_cpu_memory_limit(a.cpu_memory_limit_mb << 20))
      throw InputError("--cpu-memory-limit-mb: not supported with this LibTorch version");
    Prepared p = prepare(a, env.local_rank);
    hosts = place_worker(a, p.plan, env);
    // Fault injection for tests: this rank (of the plan) fails as soon as it starts.
    if (const char* f = std::getenv("HETPLAN_REPLAY_FAIL_RANK"); f && std::atoi(f) == env.rank)
      throw std::runtime_error("injected failure (HETPLAN_REPLAY_FAIL_RANK)");
    if (env.world_size > 1)
      live = std::make_unique<profiler::Liveness>(env, std::chrono::milliseconds(500), p.config.timeout);
    // A rank of an emulated device type runs inside its SM partition (profiler/green_context.h).
    std::unique_ptr<profiler::SmPartition> partition;
    if (static_cast<std::size_t>(env.rank) < p.rank_emulation.size() && p.rank_emulation[env.rank]) {
      partition = std::make_unique<profiler::SmPartition>(p.config.device, p.rank_type_names[env.rank],
                                                          *p.rank_emulation[env.rank]);
      write_json_file((fs::path(dir) / ("rank" + std::to_string(env.rank) + ".partition.json")).string(),
                      partition->record());
    }
    const RankReport r = run_pipeline_rank(*p.layout, p.config, env);
    write_json_file((fs::path(dir) / ("rank" + std::to_string(env.rank) + ".json")).string(), rank_report_to_json(r));
    if (!env.host.empty() && env.rank == 0)  // under torchrun across hosts: rank 0 reports
      std::cout << std::fixed << std::setprecision(3) << "replay: rank 0 (host " << env.host
                << "): iteration_ms median " << median(r.iteration_ms) << " (spread "
                << std::setprecision(1) << 100 * spread(r.iteration_ms) << "% over "
                << r.iteration_ms.size() << "); per-rank results in " << dir << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    const bool oom = profiler::is_out_of_memory(e);
    if (live) what += describe_peers(*live, env, hosts);
    std::ofstream((fs::path(dir) / ("rank" + std::to_string(env.rank) + ".error")).string())
        << (oom ? "out of memory: " : "") << what << "\n";
    std::cerr << rank_name(env.rank, hosts) << ": " << what << "\n";
    // The process serving the store stays a moment, so that the other
    // survivors can still read the ranks' liveness from it.
    if (live && !env.agent_store && env.launcher_rank == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    std::_Exit(oom ? 42 : 1);
  }
}

// How the plan's ranks map onto this machine's devices, for the report's first lines and its JSON.
std::string device_mapping(const Prepared& p, const std::string& local) {
  const PipelineLayout& layout = *p.layout;
  std::string types;
  for (const auto& t : p.plan.plan.node_sequence) types += (types.empty() ? "" : ", ") + t;
  std::string mapping = "all " + std::to_string(layout.world()) + " ranks run on local " + local +
                        ", in rank order; the plan's device types (" + types + ") are not emulated";
  if (std::any_of(p.rank_emulation.begin(), p.rank_emulation.end(), [](const auto& e) { return e.has_value(); })) {
    mapping = "rank r runs on local " + local + " r;";
    for (std::size_t r = 0; r < p.rank_emulation.size(); ++r) {
      const auto& e = p.rank_emulation[r];
      mapping += " rank " + std::to_string(r) + ": " + p.rank_type_names[r] +
                 (e ? " (" + e->base + " restricted to " + std::to_string(e->sms) + " SMs)" : " (whole GPU)") +
                 (r + 1 < p.rank_emulation.size() ? "," : "");
    }
  }
  return mapping;
}

// Runs one process per rank with its results in `dir`; throws InputError "replay failed" with each rank's
// reason where any rank fails. The default folder (next to --out) is made empty first; a --work-dir of the
// user's loses only earlier ranks' files (rank<N>.json, .error, .partition.json), and reaches the ranks
// through the user's own arguments (given twice, CLI11 would refuse it).
void run_local_ranks(const ReplayArgs& a, const PipelineLayout& layout, const std::string& dir) {
  std::vector<std::string> args = a.argv;
  if (a.work_dir.empty()) {
    fs::remove_all(dir);
    args.push_back("--work-dir");
    args.push_back(dir);
  } else {
    std::error_code ec;
    for (int rank = 0; rank < layout.world(); ++rank)
      for (const char* ext : {".json", ".error", ".partition.json"})
        fs::remove(fs::path(dir) / ("rank" + std::to_string(rank) + ext), ec);
  }
  fs::create_directories(dir);
  const auto r = profiler::launch_local_ranks(args, layout.world(), profiler::free_local_port(),
                                              std::chrono::seconds(std::min(15, a.timeout_s)),
                                              std::chrono::seconds(a.timeout_s * 2));
  if (r.ok()) return;
  std::string detail;
  for (int rank = 0; rank < layout.world(); ++rank) {
    std::ifstream err((fs::path(dir) / ("rank" + std::to_string(rank) + ".error")).string());
    std::string line;
    if (std::getline(err, line)) detail += " rank " + std::to_string(rank) + ": " + line + ";";
  }
  std::string codes;
  for (int c : r.exit_codes) codes += (codes.empty() ? "" : ",") + std::to_string(c);
  throw InputError("replay failed (exit codes " + codes + "):" + (detail.empty() ? " no rank reported why" : detail));
}

// What the ranks measured, and the figures derived from it.
struct ReplayMeasurement {
  std::vector<RankReport> reports;  // by rank
  std::vector<double> losses;       // per measured iteration, summed over the ranks
  double median_ms = 0, spread = 0, tokens = 0, flops = 0;
  double mfu = -1;        // -1: the device is not in the GPU catalogue
  double predicted = 0;   // the plan's cost
};

ReplayMeasurement read_measurement(const Prepared& p, const std::string& dir, const std::string& local) {
  const PipelineLayout& layout = *p.layout;
  ReplayMeasurement m;
  for (int rank = 0; rank < layout.world(); ++rank) {
    const fs::path report = fs::path(dir) / ("rank" + std::to_string(rank) + ".json");
    m.reports.push_back(rank_report_from_json(read_json_file(report.string())));
  }
  const std::vector<double>& iters = m.reports[0].iteration_ms;
  m.median_ms = median(iters);
  m.spread = spread(iters);
  m.losses.assign(iters.size(), 0.0);
  for (const auto& rep : m.reports)
    for (std::size_t k = 0; k < rep.losses.size() && k < m.losses.size(); ++k) m.losses[k] += rep.losses[k];

  const auto& model = p.config.model;
  m.tokens = static_cast<double>(p.plan.gbs) * model.seq_len;
  // Model FLOPs as the simulator counts them (one definition: ModelShape).
  m.flops = model.shape.training_flops(m.tokens, model.seq_len);
  const GpuSpec* spec = nullptr;
  if (p.config.device.is_cuda()) spec = match_device_description(local);  // the catalogue (sim/gpu_specs.h)
  m.mfu = spec ? m.flops / (m.median_ms * 1e-3) / (layout.world() * spec->peak_tflops * 1e12) : -1;
  m.predicted = p.plan.plan.cost;
  return m;
}

// One rank's entry in the report's "ranks".
ordered_json rank_json(const RankReport& rep, const Prepared& p, const std::string& dir) {
  auto mb = [](const std::optional<double>& v) { return v ? ordered_json(*v) : ordered_json(nullptr); };
  ordered_json rank = {{"rank", rep.rank},
                       {"stage", rep.stage},
                       {"replica", rep.replica},
                       {"tp_index", rep.tp_index},
                       {"peak_memory_mb", rep.peak_memory_mb},
                       {"peak_forward_backward_mb", rep.peak_forward_backward_mb},
                       {"peak_optimizer_mb", rep.peak_optimizer_mb},
                       {"peak_allocated_mb", mb(rep.peak_allocated_mb)},
                       {"peak_reserved_mb", mb(rep.peak_reserved_mb)},
                       {"device_used_mb", mb(rep.device_used_mb)},
                       {"memory_note", rep.memory_note.empty() ? ordered_json(nullptr) : ordered_json(rep.memory_note)}};
  if (static_cast<std::size_t>(rep.rank) < p.rank_type_names.size()) rank["device_type"] = p.rank_type_names[rep.rank];
  const fs::path partition = fs::path(dir) / ("rank" + std::to_string(rep.rank) + ".partition.json");
  if (fs::exists(partition)) rank["sm_partition"] = read_json_file(partition.string());
  return rank;
}

// The report `--out` holds.
ordered_json replay_json(const ReplayArgs& a, const Prepared& p, const ReplayMeasurement& m, const std::string& local,
                         const std::string& mapping, const std::string& dir) {
  const auto& model = p.config.model;
  const std::vector<double>& iters = m.reports[0].iteration_ms;
  ordered_json out;
  out["plan"] = plan_file_to_json(p.plan);
  out["device"] = local;
  out["mapping"] = mapping;
  out["schedule"] = to_string(p.config.schedule);
  out["virtual_stages"] = p.layout->virtual_stages();
  out["sequence_parallel_executed"] = p.config.model.sequence_parallel;
  out["context_parallel_executed"] = p.layout->context_parallel();
  out["dtype"] = a.dtype;
  out["recompute"] = to_string(p.config.model.recompute);
  // 1: fp32 masters and Adam state sharded over each stage's dp group; 2: and
  // the fp32 gradients (reduce-scattered); 3: and the 16-bit weights (gathered per layer).
  out["zero_stage_executed"] = p.config.zero_stage;
  // ZeRO-1 overlaps on one model chunk per rank (else it reduce-scatters in the step).
  out["overlap_grad_reduce_executed"] =
      p.config.overlap_grad_reduce &&
      (p.config.zero_stage >= 2 || (p.config.zero_stage == 1 && p.layout->virtual_stages() == 1));
  out["overlap_param_gather_executed"] = p.config.overlap_param_gather && p.config.zero_stage == 3;
  long long overlapped = 0, prefetched = 0;
  for (const auto& rep : m.reports) {
    overlapped += rep.overlapped_collectives;
    prefetched += rep.prefetched_gathers;
  }
  out["overlapped_collectives"] = overlapped;
  out["prefetched_gathers"] = prefetched;
  out["model"] = {{"name", model.shape.name},
                  {"family", model.shape.mlp == MlpKind::kSwiGlu ? "llama" : "gpt2"},
                  {"parameters", model.shape.parameter_count()},
                  {"tied_embeddings", model.shape.tied_embeddings},
                  {"flops_per_iteration", m.flops}};
  out["optimizer"] = {{"name", "Adam"},
                      {"master_weights", "fp32"},
                      {"main_grads", "fp32"},
                      {"zero_stage", p.config.zero_stage}};
  out["warmup"] = a.warmup;
  out["iters"] = a.iters;
  out["iteration_ms"] = {{"median", m.median_ms},
                         {"min", *std::min_element(iters.begin(), iters.end())},
                         {"max", *std::max_element(iters.begin(), iters.end())},
                         {"spread", m.spread},
                         {"all", iters}};
  out["tokens_per_s"] = m.tokens / (m.median_ms * 1e-3);
  out["mfu"] = m.mfu >= 0 ? ordered_json(m.mfu) : ordered_json(nullptr);
  out["predicted_ms"] = m.predicted;
  out["prediction_error"] =
      m.predicted > 0 ? ordered_json((m.median_ms - m.predicted) / m.median_ms) : ordered_json(nullptr);
  out["losses"] = m.losses;
  ordered_json ranks = ordered_json::array();
  for (const auto& rep : m.reports) ranks.push_back(rank_json(rep, p, dir));
  out["ranks"] = ranks;
  return out;
}

// Chrome trace (Perfetto): one process per rank, spans of the last iteration.
void write_replay_trace(const std::string& trace_path, const std::vector<RankReport>& reports) {
  ordered_json events = ordered_json::array();
  for (const auto& rep : reports) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rep.rank},
                      {"args", {{"name", "rank " + std::to_string(rep.rank) + " (stage " + std::to_string(rep.stage) +
                                             ", replica " + std::to_string(rep.replica) + ", tp " +
                                             std::to_string(rep.tp_index) + ")"}}}});
    for (const auto& sp : rep.trace)
      events.push_back({{"name", sp.name}, {"ph", "X"}, {"pid", rep.rank}, {"tid", 0}, {"ts", sp.start_ms * 1000},
                        {"dur", (sp.end_ms - sp.start_ms) * 1000},
                        {"args", {{"micro_batch", sp.micro_batch}, {"chunk", sp.chunk}}}});
  }
  write_json_file(trace_path, {{"traceEvents", events}, {"displayTimeUnit", "ms"}});
}

void print_replay_summary(const ReplayMeasurement& m) {
  const double med = m.median_ms, predicted = m.predicted;
  std::cout << std::fixed << std::setprecision(3);
  std::cout << "iteration_ms: median " << med << " (spread " << std::setprecision(1) << 100 * m.spread << "% over "
            << m.reports[0].iteration_ms.size() << ")\n"
            << std::setprecision(1) << "tokens_per_s: " << m.tokens / (med * 1e-3) << "\n";
  if (m.mfu >= 0) std::cout << std::setprecision(3) << "mfu: " << m.mfu << "\n";
  if (predicted > 0)
    std::cout << std::setprecision(3) << "predicted_ms (the plan's cost, by the search's cost model): " << predicted << ", error (measured - predicted) / "
              << "measured: " << std::setprecision(1) << 100 * (med - predicted) / med << "%\n";
  for (const auto& rep : m.reports) {
    std::cout << std::setprecision(1) << "rank " << rep.rank << " stage " << rep.stage << ": peak allocated "
              << rep.peak_memory_mb << " MB";
    if (rep.peak_reserved_mb) std::cout << ", reserved " << *rep.peak_reserved_mb << " MB";
    if (rep.device_used_mb) std::cout << ", device in use " << *rep.device_used_mb << " MB";
    std::cout << "\n";
  }
}

int run_replay(const ReplayArgs& a) {
  if (a.plan.empty()) throw InputError("--plan: required");
  if (const auto env = profiler::DistEnv::from_env()) return run_worker(a, *env);

  Prepared p = prepare(a, 0);
  const PipelineLayout& layout = *p.layout;
  const torch::Device device = p.config.device;
  const int gpus = device.is_cuda() ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (device.is_cuda() && layout.world() > gpus)
    throw InputError(a.plan + ": the plan needs " + std::to_string(layout.world()) + " GPUs, " + std::to_string(gpus) +
                     " are visible");
  const std::string local = profiler::device_description(device);
  const std::string mapping = device_mapping(p, local);
  std::cout << "replay: " << a.plan << ": " << layout.num_stages() << " stage(s), " << layout.batches()
            << " micro-batches of " << layout.micro_batch() << ", " << to_string(p.config.schedule) << ", " << a.dtype << "\n";
  std::cout << "mapping: " << mapping << "\n";

  const std::string dir = work_dir(a);
  run_local_ranks(a, layout, dir);
  const ReplayMeasurement m = read_measurement(p, dir, local);
  write_json_file(a.out, replay_json(a, p, m, local, mapping, dir));
  const std::string trace_path = a.trace.empty() ? (fs::path(a.out).replace_extension(".trace.json")).string() : a.trace;
  write_replay_trace(trace_path, m.reports);
  print_replay_summary(m);
  std::cout << "wrote " << a.out << " and " << trace_path << "\n";
  return 0;
}

}  // namespace

Runner add_replay_command(CLI::App& app, int argc, char** argv) {
  auto a = std::make_shared<ReplayArgs>();
  for (int i = 1; i < argc; ++i) a->argv.push_back(argv[i]);
  CLI::App* s = app.add_subcommand(
      "replay",
      "Run a plan (an entry of `hetplan search --json`) on this machine: one process per rank, each stage's\n"
      "layers on its device group with its (dp, tp), activations and gradients between stages by c10d p2p,\n"
      "gradients summed over dp, Adam. Reports the median iteration time, tokens/s, MFU, per-rank peak\n"
      "memory and the prediction error, and writes a Chrome trace (Perfetto) of one iteration.");
  s->add_option("--plan", a->plan, "Plan JSON (a search --json entry, or the whole file: its best plan)")->required();
  s->add_option("--iters", a->iters, "Measured iterations")->capture_default_str();
  s->add_option("--warmup", a->warmup, "Unmeasured iterations first")->capture_default_str();
  s->add_option("--schedule", a->schedule,
                "gpipe, 1f1b or interleaved (Megatron's interleaved 1F1B: each rank runs --vp model chunks, "
                "the plan's stages' layers split evenly into them; needs batches a multiple of pp). Default: the "
                "schedule the plan was costed with, else 1f1b");
  s->add_option("--vp", a->vp,
                "Virtual stages (model chunks) per pipeline rank for --schedule interleaved; default: the plan's "
                "virtual_stages")
      ->check(CLI::Range(1, 64));
  s->add_option("--dtype", a->dtype, "bf16, fp16 or fp32")->capture_default_str();
  s->add_option("--device", a->device, "auto, cuda or cpu")->capture_default_str();
  s->add_option("--profile-dir", a->profile_dir, "Profiles, for the data load balancer (default: the plan's)");
  s->add_option("--hostfile", a->hostfile, "Hostfile (default: the plan's)");
  s->add_option("--clusterfile", a->clusterfile, "Clusterfile (default: the plan's)");
  s->add_option("--heads", a->heads, "Attention heads (default: the plan's model)");
  s->add_option("--zero", a->zero,
                "ZeRO stage to execute over each stage's replicas: 0 (replicated), 1 (fp32 masters and Adam state "
                "sharded), 2 (and fp32 gradients, reduce-scattered per layer), 3 (and bf16 weights, gathered per "
                "layer just in time, as FSDP) (default: the plan's)");
  s->add_flag("--overlap-grad-reduce", a->overlap_grad_reduce,
              "With --zero 2 or 3: leave each layer's gradient reduce-scatter running while the backward goes on "
              "(DeepSpeed's overlap_comm); waited for at each micro-batch's end. With --zero 1 (no interleaving): "
              "reduce-scatter the summed gradients layer by layer during the step's last backward (Megatron's "
              "--overlap-grad-reduce) (default: the plan's overlap.grad_reduce)");
  s->add_flag("--overlap-param-gather", a->overlap_param_gather,
              "With --zero 3: start the next layer's weight all-gather before the current layer computes, in the "
              "forward and the backward, so that it runs beside that compute (Megatron's --overlap-param-gather, "
              "FSDP's prefetch) (default: the plan's overlap.param_gather)");
  s->add_option("--recompute", a->recompute,
                "Activation recomputation: none, selective (core attention) or full (each block) (default: the "
                "plan's setting, else none)");
  s->add_option("--hf-config", a->hf_config,
                "Hugging Face config.json (gpt2, llama, mistral) for the model (default: the plan's GPT); its layer "
                "count and hidden size must be the plan's");
  s->add_option("--lr", a->lr, "Adam learning rate")->capture_default_str();
  s->add_option("--out,-o", a->out, "Result JSON")->capture_default_str();
  s->add_option("--trace", a->trace, "Chrome trace JSON (default: <out>.trace.json)");
  s->add_option("--timeout-s", a->timeout_s, "Bound on each collective, in seconds")->capture_default_str();
  s->add_option("--cpu-memory-limit-mb", a->cpu_memory_limit_mb,
                "CPU runs: treat allocations past this many MB per rank as out of memory");
  s->add_option("--dump-params", a->dump_dir, "Write every rank's parameters after the last step here");
  s->add_option("--work-dir", a->work_dir, "Per-rank files (default: next to --out)");
  return [a] { return run_replay(*a); };
}

}  // namespace hetplan::cli
