// `hetplan profile`: measure per-layer time and memory of a GPT with LibTorch
// and write Metis-format profiles that `hetplan search` reads.
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "sim/gpu_specs.h"
#include "profiler/device_meter.h"
#include "profiler/distributed.h"
#include "profiler/host_meter.h"
#include "profiler/green_context.h"
#include "profiler/layer_profiler.h"
#include "sim/cluster.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/memory_model.h"
#include "sim/model_shape.h"

namespace hetplan::cli {

namespace fs = std::filesystem;
using namespace hetplan::profiler;

namespace {

// profile's model defaults: GPT-2 family, vocabulary 51200 (Metis's), hidden 4096, 32 heads.
ModelFlags profile_model_defaults() {
  ModelFlags f;
  f.family = "gpt2";
  f.vocab_size = 51200;
  return f;
}

struct ProfileArgs {
  int64_t layers = 10, seq = 1024;  // layers: Metis layers (--num-layers)
  ModelFlags model = profile_model_defaults();  // blocks_given: --num-layers overrides an --hf-config's
  std::string recompute = "none";
  std::string tp = "1", bs = "1,2,4", device_type, dtype = "bf16", device = "auto", out, host = "auto";
  std::string clusterfile;  // declares emulated device types (sim/cluster.h)
  int warmup = 3, iters = 10, timeout_s = 600;
  double sustained_seconds = -1;  // -1: 3 on GPUs, 0 on CPU
  double boost_idle_ms = 0;       // 0: off
  int64_t cpu_memory_limit_mb = 0;
  uint64_t seed = 1234;
  std::vector<std::string> argv;  // as given, to start ranks with
};

std::vector<int> parse_ints(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      const int v = std::stoi(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw InputError(flag + ": expected a comma-separated list of positive integers, got '" + excerpt(s) + "'");
    }
  }
  if (out.empty()) throw InputError(flag + ": expected at least one value");
  return out;
}

// The emulated device types --clusterfile declares. A --device-type spelled
// like one ("<BASE>-<N>sm") that none declares is refused: it would label
// whole-GPU measurements as a partition's.
std::vector<std::pair<std::string, EmulatedDevice>> declared_types(const ProfileArgs& a) {
  std::vector<std::pair<std::string, EmulatedDevice>> types;
  if (!a.clusterfile.empty()) types = parse_emulated_device_types(a.clusterfile);
  const std::string& t = a.device_type;
  const std::size_t dash = t.rfind('-');
  const bool looks_emulated = dash != std::string::npos && t.size() > dash + 3 && t.compare(t.size() - 2, 2, "sm") == 0 &&
                              std::all_of(t.begin() + dash + 1, t.end() - 2, [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  const bool declared = std::any_of(types.begin(), types.end(), [&](const auto& d) { return d.first == t; });
  if (looks_emulated && !declared)
    throw InputError("--device-type '" + excerpt(t) + "': named like an emulated type (<BASE>-<N>sm), but " +
                     (a.clusterfile.empty() ? std::string("no --clusterfile is given")
                                            : "--clusterfile " + a.clusterfile + " does not declare it") +
                     "; expected a clusterfile with \"device_types\": {\"" + excerpt(t) +
                     "\": {\"emulate\": {\"base\": ..., \"sms\": ...}}}");
  return types;
}

// "NVIDIA H200" -> "H200"; the CPU -> "CPU".
std::string default_device_type(torch::Device d) {
  std::string name = device_description(d);
  if (!d.is_cuda()) return "CPU";
  // The catalogue's name for it (sim/gpu_specs.h), so profiles, whatif and the MFU agree.
  if (const GpuSpec* g = match_device_description(name)) return g->name;
  std::string out;
  for (char c : name)
    if (std::isalnum(static_cast<unsigned char>(c))) out += c;
  return out.empty() ? "GPU" : out;
}

std::string status_path(const std::string& out, int tp) {
  return (fs::path(out) / (".hetplan-profile-tp" + std::to_string(tp) + ".jsonl")).string();
}

ordered_json outcome_json(int tp, const BatchOutcome& o) {
  return {{"tp", tp},        {"bs", o.bs},         {"ok", o.ok},
          {"error", o.error}, {"path", o.path},     {"block_ms", o.block_ms},
          {"block_tflops", o.block_tflops}, {"block_spread", o.block_spread}, {"block_boost_ms", o.block_boost_ms}};
}

void print_outcome(int tp, const BatchOutcome& o) {
  std::cout << "tp " << tp << " bs " << std::setw(4) << o.bs << ": ";
  if (!o.ok) {
    std::cout << "skipped (" << o.error << ")\n";
  } else {
    std::cout << "block " << std::fixed << std::setprecision(3) << o.block_ms << " ms, " << std::setprecision(1)
              << o.block_tflops << " TFLOP/s, spread " << std::setprecision(1) << 100 * o.block_spread << "%";
    if (o.block_boost_ms > 0) std::cout << ", from idle " << std::setprecision(3) << o.block_boost_ms << " ms";
    std::cout << (o.path.empty() ? "" : "  -> " + o.path) << "\n";
  }
  std::cout.unsetf(std::ios::fixed);
  std::cout << std::flush;
}

// The model: an --hf-config, or the shape flags; --num-layers counts Metis layers.
ModelShape model_shape(const ProfileArgs& a) {
  if (a.layers < 3) throw InputError("--num-layers: must be at least 3 (embedding, a block, head)");
  check_integer(static_cast<double>(a.layers), rules::int_in(3, kMaxModelLayers), "--num-layers");
  check_model_shape_flags(a.model);
  ModelFlags f = a.model;
  f.blocks = blocks_from_metis_layers(static_cast<int>(a.layers));
  return shape_from_flags(f, a.seq);
}

ProfileRequest make_request(const ProfileArgs& a, torch::Device device) {
  ProfileRequest r;
  r.model.shape = model_shape(a);
  r.model.seq_len = a.seq;
  r.model.seed = a.seed;
  r.model.recompute = parse_recompute(a.recompute, "--recompute");
  r.batch_sizes = parse_ints(a.bs, "--bs");
  r.warmup = a.warmup;
  r.iters = a.iters;
  r.sustained_seconds = a.sustained_seconds >= 0 ? a.sustained_seconds : (device.is_cuda() ? 3.0 : 0.0);
  r.boost_idle_ms = a.boost_idle_ms;
  r.device = device;
  r.dtype = parse_dtype(a.dtype);
  r.dtype_name = a.dtype;
  r.device_type = a.device_type.empty() ? default_device_type(device) : a.device_type;
  r.out_dir = a.out;
  return r;
}

// One rank of a tp group started by us or by torchrun.
int run_worker(const ProfileArgs& a, const DistEnv& env) {
  ignore_broken_pipes();
  const torch::Device device = parse_device(a.device, env.local_rank);
  ProfileRequest req = make_request(a, device);
  use_device(device);
  // An emulated type: every kernel of the measurement in its SM partition.
  const auto partition = enter_device_type(device, req.device_type, declared_types(a));
  if (partition) req.emulation = partition->record();
  auto collectives = make_collectives(env, device, std::chrono::seconds(a.timeout_s));
  const TensorParallelGroup group(env.rank, env.world_size, collectives);
  const std::string status = status_path(a.out, env.world_size);
  profile_batch_sizes(req, group, [&](const BatchOutcome& o) {
    if (env.rank == 0 || !o.ok) {
      std::ofstream(status, std::ios::app) << outcome_json(env.world_size, o).dump() << "\n";
    }
    // After an out-of-memory error the ranks may be in different collectives:
    // leave, and let the launcher stop the group.
    if (!o.ok) std::_Exit(42);
  });
  return 0;
}

int run_profile(ProfileArgs a) {
  if (a.out.empty()) throw InputError("--out: required (the folder for the profile files)");
  if (a.cpu_memory_limit_mb > 0 && !DeviceMeter::set_cpu_memory_limit(a.cpu_memory_limit_mb * 1024 * 1024))
    throw InputError("--cpu-memory-limit-mb: not supported with this LibTorch version");
  fs::create_directories(a.out);
  if (const auto env = DistEnv::from_env()) return run_worker(a, *env);

  const std::vector<int> tps = parse_ints(a.tp, "--tp");
  const torch::Device device = parse_device(a.device, 0);
  ProfileRequest probe = make_request(a, device);  // validates the flags
  const auto emulated = declared_types(a);
  const int gpus = device.is_cuda() ? static_cast<int>(torch::cuda::device_count()) : 0;
  for (int tp : tps) {
    if (device.is_cuda() && tp > gpus)
      throw InputError("--tp " + std::to_string(tp) + ": needs " + std::to_string(tp) + " GPUs, but " +
                       std::to_string(gpus) + " are visible");
    // Gloo's all-reduce knows no 16-bit floats (LibTorch 1.13 and 2.x alike).
    if (!device.is_cuda() && tp > 1 && probe.dtype != torch::kFloat32)
      throw InputError("--tp " + std::to_string(tp) + " on CPU: the Gloo backend cannot all-reduce " + a.dtype +
                       " tensors; pass --dtype fp32 (or profile tp 1 only)");
    probe.model.validate(tp, "--tp " + std::to_string(tp));
  }
  const ModelShape& m = probe.model.shape;
  std::cout << "profiling " << m.name << " (" << (m.mlp == MlpKind::kSwiGlu ? "llama" : "gpt2") << ", "
            << m.parameter_count() << " parameters) h=" << m.hidden_size << " layers=" << probe.model.num_layers()
            << " seq=" << a.seq << " vocab=" << m.vocab_size << " heads=" << m.num_heads << "/" << m.num_kv_heads
            << " ffn=" << m.ffn_hidden_size << (m.tied_embeddings ? " tied" : " untied") << " " << a.dtype << " on "
            << device_description(device) << " as " << probe.device_type << "\n";

  ordered_json summary = ordered_json::array();
  std::unique_ptr<SmPartition> partition;  // tp 1 runs here: an emulated type's partition, entered once
  for (int tp : tps) {
    if (tp == 1) {
      if (!partition && (partition = enter_device_type(device, probe.device_type, emulated)))
        probe.emulation = partition->record();
      const auto outcomes =
          profile_batch_sizes(probe, TensorParallelGroup(), [&](const BatchOutcome& o) { print_outcome(1, o); });
      for (const auto& o : outcomes) summary.push_back(outcome_json(1, o));
      continue;
    }
    const std::string status = status_path(a.out, tp);
    fs::remove(status);
    const LaunchResult r = launch_local_ranks(a.argv, tp, free_local_port(), std::chrono::seconds(20),
                                              std::chrono::seconds(a.timeout_s * 4));
    std::set<int> seen;
    std::ifstream in(status);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      ordered_json j = ordered_json::parse(line);
      BatchOutcome o;
      o.bs = j["bs"];
      if (!seen.insert(o.bs).second) continue;
      o.ok = j["ok"];
      o.error = j["error"];
      o.path = j["path"];
      o.block_ms = j["block_ms"];
      o.block_tflops = j["block_tflops"];
      o.block_spread = j["block_spread"];
      o.block_boost_ms = j.value("block_boost_ms", 0.0);
      print_outcome(tp, o);
      summary.push_back(outcome_json(tp, o));
    }
    fs::remove(status);
    for (int bs : probe.batch_sizes) {
      if (seen.count(bs)) continue;
      BatchOutcome o;
      o.bs = bs;
      o.error = r.ok() ? "not run" : "not run: the tp group stopped at a smaller batch size";
      print_outcome(tp, o);
      summary.push_back(outcome_json(tp, o));
    }
    bool oom = false;
    for (const auto& s : summary)
      if (s["tp"] == tp && !s["ok"].get<bool>() && s["error"].get<std::string>().rfind("out of memory", 0) == 0)
        oom = true;
    if (!r.ok() && !oom) {
      std::string codes;
      for (int c : r.exit_codes) codes += (codes.empty() ? "" : ",") + std::to_string(c);
      throw InputError("profile: the tp=" + std::to_string(tp) + " ranks failed (exit codes " + codes + ")");
    }
  }
  write_json_file((fs::path(a.out) / "profile_run.json").string(), summary);
  std::cout << "wrote " << (fs::path(a.out) / "profile_run.json").string() << "\n";
  // The host, for ZeRO-Offload's cost (whatif, simulate): pinned copies and CPU Adam.
  if (a.host == "on" || (a.host == "auto" && device.is_cuda())) {
    const HostMeasurement h = measure_host(device.is_cuda());
    const std::string path = (fs::path(a.out) / "whatif_calibration.json").string();
    write_host_calibration(h, path, device_description(device));
    std::cout << "host: pinned h2d " << h.h2d_gbs << " GB/s, d2h " << h.d2h_gbs << " GB/s per GPU ("
              << h.gpus << " at once), CPU Adam " << h.cpu_adam_params_per_s / 1e9 << "e9 params/s on " << h.threads
              << " threads" << (h.note.empty() ? "" : " (" + h.note + ")") << " -> " << path << "\n";
  }
  return 0;
}

}  // namespace

Runner add_profile_command(CLI::App& app, int argc, char** argv) {
  auto a = std::make_shared<ProfileArgs>();
  for (int i = 1; i < argc; ++i) a->argv.push_back(argv[i]);
  CLI::App* s = app.add_subcommand(
      "profile",
      "Measure per-layer forward+backward time and memory of a GPT (embedding, blocks, head, as Metis counts\n"
      "layers) with LibTorch, for each tp and micro-batch size, and write DeviceType.<TYPE>_tp<T>_bs<B>.json\n"
      "files for `hetplan search`. tp > 1 starts one process per rank (NCCL on GPUs, Gloo on the CPU); under\n"
      "torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) each process is one rank of tp = WORLD_SIZE.");
  add_model_shape_flags(s, a->model);
  CLI::Option* layers = s->add_option("--num-layers", a->layers, "Metis layers: embedding + transformer blocks + head")
                            ->capture_default_str();
  s->add_option("--seq-len", a->seq, "Sequence length")->capture_default_str();
  s->add_option("--recompute", a->recompute, "Activation recomputation: none, selective or full")
      ->capture_default_str();
  s->add_option("--tp", a->tp, "Tensor-parallel degrees, e.g. 1,2,4")->capture_default_str();
  s->add_option("--bs", a->bs, "Micro-batch sizes, e.g. 1,2,4,8")->capture_default_str();
  s->add_option("--device-type", a->device_type, "Device type name in the file names (default: from the GPU name)");
  s->add_option("--clusterfile", a->clusterfile,
                "Clusterfile whose \"device_types\" declare emulated types: a --device-type declared there as "
                "{\"emulate\": {\"base\": \"H200\", \"sms\": 33}} is profiled with every kernel inside a CUDA "
                "green context of that many SMs (CUDA builds only)");
  s->add_option("--dtype", a->dtype, "bf16, fp16 or fp32")->capture_default_str();
  s->add_option("--device", a->device, "auto, cuda or cpu")->capture_default_str();
  s->add_option("--warmup", a->warmup, "Unmeasured iterations first")->capture_default_str();
  s->add_option("--iters", a->iters, "Measured iterations (the median is reported)")->capture_default_str();
  s->add_option("--sustained-seconds", a->sustained_seconds,
                "Also run the whole model back to back this long and record the pace a GPU that never idles holds "
                "under its power limit (sustained_forward_backward_ms); 0 skips it (default: 3 on GPUs, 0 on CPU)");
  s->add_option("--boost-idle-ms", a->boost_idle_ms,
                "Also time each layer's forward and backward on its own after this many ms of idle, the pace of a "
                "GPU at its boost clocks, which a chained pass of large layers does not hold (layer_boost_ms; not "
                "used by the simulator; 30 suits an H200: it is back at boost after 20 ms idle); 0 skips it. It adds "
                "2 x layers x iters x that much idle per (tp, bs)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10000.0));
  s->add_option("--out,-o", a->out, "Output folder")->required();
  s->add_option("--host", a->host,
                "Measure the host for offload costs (pinned copy GB/s, CPU Adam) into OUT/whatif_calibration.json: "
                "auto (on GPUs), on or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  s->add_option("--timeout-s", a->timeout_s, "Bound on each collective, in seconds")->capture_default_str();
  s->add_option("--cpu-memory-limit-mb", a->cpu_memory_limit_mb,
                "CPU runs: treat allocations past this many MB as out of memory (emulates a device's capacity)");
  s->add_option("--seed", a->seed, "Weight initialisation seed")->capture_default_str();
  return [a, layers] {
    a->model.blocks_given = layers->count() > 0;
    return run_profile(*a);
  };
}

}  // namespace hetplan::cli
