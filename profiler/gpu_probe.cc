#include "profiler/gpu_probe.h"

#include <chrono>
#include <memory>

#include "profiler/device_meter.h"
#include "profiler/green_context.h"
#include "base/statistics.h"
#include "sim/cluster.h"

#if defined(HETPLAN_TORCH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace hetplan::profiler {

namespace {

torch::Dtype dtype_of(const std::string& p) {
  if (p == "fp16") return torch::kHalf;
  if (p == "fp32") return torch::kFloat32;
  return torch::kBFloat16;
}

ordered_json gemm_curve(torch::Device device, const std::string& precision, const GpuProbeOptions& o,
                        DeviceMeter& meter) {
  ordered_json rows = ordered_json::array();
  const auto opts = torch::TensorOptions().device(device).dtype(dtype_of(precision));
  torch::NoGradGuard no_grad;
  for (int64_t m : o.gemm_sizes) {
    if (precision == "fp32" && m > 4096) continue;  // slow, and fp32 GEMMs are rare in training
    const torch::Tensor a = torch::randn({m, m}, opts), b = torch::randn({m, m}, opts);
    torch::Tensor c = torch::empty({m, m}, opts);
    const int reps = m <= 1024 ? 20 : 1;  // small ones: several per mark, so the marks do not dominate
    std::vector<double> ms;
    for (int it = 0; it < 3 + o.iters; ++it) {
      meter.clear_marks();
      meter.sync();
      meter.stall(1.0);
      const int g0 = meter.mark();
      for (int r = 0; r < reps; ++r) torch::mm_out(c, a, b);
      const int g1 = meter.mark();
      meter.sync();
      if (it >= 3) ms.push_back(meter.elapsed_ms(g0, g1) / reps);
    }
    const double t = median(ms);
    rows.push_back({{"m", m}, {"ms", t}, {"tflops", 2.0 * m * m * m / (t * 1e-3) / 1e12}});
  }
  return rows;
}

ordered_json copy_curve(torch::Device device, const GpuProbeOptions& o, DeviceMeter& meter) {
  ordered_json rows = ordered_json::array();
  const auto opts = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  torch::NoGradGuard no_grad;
  for (int64_t mb : o.copy_mb) {
    const int64_t n = (mb << 20) / 2;
    const torch::Tensor src = torch::randn({n}, opts);
    torch::Tensor dst = torch::empty({n}, opts);
    std::vector<double> ms;
    for (int it = 0; it < 3 + o.iters; ++it) {
      meter.clear_marks();
      meter.sync();
      const int c0 = meter.mark();
      torch::neg_out(dst, src);
      const int c1 = meter.mark();
      meter.sync();
      if (it >= 3) ms.push_back(meter.elapsed_ms(c0, c1));
    }
    const double t = median(ms);
    rows.push_back({{"mb", mb}, {"ms", t}, {"tbs", 2.0 * 2.0 * n / (t * 1e-3) / 1e12}});
  }
  return rows;
}

// Tiny kernels (an in-place add on one value): the host's issue time per kernel, the device's time per kernel
// when they queue behind a stall, and per kernel replayed from a CUDA graph.
ordered_json launch_costs(torch::Device device, DeviceMeter& meter) {
  constexpr int kKernels = 2000;
  ordered_json j;
  const auto opts = torch::TensorOptions().device(device).dtype(torch::kFloat32);
  torch::NoGradGuard no_grad;
  torch::Tensor t = torch::zeros({1}, opts);
  std::vector<double> host_us, device_us;
  for (int it = 0; it < 5; ++it) {
    meter.sync();
    const auto h0 = std::chrono::steady_clock::now();
    for (int k = 0; k < kKernels; ++k) t.add_(1.0);
    const auto h1 = std::chrono::steady_clock::now();
    meter.sync();
    host_us.push_back(std::chrono::duration<double, std::micro>(h1 - h0).count() / kKernels);
    meter.clear_marks();
    meter.stall(2.0 * host_us.back() * kKernels / 1e3 + 5.0);
    const int a = meter.mark();
    for (int k = 0; k < kKernels; ++k) t.add_(1.0);
    const int b = meter.mark();
    meter.sync();
    device_us.push_back(meter.elapsed_ms(a, b) * 1e3 / kKernels);
  }
  j["kernels"] = kKernels;
  j["eager_host_us"] = median(host_us);
  j["eager_device_us"] = median(device_us);
#if defined(HETPLAN_TORCH_CUDA)
  try {
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index() < 0 ? 0 : device.index());
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      t.add_(1.0);
      side.synchronize();
      graph.capture_begin();
      for (int k = 0; k < kKernels; ++k) t.add_(1.0);
      graph.capture_end();
    }
    std::vector<double> graph_us;
    for (int it = 0; it < 5; ++it) {
      meter.clear_marks();
      meter.sync();
      const int a = meter.mark();
      graph.replay();
      const int b = meter.mark();
      meter.sync();
      graph_us.push_back(meter.elapsed_ms(a, b) * 1e3 / kKernels);
    }
    j["graph_us"] = median(graph_us);
  } catch (const std::exception& e) {
    std::string what = e.what();
    j["graph_error"] = what.substr(0, what.find('\n'));
  }
#endif
  return j;
}

}  // namespace

ordered_json probe_gpu(torch::Device device, int sms, const GpuProbeOptions& o) {
  EmulatedDevice e;
  e.base = "probe";
  e.sms = sms > 0 ? sms : kMaxEmulatedSms;  // >= any GPU's count: the whole GPU
  auto part = std::make_unique<SmPartition>(device, "probe-" + std::to_string(sms) + "sm", e);
  ordered_json j;
  j["device"] = device_description(device);
  j["requested_sms"] = sms;
  j["granted_sms"] = part->info().granted_sms;
  j["device_sms"] = part->info().device_sms;
  j["green_context"] = part->info().green_context;
  DeviceMeter meter(device);
  ordered_json gemm;
  for (const std::string& p : o.precisions) {
    try {
      gemm[p] = gemm_curve(device, p, o, meter);
    } catch (const std::exception& ex) {
      std::string what = ex.what();
      gemm[p + "_error"] = what.substr(0, what.find('\n'));
    }
  }
  j["gemm"] = gemm;
  j["gemm_how"] = "torch::mm_out of m x m by m x m, queued behind a stall; TFLOP/s = 2 m^3 / median time";
  try {
    j["copy"] = copy_curve(device, o, meter);
  } catch (const std::exception& ex) {
    std::string what = ex.what();
    j["copy_error"] = what.substr(0, what.find('\n'));
  }
  j["copy_how"] = "torch::neg_out over bf16; TB/s = (bytes read + bytes written) / median time";
  if (o.launch && sms == 0) {
    try {
      j["launch"] = launch_costs(device, meter);
    } catch (const std::exception& ex) {
      std::string what = ex.what();
      j["launch_error"] = what.substr(0, what.find('\n'));
    }
  }
  j["iters"] = o.iters;
  j["outside_partition"] = kOutsidePartition;
  return j;
}

}  // namespace hetplan::profiler
