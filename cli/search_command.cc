// `hetplan search`: the Metis search (the reference's cost_het_cluster.py).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "cli/commands.h"
#include "planner/search_settings.h"
#include "cli/device_memory_flags.h"
#include "cli/flag_validators.h"
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "cli/search_json.h"
#include "planner/objective.h"
#include "planner/plan_search.h"
#include "metis/metis_search.h"
#include "base/file_access.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/network.h"
#include "sim/profile.h"

namespace hetplan::cli {

namespace {

struct SearchArgs {
  std::string hostfile, clusterfile, profile_dir, json_out, log_path, home_dir;
  ModelConfig model;
  int gbs = 0;
  int max_tp = 0, max_bs = 0;  // 0: the largest found in the profiles
  double variance = 1;
  int max_permute_len = 128;
  int trials = 1;
  bool use_strat = false;
  int top = 1;
  int threads = 0;
  bool progress = false, quiet = false;
  bool reject_dropped_layers = false;
  // --cost-model sim: the simulator's iteration time and per-rank memory.
  std::string cost_model = "sim", schedule = "1f1b", recompute = "auto", bandwidth_unit = "GB/s", vp = "1";
  std::string collectives = "measured";
  bool burst_clocks = false;
  std::string zero = "auto";  // with recompute "auto": the ZeRO stage and recomputation searched (issue 33)
  bool sequence_parallel = false;
  std::string overlap = "off";
  std::string cp = "1";  // --cp: context-parallel sizes searched (parse_context_parallel)
  double ddp_bucket_params = 0, comm_slowdown = 0;  // 0: the profiles' comm_overlap.json, else the default
  bool cross_node_tp = false;
  double gap = 0.01;         // --gap: prove the best within this relative gap (0: exact)
  std::string time_budget;  // seconds, or "none" / "" for no limit (parse_time_budget)
  int max_stages = 0;
  std::string stage_boundaries = "auto";
  std::string hf_config;  // the model's shape (Llama family, ...); its layer count must match --num_layers
  std::vector<std::string> metis_only_given;  // the [metis] flags on the command line
  std::string memory_headroom = kDefaultMemoryHeadroom;
  bool uniform = false;
  std::string objective = "time";
  double deadline_ms = 0;  // 0: none
};

// The options whose help begins with kMetisOnly act only under --cost-model metis.
constexpr const char* kMetisOnly = "[metis]";

// The names of the [metis] options given on the command line (after parsing).
std::vector<std::string> metis_only_flags_given(const CLI::App& s) {
  std::vector<std::string> out;
  for (const CLI::Option* o : s.get_options())
    if (o->count() > 0 && o->get_description().rfind(kMetisOnly, 0) == 0) out.push_back(o->get_name());
  return out;
}

// The default search ignores [metis] flags: one warning naming them.
void warn_metis_only_flags(const SearchArgs& a) {
  if (a.metis_only_given.empty()) return;
  std::string names;
  for (const auto& n : a.metis_only_given) names += (names.empty() ? "" : ", ") + n;
  std::cerr << "hetplan: warning: " << names << (a.metis_only_given.size() > 1 ? " act" : " acts")
            << " only under --cost-model metis; the default search (--cost-model sim) ignores "
            << (a.metis_only_given.size() > 1 ? "them" : "it") << "\n";
}

// A profile set with holes: one warning naming the missing files, which the default search plans around.
void warn_profile_holes(const ProfileSet& profiles) {
  const std::vector<ProfileHole> holes = profiles.holes();
  if (holes.empty()) return;
  std::cerr << "hetplan: warning: " << holes.size() << " profile(s) missing between ones present; the search "
            << "leaves out the plans that need them: " << profiles.holes_message(holes) << "\n";
}

// The profiles were measured for one model: a shape flag (or the --hf-config's value) that disagrees with what
// their model-level file records is an InputError naming the key and both values. Keys a file does not record
// (Metis's files, older ones) are not checked; the layer count is checked by ProfileSet::load.
void check_shape_against_profiles(const SearchArgs& a, const ModelShape& shape, const ModelProfile& profiled) {
  auto check = [&](const char* key, long long recorded, long long given, const std::string& source) {
    if (recorded == 0 || recorded == given) return;
    throw InputError(source + " " + std::to_string(given) + " disagrees with the profiles: " + profiled.path +
                     " records model." + key + " = " + std::to_string(recorded) +
                     " (they were measured for another model: give its shape, or profile this one)");
  };
  const std::string config = a.hf_config.empty() ? "" : "--hf-config " + a.hf_config + ": ";
  check("hidden_size", profiled.hidden_size, a.model.hidden_size, "--hidden_size");
  check("sequence_length", profiled.sequence_length, a.model.sequence_length, "--sequence_length");
  check("vocab_size", profiled.vocab_size, shape.vocab_size, a.hf_config.empty() ? "--vocab_size" : config + "vocab_size");
  if (a.hf_config.empty()) return;  // the flags give no heads, ffn or family to a GPT that must match
  check("num_heads", profiled.num_heads, shape.num_heads, config + "num_heads");
  check("num_kv_heads", profiled.num_kv_heads, shape.num_kv_heads, config + "num_kv_heads");
  check("ffn_hidden_size", profiled.ffn_hidden_size, shape.ffn_hidden_size, config + "ffn_hidden_size");
  const std::string family = shape.mlp == MlpKind::kSwiGlu ? "llama" : "gpt2";
  if (!profiled.family.empty() && profiled.family != family)
    throw InputError(config + "a " + family + " model disagrees with the profiles: " + profiled.path +
                     " records model.family = " + excerpt(profiled.family));
}

// "123.4 ms", or "-" where there is none (negative).
std::string ms_text(double ms) { return ms >= 0 ? python_float(std::round(ms * 10) / 10) + " ms" : "-"; }
// A lower bound: "none left" where no plan is left to search (infinity).
std::string bound_text(double ms) { return std::isfinite(ms) ? ms_text(ms) : "none left"; }
// "0.84%", or "?" where not known (negative or infinite).
std::string gap_text(double gap) {
  if (!(gap >= 0) || !std::isfinite(gap)) return "?";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * gap);
  return buf;
}

// Set by SIGINT during a search: the search stops and reports what it found.
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

// While alive, Ctrl-C (SIGINT) sets g_interrupted, which the search polls, instead of ending the process;
// the handler before it comes back at its end. Not thread-safe: one at a time, on the main thread.
class SigintStopsSearch {
 public:
  SigintStopsSearch() {
    g_interrupted.store(false);
    previous_ = std::signal(SIGINT, on_sigint);
  }
  ~SigintStopsSearch() { std::signal(SIGINT, previous_); }
  SigintStopsSearch(const SigintStopsSearch&) = delete;
  SigintStopsSearch& operator=(const SigintStopsSearch&) = delete;

 private:
  void (*previous_)(int) = nullptr;
};

// "enumerated: 6537, pruned: 6079, costed: 37, infeasible: 0, time: 0.1234 s": a default or cost-objective
// search's counts (PlanSearchResult, ObjectiveSearchResult), " (cut short)" where it was.
template <typename Result>
std::string search_counts_line(const Result& r) {
  return "enumerated: " + std::to_string(r.enumerated) + ", pruned: " + std::to_string(r.pruned) +
         ", costed: " + std::to_string(r.costed) + ", infeasible: " + std::to_string(r.infeasible) +
         ", time: " + python_float(std::round(r.seconds * 1e4) / 1e4) + " s" + (r.cut_short ? " (cut short)" : "");
}

// An integer flag must lie in [lo, hi]; else InputError "--flag: expected an integer from lo to hi, got v".
void check_flag(long long v, double lo, double hi, const char* flag) {
  check_integer(static_cast<double>(v), rules::int_in(lo, hi), flag);
}

// --time-budget: seconds, a positive finite number up to a billion, or "none" (no limit, 0 in the search's
// options, as when the flag is absent).
double parse_time_budget(const std::string& text) {
  if (text.empty() || text == "none") return 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0 || v > 1e9)
    throw InputError("--time-budget: expected a positive number of seconds (at most 1e9) or 'none', got '" +
                     excerpt(text) + "'");
  return v;
}

void check_flags(const SearchArgs& a) {
  parse_time_budget(a.time_budget);
  check_flag(a.model.num_layers, 1, kMaxModelLayers, "--num_layers");
  check_flag(a.gbs, 1, kMaxGlobalBatch, "--gbs");
  check_flag(a.model.hidden_size, 1, static_cast<double>(kMaxHiddenSize), "--hidden_size");
  check_flag(a.model.sequence_length, 1, static_cast<double>(kMaxSequenceLength), "--sequence_length");
  check_flag(a.model.vocab_size, 1, static_cast<double>(kMaxVocabSize), "--vocab_size");
  check_flag(a.model.attention_heads, 1, kMaxAttentionHeads, "--attention_head_size");
  check_flag(a.max_tp, 0, kMaxProfileTp, "--max_profiled_tp_degree");
  check_flag(a.max_bs, 0, kMaxProfileBs, "--max_profiled_batch_size");
  check_flag(a.max_permute_len, 1, kMaxModelLayers, "--max_permute_len");
  check_flag(a.top, 1, 1000000, "--top");
  check_flag(a.threads, 0, 4096, "--threads");
  check_number(a.variance, rules::positive_up_to(1e6), "--min_group_scale_variance");
  if (!(a.gap >= 0 && a.gap <= 10))
    throw InputError("--gap: expected a relative gap from 0 (exact) to 10, got " + python_float(a.gap));
}

// Progress on stderr: where it is a terminal or --progress asks for it, unless --quiet.
bool shows_progress(const SearchArgs& a) { return !a.quiet && (a.progress || isatty(STDERR_FILENO)); }

// Loads the cluster and checks its bandwidths with the one rule simulate uses too.
Cluster load_cluster(const SearchArgs& a) {
  const BandwidthUnit unit = parse_bandwidth_unit(a.bandwidth_unit, "--bandwidth-unit");
  Cluster cluster = Cluster::load(a.hostfile, a.clusterfile);
  check_clusterfile_bandwidths(cluster.clusterfile(), cluster.clusterfile_path(), unit);
  return cluster;
}

// What every plan of the --json file carries: the model (its exact shape, and the config's rope_scaling), the
// batch, the input paths and the precision costed.
PlanFile plan_context(const SearchArgs& a, const ModelShape& shape, Precision precision) {
  PlanFile context;
  context.model = a.model;
  context.shape = shape;
  if (!a.hf_config.empty()) context.rope_scaling = hf_rope_scaling(a.hf_config);
  context.precision = to_string(precision);
  context.gbs = a.gbs;
  context.hostfile = a.hostfile;
  context.clusterfile = a.clusterfile;
  context.profile_dir = a.profile_dir;
  return context;
}

// --cost-model metis's options the flags give; the profile limits default to the largest profiled.
SearchOptions metis_search_options(const SearchArgs& a, const ProfileSet& profiles, bool show_progress) {
  SearchOptions o;
  o.model = a.model;
  o.gbs = a.gbs;
  o.max_profiled_tp = a.max_tp;
  o.max_profiled_bs = a.max_bs;
  if (o.max_profiled_tp <= 0) o.max_profiled_tp = profiles.max_tp();
  if (o.max_profiled_bs <= 0) o.max_profiled_bs = profiles.max_bs();
  o.min_group_scale_variance = a.variance;
  o.max_permute_len = a.max_permute_len;
  o.use_strat = a.use_strat;
  o.top_k = a.top;
  o.threads = a.threads;
  o.reject_dropped_layers = a.reject_dropped_layers;
  if (show_progress)
    o.progress = [](long long done, long long total) {
      std::cerr << "\rsearching: " << done << " / " << total << " inter-stage plans" << std::flush;
    };
  return o;
}

// --cost-model metis found no plan: an InputError (exit code 2) saying at which step none was left.
[[noreturn]] void throw_no_metis_plan(const SearchArgs& a, const Cluster& cluster, const SearchResult& result) {
  std::string why;
  if (result.inter_stage_plans == 0)
    why = "no way to split " + std::to_string(cluster.num_devices()) +
          " GPUs into power-of-two device groups of at most min(GPUs, --num_layers) stages";
  else if (result.candidates == 0)
    why = "no (dp, tp) strategy of any of the " + std::to_string(result.inter_stage_plans) +
          " device layouts fits in GPU memory with the given --gbs and profiled limits";
  else
    why = "every candidate lacked a profile the cost model needs; first: " + result.first_skip_reason;
  throw InputError(a.hostfile + ": no plan exists for this cluster (" + std::to_string(cluster.num_devices()) +
                   " GPUs): " + why);
}

int run_metis_search(const SearchArgs& a) {
  const Cluster cluster = load_cluster(a);
  // The reference's intra-stage search starts each device group at dp = its size.
  if (cluster.num_devices() > kMaxReplicas)
    throw InputError(a.hostfile + ": --cost-model metis: the hostfile lists " + std::to_string(cluster.num_devices()) +
                     " GPUs; the reference search puts a whole device group in data parallelism, and a stage may "
                     "have at most " + std::to_string(kMaxReplicas) + " data-parallel replicas (use the default "
                     "--cost-model sim, or fewer GPUs)");
  const ProfileSet profiles = ProfileSet::load(a.profile_dir, a.model.num_layers, a.threads);
  const bool show_progress = shows_progress(a);
  const MetisSearch search(cluster, profiles, metis_search_options(a, profiles, show_progress));
  SearchResult result;
  double total_ms = 0;
  for (int t = 0; t < a.trials; ++t) {
    result = search.run();
    total_ms += result.seconds * 1000.0;
  }
  if (show_progress && result.seconds >= 1.0) std::cerr << "\n";
  const double average_ms = total_ms / a.trials;

  if (result.skipped > 0)
    std::cerr << "hetplan: note: " << result.skipped << " candidate plan(s) not costed (the reference prints a "
              << "KeyError for each); first: " << result.first_skip_reason << "\n";

  if (result.dropped_layers > 0)
    std::cerr << "hetplan: note: " << result.dropped_layers << " candidate plan(s) had a layer partition that drops "
              << "layers (Metis's layer balancer does this); "
              << (a.reject_dropped_layers ? "they were not costed" : "they were costed as the reference does; "
                                                                      "--reject-dropped-layers leaves them out")
              << "\n";
  if (result.top.empty()) throw_no_metis_plan(a, cluster, result);

  std::cout << "Average time: " << python_float(average_ms) << " ms\n";
  std::cout << "count: " << result.count << "\n";
  std::cout << "rank, cost, node_sequence, device_groups, strategies(dp_deg, tp_deg), batches(number of batch), "
               "layer_partition\n";
  for (std::size_t i = 0; i < result.top.size(); ++i)
    std::cout << reference_plan_line(static_cast<int>(i + 1), result.top[i]) << "\n";
  if (!a.json_out.empty()) {
    const PlanFile context =
        plan_context(a, shape_of_plan(a.model, a.hf_config, "--num_layers and --hidden_size"), Precision::kBf16);
    ordered_json j = search_result_to_json(result, average_ms, a.trials, context);
    j["use_strat"] = a.use_strat;
    j["cost_model"] = "metis";
    write_json_file(a.json_out, j);
  }
  return 0;
}


// "<json stem>.subset<i>.hostfile" next to the --json file: the hostfile of a sub-cluster's plan.
std::string subset_hostfile_name(const std::string& json_out, std::size_t i) {
  std::string stem = std::filesystem::path(json_out).filename().string();
  if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".json") == 0) stem.resize(stem.size() - 5);
  return safe_file_name(stem + ".subset" + std::to_string(i) + ".hostfile");
}

// Writes next to the --json file the hostfile of each sub-cluster smaller than `cluster` that a plan of `r.top`
// runs on (subset_hostfile_name), and returns per sub-cluster the name its plans give as their hostfile (a plan's
// relative hostfile is read from the plan file's folder): "" for the whole cluster and for those no plan uses.
std::vector<std::string> write_subset_hostfiles(const SearchArgs& a, const Cluster& cluster,
                                                const ObjectiveSearchResult& r) {
  const std::filesystem::path dir = std::filesystem::path(a.json_out).parent_path();
  std::vector<std::string> hostfiles(r.subsets.size());
  for (const PricedPlan& p : r.top) {
    std::string& name = hostfiles[p.subset];
    if (!name.empty() || r.clusters[p.subset].num_devices() == cluster.num_devices()) continue;
    name = subset_hostfile_name(a.json_out, p.subset);
    std::string text = "# " + r.subsets[p.subset].label + " of " + a.hostfile + " (hetplan search --objective cost)\n";
    for (const auto& [ip, slots] : r.subsets[p.subset].hosts) text += ip + " slots=" + std::to_string(slots) + "\n";
    write_file_in(dir.empty() ? "." : dir.string(), name, text);
  }
  return hostfiles;
}

// The cost objective found no plan: an InputError (exit code 2) saying whether the deadline or memory left none.
[[noreturn]] void throw_no_priced_plan(const SearchArgs& a, const ObjectiveOptions& objective,
                                       const ObjectiveSearchResult& r) {
  std::string why = objective.deadline_ms > 0 && r.fastest_ms > 0
                        ? "no plan of any sub-cluster runs an iteration within --deadline-ms " +
                              python_float(objective.deadline_ms) + " (the fastest takes " +
                              python_float(std::round(r.fastest_ms * 1000) / 1000) + " ms)"
                        : "no plan of any sub-cluster fits every rank's memory with its profiles";
  if (!r.first_infeasible_reason.empty() && r.fastest_ms < 0) why += "; first: " + r.first_infeasible_reason;
  throw InputError(a.hostfile + ": no plan for --objective cost" +
                   (objective.deadline_ms > 0 ? " under --deadline-ms" : std::string()) + ": " + why);
}

// The cost objective's report on stdout: what was searched, the counts, then each plan's price, time and
// sub-cluster above the plan as the reference prints it (and its setting where settings were searched).
void print_priced_plans(const SearchArgs& a, const ObjectiveOptions& objective,
                        const std::vector<TrainingSetup>& setups, const ObjectiveSearchResult& r) {
  std::cout << "search: least cost per iteration (iteration time x the GPUs' hourly price"
            << (objective.deadline_ms > 0 ? ", iteration at most " + python_float(objective.deadline_ms) + " ms" : "")
            << "), " << r.subsets.size() << " sub-clusters of whole nodes per type"
            << (r.reduced ? " (node counts 0, 1, 2, 4, ... and all per type)" : "") << ", " << r.subsets_with_plans
            << " with plans, gbs " << a.gbs << "\n";
  std::cout << search_counts_line(r) << "\n";
  std::cout << "rank, usd_per_iteration, iteration_ms, usd_per_hour, gpus, node_sequence, device_groups, "
               "strategies(dp_deg, tp_deg), batches(number of batch), layer_partition\n";
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const PricedPlan& p = r.top[i];
    std::cout << i + 1 << ", " << python_float(p.usd_per_iteration) << ", "
              << python_float(std::round(p.searched.plan.cost * 1000) / 1000) << ", " << python_float(p.usd_per_hour)
              << ", " << r.subsets[p.subset].label << "\n";
    std::cout << "   " << reference_plan_line(static_cast<int>(i + 1), p.searched.plan) << "\n";
    if (setups.size() > 1)
      std::cout << "setting " << i + 1 << ": " << setup_label(setups[p.searched.setup])
                << parallel_setup_suffix(setups[p.searched.setup]) << "\n";
  }
}

// --objective cost / --deadline-ms: the cheapest plans per iteration over the cluster and its sub-clusters of
// whole nodes per type (planner/objective.h).
int run_objective_search(const SearchArgs& a, const Cluster& cluster, const ProfileSet& profiles,
                         const ModelShape& shape, const SimulationOptions& so, const PlanSearchOptions& o,
                         const ObjectiveOptions& objective, bool show_progress) {
  cluster_price_per_hour(cluster, a.clusterfile);  // every type priced, else one line naming the first
  for (int t = 0; t < static_cast<int>(cluster.device_types().size()); ++t)
    std::cout << "price: " << cluster.device_types()[t] << " " << python_float(cluster.price_per_gpu_hour(t))
              << " USD per GPU-hour (" << cluster.price_source(t) << ")\n";
  ObjectiveSearchResult r;
  {
    const SigintStopsSearch stop_on_ctrl_c;
    r = search_objective(cluster, profiles, shape, a.model.sequence_length, so, o, objective);
  }
  if (show_progress) std::fprintf(stderr, "\n");
  if (r.cut_short)
    std::cerr << "hetplan: note: the search was cut short (" << r.cut_reason
              << "): the plans below are the cheapest found so far\n";
  if (r.top.empty()) throw_no_priced_plan(a, objective, r);
  print_priced_plans(a, objective, o.setups, r);
  if (!a.json_out.empty()) {
    const PlanFile context = plan_context(a, shape, so.setup.precision);
    write_json_file(a.json_out,
                    objective_search_result_to_json(r, cluster, o.setups, context, to_string(so.schedule),
                                                    objective.deadline_ms, write_subset_hostfiles(a, cluster, r)));
  }
  return 0;
}

// The simulator's options the flags give (schedule, network, clocks, headroom, the profiled setup with
// sequence parallelism and the overlap's buckets). Throws InputError naming a flag.
SimulationOptions simulation_options(const SearchArgs& a, const ProfileSet& profiles) {
  SimulationOptions so;
  so.schedule = parse_schedule(a.schedule, "--schedule");
  so.setup.framework_bytes = -1;  // the profiles' measured framework constant, if they have one
  so.network.unit = parse_bandwidth_unit(a.bandwidth_unit, "--bandwidth-unit");
  so.measured_collectives = parse_collectives(a.collectives);
  so.sustained_clocks = !a.burst_clocks;
  if (a.max_bs > 0) so.max_profiled_bs = a.max_bs;
  parse_memory_headroom(a.memory_headroom, "--memory-headroom", &so.device_memory);
  so.setup = as_profiled(so.setup, profiles, false, false);
  so.setup.sequence_parallel = a.sequence_parallel;
  so.setup.overlap.grad_bucket_params = a.ddp_bucket_params;
  so.setup.overlap.compute_slowdown = a.comm_slowdown;
  return so;
}

// True where --vp's values (parse_virtual_stages) ask for interleaving: more than one, or one above 1.
bool interleaves(const std::vector<int>& vps) { return vps.size() > 1 || vps[0] > 1; }

// --vp's values (parse_virtual_stages), checked against --schedule: interleaving is given by --vp alone, and
// is a 1F1B schedule.
std::vector<int> virtual_stages(const SearchArgs& a, Schedule schedule) {
  const std::vector<int> vps = parse_virtual_stages(a.vp);
  if (schedule == Schedule::kInterleaved1F1B)
    throw InputError("--schedule interleaved: give --vp N (or auto) for the virtual stages; --schedule names the "
                     "schedule of the plans without interleaving");
  if (schedule == Schedule::kGpipe && interleaves(vps))
    throw InputError("--vp " + a.vp + ": interleaving is a 1F1B schedule; drop --schedule gpipe");
  return vps;
}

// The progress line on stderr: the set-up, then units done, counts, the proof so far and the time left.
void print_search_progress(const PlanSearchProgress& p) {
  const std::string proof =
      "best " + ms_text(p.best_ms) + ", bound " + bound_text(p.lower_bound_ms) + ", gap " + gap_text(p.gap);
  if (p.units_total == 0) {  // the set-up (and the seed plans) before the search's units
    std::fprintf(stderr, "\rsetting up the search: %.0f s, %s   ", p.elapsed_s, proof.c_str());
    std::fflush(stderr);
    return;
  }
  std::fprintf(stderr, "\rsearching: %lld/%lld units, %lld enumerated, %lld pruned, %lld costed, %s, ETA %s   ",
               p.units_done, p.units_total, p.enumerated, p.pruned, p.costed, proof.c_str(),
               p.eta_s >= 0 ? (std::to_string(static_cast<long long>(std::ceil(p.eta_s))) + " s").c_str() : "?");
  std::fflush(stderr);
}

// The default search's options the flags give: its space (over the settings of `so.setup`), its stopping
// rules, and Ctrl-C (g_interrupted). Throws InputError naming a flag.
PlanSearchOptions plan_search_options(const SearchArgs& a, const SimulationOptions& so, int gpus, bool show_progress) {
  PlanSearchOptions o;
  o.gbs = a.gbs;
  if (a.max_tp > 0) o.max_tp = a.max_tp;
  if (a.max_stages > 0) o.max_stages = a.max_stages;
  o.allow_cross_node_tp = a.cross_node_tp;
  o.uniform = a.uniform;
  o.stage_boundaries = parse_stage_boundaries(a.stage_boundaries);
  o.setups = with_context_parallel_dimension(
      with_overlap_dimension(search_setups(so.setup, a.zero, a.recompute), a.overlap),
      parse_context_parallel(a.cp, a.model.sequence_length, gpus));
  o.top_k = a.top;
  o.threads = a.threads;
  o.time_budget_s = parse_time_budget(a.time_budget);
  o.gap = a.gap;
  o.cancel = &g_interrupted;
  if (show_progress) o.progress = print_search_progress;
  return o;
}

// No plan to print: an InputError (exit code 2) saying whether the whole space was searched or the search was
// cut short before it found one, with what may help.
[[noreturn]] void throw_no_plan(const SearchArgs& a, const Cluster& cluster, const PlanSearchResult& result) {
  // Exit code 2 (an InputError) either way, as before: the cluster and flags give no plan to print.
  if (result.cut_short) {
    std::string why = "the search was cut short (" + result.cut_reason + ") before it found a plan that fits; "
                      "this does not show that none exists (lower bound so far " + bound_text(result.lower_bound_ms) +
                      "). Try a longer --time-budget" + std::string(a.zero != "auto" || a.recompute != "auto" ?
                      ", --zero auto --recompute auto (ZeRO and recomputation save memory)" : "") +
                      ", --stage-boundaries node (a smaller space), or --max-stages";
    if (!result.first_infeasible_reason.empty()) why += "; first plan out of memory: " + result.first_infeasible_reason;
    throw InputError(a.hostfile + ": no plan found for this cluster (" + std::to_string(cluster.num_devices()) +
                     " GPUs, gbs " + std::to_string(a.gbs) + "): " + why);
  }
  std::string why = "the whole space was searched and no plan of it fits every rank's memory with its profiles";
  if (a.zero != "auto" || a.recompute != "auto") why += " (--zero auto --recompute auto may find one)";
  if (!result.first_infeasible_reason.empty()) why += "; first: " + result.first_infeasible_reason;
  throw InputError(a.hostfile + ": no plan exists for this cluster (" + std::to_string(cluster.num_devices()) +
                   " GPUs, gbs " + std::to_string(a.gbs) + "): " + why);
}

// The default search's report on stdout: what was searched, the counts, the proof, then each plan as the
// reference prints it (with its setting and schedule where those were searched).
void print_plans(const SearchArgs& a, const Cluster& cluster, int layers, const SimulationOptions& so,
                 const PlanSearchOptions& o, const std::vector<int>& vps, const PlanSearchResult& result) {
  std::cout << "search: simulated iteration time (" << to_string(so.schedule)
            << (interleaves(vps) ? ", virtual stages " + a.vp + " (interleaved 1F1B)" : "")
            << (a.cp != "1" ? ", context parallelism --cp " + a.cp : "") << "), "
            << cluster.num_devices()
            << " GPUs, gbs " << a.gbs << ", " << layers << " layers"
            << (whole_node_stages(o.stage_boundaries, cluster.num_devices())
                    ? ", stages of whole nodes (--stage-boundaries rank for any GPU)"
                    : "")
            << "\n";
  std::cout << search_counts_line(result) << "\n";
  std::cout << "best: " << ms_text(result.best_ms) << ", lower bound: " << bound_text(result.lower_bound_ms)
            << ", gap: " << gap_text(result.gap)
            << (result.proven ? (a.gap > 0 ? " (proven within --gap " + python_float(a.gap) + ")" : " (proven optimal)")
                              : " (not proven: cut short)")
            << ", first plan after " << python_float(std::round(result.first_plan_s * 1e3) / 1e3) << " s\n";
  std::cout << "rank, iteration_ms, node_sequence, device_groups, strategies(dp_deg, tp_deg), batches(number of batch), "
               "layer_partition\n";
  for (std::size_t i = 0; i < result.top.size(); ++i) {
    std::cout << reference_plan_line(static_cast<int>(i + 1), result.top[i].plan) << "\n";
    if (o.setups.size() > 1)
      std::cout << "setting " << i + 1 << ": " << setup_label(o.setups[result.top[i].setup])
                << parallel_setup_suffix(o.setups[result.top[i].setup]) << "\n";
    if (interleaves(vps))
      std::cout << "schedule " << i + 1 << ": "
                << (result.top[i].virtual_stages > 1
                        ? "interleaved 1F1B, " + std::to_string(result.top[i].virtual_stages) + " virtual stages per rank"
                        : std::string(to_string(so.schedule)))
                << "\n";
  }
}

// The default: the simulator's iteration time over plans that fit every rank's
// memory, keep tp inside nodes and train every layer and sample (planner/plan_search.h).
int run_default_search(const SearchArgs& a) {
  const Cluster cluster = load_cluster(a);
  const ProfileSet profiles = ProfileSet::load(a.profile_dir, a.model.num_layers, a.threads);
  warn_profile_holes(profiles);
  const SimulationOptions so = simulation_options(a, profiles);
  const ModelShape shape = shape_of_plan(a.model, a.hf_config, "--num_layers and --hidden_size");
  check_shape_against_profiles(a, shape, profiles.model());
  const std::vector<int> vps = virtual_stages(a, so.schedule);
  const bool show_progress = shows_progress(a);
  const PlanSearchOptions o = plan_search_options(a, so, cluster.num_devices(), show_progress);

  ObjectiveOptions objective;
  objective.objective = parse_objective(a.objective, "--objective");
  objective.deadline_ms = a.deadline_ms;
  if (objective.objective == Objective::kCost || objective.deadline_ms > 0) {
    if (interleaves(vps))
      throw InputError("--vp " + a.vp + ": the cost objective (--objective cost, --deadline-ms) searches plain "
                       "schedules only; drop --vp");
    return run_objective_search(a, cluster, profiles, shape, so, o, objective, show_progress);
  }

  PlanSearchResult result;
  {
    const SigintStopsSearch stop_on_ctrl_c;
    result = search_virtual_stages(cluster, profiles, shape, a.model.sequence_length, so, o, vps);
  }
  if (show_progress) std::fprintf(stderr, "\n");

  if (result.cut_short && !result.top.empty())
    std::cerr << "hetplan: note: the search was cut short (" << result.cut_reason << "): the plans below are the "
              << "best found so far, within " << gap_text(result.gap) << " of the optimum (lower bound "
              << bound_text(result.lower_bound_ms) << "); --gap " << python_float(a.gap) << " was not yet proven\n";
  if (result.top.empty()) throw_no_plan(a, cluster, result);
  print_plans(a, cluster, profiles.num_layers(), so, o, vps, result);

  if (!a.json_out.empty()) {
    const PlanFile context = plan_context(a, shape, so.setup.precision);
    write_json_file(a.json_out, plan_search_result_to_json(result, cluster, o.setups, context, to_string(so.schedule)));
  }
  return 0;
}

int run_search(const SearchArgs& a) {
  check_flags(a);
  if (a.cost_model == "metis") return run_metis_search(a);
  if (a.cost_model == "sim") {
    warn_metis_only_flags(a);
    return run_default_search(a);
  }
  throw InputError("--cost-model: '" + excerpt(a.cost_model) + "': expected sim (the default) or metis");
}

constexpr const char* kSearchDescription =
    "Find the training plans with the lowest simulated iteration time on a (heterogeneous) cluster.\n\n"
    "By default (--cost-model sim) it searches node orders, micro-batch counts dividing --gbs, pipeline\n"
    "stages of any size on real node boundaries (whole nodes above 256 GPUs: --stage-boundaries), (dp, tp)\n"
    "per stage with tp inside one node, and the layers of each stage, and keeps only plans that train\n"
    "every layer and sample and fit every rank's memory. It prunes only with lower bounds (exact at\n"
    "--gap 0, within --gap otherwise) and streams, so memory stays flat; --time-budget or Ctrl-C return\n"
    "the best plans found so far. Each plan's cost is the iteration time `hetplan simulate` reports for it; --json\n"
    "names the host and GPU of every rank.\n\n"
    "Anytime: it first costs hand-written-style plans (Megatron grids: tp inside a node, pp, dp, layers\n"
    "split by compute), so a plan is known within seconds; it then prints the best plan, a lower bound\n"
    "on the optimum over the whole space and the gap between them, and stops once the gap is within\n"
    "--gap (default 1%; --gap 0 is exact). \"no plan exists\" means the whole space was searched; a\n"
    "search cut short without a plan says so. Both exit with code 2.\n\n"
    "--cost-model metis reproduces the Metis reference (cost_het_cluster.py, livingshade/Metis@900445f)\n"
    "bit for bit, quirks included: use it to reproduce the paper's Table 1, not to plan a cluster.\n"
    "Flags marked [metis] act only there: the default search ignores them with a warning on stderr.\n\n"
    "Example:\n"
    "  hetplan search --hostfile hostfiles/a100_v100_16.hostfile --clusterfile hostfiles/clusterfile.json \\\n"
    "                 --profiles profiles --num_layers 10 --gbs 64 --top 3 --json plans.json";

// The inputs: hostfile, clusterfile, profiles, the model's layers and shape, the global batch.
void add_input_flags(CLI::App* s, SearchArgs& a) {
  s->add_option("--hostfile_path,--hostfile-path,--hostfile", a.hostfile, "Hostfile: '<ip> slots=<N>' per node")
      ->required();
  s->add_option("--clusterfile_path,--clusterfile-path,--clusterfile", a.clusterfile,
                "Clusterfile JSON: ip -> instance_type, inter_bandwidth, intra_bandwidth, memory")
      ->required();
  s->add_option("--profile_data_path,--profile-data-path,--profiles", a.profile_dir,
                "Folder of DeviceType.<TYPE>_tp<T>_bs<B>.json profiles")
      ->required();
  s->add_option("--num_layers,--num-layers", a.model.num_layers, "Layers, embedding and head included")->required();
  s->add_option("--gbs", a.gbs, "Global batch size")->required();
  s->add_option("--hidden_size,--hidden-size", a.model.hidden_size, "Hidden size")->capture_default_str();
  s->add_option("--sequence_length,--sequence-length", a.model.sequence_length, "Sequence length")
      ->capture_default_str();
  s->add_option("--vocab_size,--vocab-size", a.model.vocab_size, "Vocabulary size")->capture_default_str();
  s->add_option("--attention_head_size,--attention-head-size,--heads", a.model.attention_heads,
                "Attention heads (not used by the Metis cost model)")
      ->capture_default_str();
  s->add_option("--model_name,--model-name", a.model.name, "Model name, for the record")->capture_default_str();
  s->add_option("--model_size,--model-size", a.model.size, "Model size label, for the record")
      ->capture_default_str();
}

// The largest tp and micro-batch either search may use.
void add_profile_limit_flags(CLI::App* s, SearchArgs& a) {
  s->add_option("--max_profiled_tp_degree,--max-profiled-tp-degree", a.max_tp,
                "Largest tp the search may use (default: the largest profiled)");
  s->add_option("--max_profiled_batch_size,--max-profiled-batch-size", a.max_bs,
                "Largest micro-batch the search may use (default: the largest profiled)");
}

// The [metis] flags: --cost-model metis's space and trials (metis_only_flags_given names those given).
void add_metis_flags(CLI::App* s, SearchArgs& a) {
  s->add_option("--min_group_scale_variance,--min-group-scale-variance", a.variance,
                "[metis] Smallest device group allowed, as a multiple of GPUs/stages")
      ->capture_default_str();
  s->add_option("--max_permute_len,--max-permute-len", a.max_permute_len,
                "[metis] Most device groups permuted independently; smaller groups are merged beyond it")
      ->capture_default_str();
  s->add_option("--trials", a.trials, "[metis] Repeat the search and report the average time (the reference defaults to 10)")
      ->capture_default_str()
      ->check(kPositiveNumber);
  s->add_flag("--use_strat,--use-strat,!--no-use_strat,!--no-use-strat", a.use_strat,
              "[metis] Stratified pruning: steer the DFS by the first out-of-memory state (livingshade/Metis)");
  s->add_flag("--reject-dropped-layers,--reject_dropped_layers", a.reject_dropped_layers,
              "[metis] Do not cost plans whose layer partition drops layers (a reference bug, kept by default)");
}

// What is reported and how: --json, --top, threads and progress.
void add_output_flags(CLI::App* s, SearchArgs& a) {
  s->add_option("--json", a.json_out, "Write the results as JSON to this file");
  s->add_option("--top", a.top, "Report the K cheapest plans")->capture_default_str()->check(kPositiveNumber);
  s->add_option("--threads", a.threads,
                "Threads that read the profiles and search (default: all cores); the plans found do not depend on "
                "it unless --time-budget or Ctrl-C cuts the search short");
  s->add_flag("--progress", a.progress, "Show progress on stderr even when it is not a terminal");
  s->add_flag("--quiet,-q", a.quiet, "No progress output");
}

// The cost model, and under sim the pipeline schedule, interleaving and tp across nodes.
void add_cost_model_flags(CLI::App* s, SearchArgs& a) {
  s->add_option("--cost-model,--cost_model", a.cost_model,
                "sim (default: the simulator's iteration time, plans a practitioner can run) or metis (the Metis "
                "reference's search and formula, bit for bit, to reproduce the paper)")
      ->capture_default_str();
  s->add_option("--schedule", a.schedule, "With --cost-model sim: pipeline schedule, gpipe or 1f1b")
      ->capture_default_str();
  s->add_option("--vp", a.vp,
                "With --cost-model sim: virtual stages (model chunks) per pipeline rank, Megatron's interleaved "
                "1F1B: 1 (none), N, or auto (1 to 4 searched as a dimension). Interleaving cuts the bubble about "
                "v-fold for more p2p sends; it needs pp >= 2, micro-batches a multiple of pp and each stage at "
                "least v layers, which the search keeps to")
      ->capture_default_str();
  s->add_flag("--allow-cross-node-tp", a.cross_node_tp,
              "With --cost-model sim: let tp groups span nodes (their all-reduces are then costed over the "
              "inter-node link); by default every tp group stays inside one node and one GPU type");
}

// When the default search stops: a time budget, or the best plan proven within a gap.
void add_stopping_flags(CLI::App* s, SearchArgs& a) {
  s->add_option("--time-budget", a.time_budget,
                "With --cost-model sim: stop after this many seconds and report the best plans found so far, with "
                "a lower bound on the optimum and the gap between them (Ctrl-C does the same); a positive number, "
                "or none (the default) for no limit");
  s->add_option("--gap", a.gap,
                "With --cost-model sim: stop once the best plan is proven within this relative gap of the optimum "
                "(0.01: at most 1% slower than the best plan of the space); 0 is exact (the same plans as "
                "exhaustive enumeration). The search prunes every plan a bound shows cannot beat best / (1 + gap)")
      ->capture_default_str();
}

// The default search's space: pipeline depth and stage boundaries, ZeRO, recomputation, sequence
// parallelism and overlapped communication (each fixed, or auto: a dimension).
void add_space_flags(CLI::App* s, SearchArgs& a) {
  s->add_option("--max-stages", a.max_stages, "With --cost-model sim: deepest pipeline considered (default: layers)")
      ->check(kPositiveNumber);
  s->add_option("--stage-boundaries", a.stage_boundaries,
                "With --cost-model sim: where pipeline stages may start: rank (any GPU), node (whole nodes only, "
                "as Megatron-LM places stages when dp x tp fills nodes) or auto (node above " +
                    std::to_string(kWholeNodeStagesAbove) + " GPUs, else rank)")
      ->capture_default_str();
  s->add_option("--zero", a.zero,
                "With --cost-model sim: ZeRO stage 0-3, or auto (the default) to search every stage as a dimension "
                "(each plan takes its fastest stage that fits memory); --zero 0 --recompute none searches plain "
                "data parallelism without recomputation only, as before")
      ->capture_default_str();
  s->add_option("--recompute", a.recompute,
                "With --cost-model sim: none, selective, full, or auto (the default) to search them as a dimension. "
                "Where no node holds every layer's model states, the settings without full recomputation are "
                "searched first and full recomputation after, under bounds that price its recomputed forward "
                "(planner/plan_search.md, \"Settings in parts\")")
      ->capture_default_str();
  s->add_flag("--sequence-parallel", a.sequence_parallel,
              "With --cost-model sim: Megatron sequence parallelism at every tp > 1 (activations between the "
              "blocks split by tp; all-gather and reduce-scatter in place of the all-reduces)");
  s->add_option("--cp", a.cp,
                "With --cost-model sim: context parallelism (Megatron's --context-parallel-size: ring attention "
                "over cp ranks): 1 (none), N (every plan at cp N) or auto (1, 2, 4, ... up to the GPUs, searched "
                "as a dimension, each plan at its fastest size). A stage's dp then counts dp / cp groups of cp "
                "ranks (Megatron's rank order tp, cp, dp); the micro-batch splits over the groups, each rank holds "
                "seq / cp tokens of its group's samples (1/cp of the activations) and computes 1/cp of them, the "
                "K/V ring steps cost as `simulate --context-parallel` prices them, and gradients are reduced over "
                "dp x cp. Sizes above 1 need the sequence length a multiple of 2 x cp (Megatron's causal load "
                "balance). It pays where activations bind memory (long sequences); the default is 1 because "
                "each size is a search of its own (auto costs about that many times the search's time) and "
                "keeps the plans and the speed of a search without cp")
      ->capture_default_str();
  s->add_option("--overlap", a.overlap,
                "With --cost-model sim: overlapped data-parallel communication (bucketed gradient reduction "
                "during the backward; weight gathers during the forward with ZeRO): off, on, or auto to search "
                "it as a dimension")
      ->capture_default_str();
}

// How the simulator costs a plan: DDP buckets, compute slowed by collectives, the clusterfile's bandwidths,
// the collectives' bandwidth, clocks and the memory headroom.
void add_costing_flags(CLI::App* s, SearchArgs& a) {
  s->add_option("--ddp-bucket-size", a.ddp_bucket_params,
                "With --cost-model sim and --overlap: parameters per bucket (default: Megatron's max(40M, 1M x dp))")
      ->check(CLI::Range(0.0, 1e13));
  s->add_option("--comm-slowdown", a.comm_slowdown,
                "With --cost-model sim and --overlap: compute time while a collective shares the SMs over its "
                "time alone, for every collective (default: the profile folder's comm_overlap.json, measured by "
                "scripts/gpu_overlap_probe.sh, else 1.035; sim/dp_overlap.md)")
      ->check(CLI::Range(1.0, 10.0));
  s->add_option("--bandwidth-unit", a.bandwidth_unit,
                "Clusterfile bandwidth unit, GB/s, GiB/s or bytes/s (checked for plausibility under either cost model)")
      ->capture_default_str();
  s->add_option("--collectives", a.collectives,
                "With --cost-model sim: intra-node all-reduce bandwidth, measured (by the profiler) or clusterfile")
      ->capture_default_str();
  s->add_flag("--burst-clocks", a.burst_clocks,
              "With --cost-model sim: cost every stage at the profiles' burst timings (by default the pace-setting "
              "stage runs at the sustained, power-limited pace the profiler measured)");
  add_memory_headroom_option(s, &a.memory_headroom);
}

// Which plans are kept (--uniform) and which is best: time, or cost per iteration (--objective, --deadline-ms).
void add_choice_flags(CLI::App* s, SearchArgs& a) {
  s->add_flag("--uniform", a.uniform,
              "Keep only plans Megatron-LM and DeepSpeed run as is: the same (dp, tp) in every stage, each micro-batch "
              "split evenly over dp, ZeRO 0 or 1 when pipelined (DeepSpeed's pipeline engine); any GPU type per stage "
              "and uneven layer splits stay allowed. Without it, --json still says per plan which exporters take it "
              "(\"exporters\": megatron, deepspeed, torchrun)");
  s->add_option("--objective", a.objective,
                "What the best plan minimises: time (iteration time) or cost (USD per iteration = iteration time x "
                "the hourly price of the GPUs it uses; prices from the clusterfile's price_per_gpu_hour, else the GPU "
                "catalogue's on-demand list price). cost also searches sub-clusters of whole nodes per type, where "
                "fewer or cheaper GPUs cost less per iteration")
      ->capture_default_str();
  s->add_option("--deadline-ms", a.deadline_ms,
                "The cheapest plan whose iteration takes at most this many ms, over the cluster and its sub-clusters "
                "of whole nodes per type (implies --objective cost)")
      ->check(kPositiveNumber);
}

}  // namespace

Runner add_search_command(CLI::App& app) {
  auto a = std::make_shared<SearchArgs>();
  CLI::App* s = app.add_subcommand("search", kSearchDescription);
  add_input_flags(s, *a);
  add_profile_limit_flags(s, *a);
  add_metis_flags(s, *a);
  s->add_option("--hf-config", a->hf_config,
                "With --cost-model sim: the model's Hugging Face config.json (gpt2, llama, mistral) for its shape "
                "(parameters, FLOPs, activations); its blocks + 2 must equal --num_layers");
  add_output_flags(s, *a);
  add_cost_model_flags(s, *a);
  add_stopping_flags(s, *a);
  add_space_flags(s, *a);
  add_costing_flags(s, *a);
  add_choice_flags(s, *a);
  s->add_option("--log_path,--home_dir", a->log_path, "Accepted for compatibility with the reference; unused");
  return [a, s] {
    a->metis_only_given = metis_only_flags_given(*s);
    return run_search(*a);
  };
}

}  // namespace hetplan::cli
