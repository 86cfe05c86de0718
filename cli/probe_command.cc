// `hetplan gpu-probe`: a bf16 GEMM's TFLOP/s and a streaming kernel's TB/s on
// this GPU restricted to each of several SM counts (CUDA green contexts,
// profiler/green_context.h), to check what an emulated device type is.
#include <torch/torch.h>

#include <cctype>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "profiler/device_meter.h"
#include "profiler/green_context.h"
#include "profiler/gpu_probe.h"
#include "base/input_error.h"
#include "base/json_util.h"

namespace hetplan::cli {

namespace {

struct ProbeArgs {
  std::string sms = "132,66,33,16", device = "cuda", json, out_dir, device_type;
  int64_t gemm_size = 8192, copy_mb = 1024;
  int iters = 10;
};

// --out DIR: the full probe (GEMM curves per precision, streaming bandwidth, launch costs) of each SM count,
// as DIR/gpu_probe.<TYPE>.json for the whole GPU and DIR/gpu_probe.<TYPE>-<N>sm.json for N SMs.
int write_probe_files(const ProbeArgs& a, const std::vector<int>& counts, torch::Device device) {
  if (a.device_type.empty()) throw InputError("gpu-probe --out: --device-type TYPE is required (the file names carry it)");
  for (char c : a.device_type)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-')
      throw InputError("--device-type: letters, digits and '-' only, got '" + excerpt(a.device_type) + "'");
  profiler::GpuProbeOptions o;
  o.iters = a.iters;
  std::cout << "device: " << profiler::device_description(device) << "\n";
  for (int sms : counts) {
    const ordered_json j = profiler::probe_gpu(device, sms, o);
    const std::string type = sms == 0 ? a.device_type : a.device_type + "-" + std::to_string(sms) + "sm";
    ordered_json rec;
    rec["device_type"] = type;
    for (auto it = j.begin(); it != j.end(); ++it) rec[it.key()] = it.value();
    const std::string path = a.out_dir + "/gpu_probe." + type + ".json";
    std::filesystem::create_directories(a.out_dir);
    write_json_file(path, rec);
    std::cout << "wrote " << path << " (" << j["granted_sms"].get<int>() << " of " << j["device_sms"].get<int>()
              << " SMs)\n" << std::flush;
  }
  return 0;
}

int run_probe(const ProbeArgs& a) {
  std::vector<int> counts;
  std::stringstream ss(a.sms);
  for (std::string item; std::getline(ss, item, ',');) {
    std::size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
    }
    if (used != item.size() || v < 0 || v > kMaxEmulatedSms)
      throw InputError("--sms: expected a comma-separated list of SM counts from 0 (the whole GPU) to " +
                       std::to_string(kMaxEmulatedSms) + ", got '" + excerpt(a.sms) + "'");
    counts.push_back(v);
  }
  if (counts.empty()) throw InputError("--sms: expected at least one SM count");
  if (a.gemm_size < 256 || a.gemm_size > 65536) throw InputError("--gemm-size: expected 256 to 65536");
  if (a.copy_mb < 1 || a.copy_mb > 65536) throw InputError("--copy-mb: expected 1 to 65536");
  if (a.iters < 1 || a.iters > 10000) throw InputError("--iters: expected 1 to 10000");
  const torch::Device device = profiler::parse_device(a.device, 0);
  if (!device.is_cuda()) throw InputError("gpu-probe: needs a CUDA device (--device cuda)");

  if (!a.out_dir.empty()) return write_probe_files(a, counts, device);
  ordered_json rows = ordered_json::array();
  std::cout << "device: " << profiler::device_description(device) << "\n"
            << "| requested SMs | granted SMs | green context | GEMM " << a.gemm_size << "^3 bf16 TFLOP/s | copy TB/s |\n"
            << "|---|---|---|---|---|\n";
  for (int sms : counts) {
    const profiler::PartitionProbe p = profiler::probe_partition(device, sms, a.gemm_size, a.copy_mb << 20, a.iters);
    std::cout << std::fixed << "| " << (sms == 0 ? std::string("all") : std::to_string(sms)) << " | " << p.granted_sms
              << " of " << p.device_sms << " | " << (p.green_context ? "yes" : "no") << " | " << std::setprecision(1)
              << p.gemm_tflops << " | " << std::setprecision(2) << p.copy_tbs << " |\n"
              << std::flush;
    rows.push_back({{"requested_sms", sms},
                    {"granted_sms", p.granted_sms},
                    {"device_sms", p.device_sms},
                    {"green_context", p.green_context},
                    {"gemm_ms", p.gemm_ms},
                    {"gemm_tflops", p.gemm_tflops},
                    {"copy_ms", p.copy_ms},
                    {"copy_tbs", p.copy_tbs}});
  }
  if (!a.json.empty()) {
    ordered_json j;
    j["device"] = profiler::device_description(device);
    j["gemm"] = "torch::mm_out of " + std::to_string(a.gemm_size) + "^3 bf16; TFLOP/s = 2 m^3 / median time";
    j["copy"] = "torch::neg_out over " + std::to_string(a.copy_mb) +
                " MiB of bf16; TB/s = (bytes read + bytes written) / median time";
    j["iters"] = a.iters;
    j["outside_partition"] = profiler::kOutsidePartition;
    j["rows"] = rows;
    write_json_file(a.json, j);
    std::cout << "wrote " << a.json << "\n";
  }
  return 0;
}

}  // namespace

Runner add_probe_command(CLI::App& app) {
  auto a = std::make_shared<ProbeArgs>();
  CLI::App* s = app.add_subcommand(
      "gpu-probe",
      "Measure a bf16 GEMM (TFLOP/s) and a streaming kernel (TB/s) on this GPU restricted to each SM count by a\n"
      "CUDA green context, as an emulated device type (clusterfile \"device_types\") runs. CUDA builds only.");
  s->add_option("--sms", a->sms, "SM counts; 0, or at least the GPU's count, is the whole GPU")->capture_default_str();
  s->add_option("--gemm-size", a->gemm_size, "GEMM size m (m x m times m x m)")->capture_default_str();
  s->add_option("--copy-mb", a->copy_mb, "MiB read (and as many written) by the streaming kernel")->capture_default_str();
  s->add_option("--iters", a->iters, "Measured repetitions (after 3 unmeasured); the median is reported")
      ->capture_default_str();
  s->add_option("--device", a->device, "cuda (auto picks CUDA when visible)")->capture_default_str();
  s->add_option("--json", a->json, "Also write the table as JSON here");
  s->add_option("--out", a->out_dir,
                "Instead of the table: the full probe of each SM count (GEMM TFLOP/s against size for bf16, fp16\n"
                "and fp32; streaming TB/s against bytes; eager and CUDA-graph launch costs) into this profile\n"
                "folder as gpu_probe.<TYPE>.json (0 SMs: the whole GPU) and gpu_probe.<TYPE>-<N>sm.json, which\n"
                "`gen-profiles --from` reads to scale profiles between GPUs");
  s->add_option("--device-type", a->device_type, "[--out] The device type the files are named after (e.g. H100)");
  return [a] { return run_probe(*a); };
}

}  // namespace hetplan::cli
