#include "profiler/host_meter.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#if defined(HETPLAN_TORCH_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "base/input_error.h"
#include "base/json_util.h"

namespace hetplan::profiler {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One Adam step over [b, e): the single pass DeepSpeed's cpu_adam makes per element.
void adam_range(float* p, const float* g, float* m, float* v, uint16_t* p16, int64_t b, int64_t e, float c1,
                float c2) {
  const float b1 = 0.9f, b2 = 0.999f, lr = 1e-4f, eps = 1e-8f;
  for (int64_t i = b; i < e; ++i) {
    const float gi = g[i];
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    uint32_t bits;
    std::memcpy(&bits, &p[i], sizeof bits);
    p16[i] = static_cast<uint16_t>(bits >> 16);  // the bf16 copy (truncated)
  }
}

double measure_cpu_adam(int64_t n, int* threads) {
  std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n, 0.f), v(n, 0.f);
  std::vector<uint16_t> p16(n);
  // All cores (the profiler may have pinned LibTorch to fewer for its timings); restored on return.
  const int before = at::get_num_threads();
  at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  *threads = at::get_num_threads();
  struct Restore {
    int n;
    ~Restore() { at::set_num_threads(n); }
  } restore{before};
  auto step = [&](int t) {
    const float c1 = 1 - std::pow(0.9f, t), c2 = 1 - std::pow(0.999f, t);
    at::parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
      adam_range(p.data(), g.data(), m.data(), v.data(), p16.data(), b, e, c1, c2);
    });
  };
  step(1);
  const int reps = 3;
  const auto t0 = Clock::now();
  for (int t = 2; t < 2 + reps; ++t) step(t);
  return static_cast<double>(n) * reps / seconds_since(t0);
}

#if defined(HETPLAN_TORCH_CUDA)
// GB/s of the slowest GPU, all visible GPUs copying `bytes` at once, `to_device` or back.
double measure_copies(int gpus, int64_t bytes, bool to_device) {
  std::vector<double> gbs(gpus, 0);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int d = 0; d < gpus; ++d) {
    threads.emplace_back([&, d] {
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(d));
      auto host = torch::empty({bytes}, torch::dtype(torch::kUInt8).pinned_memory(true));
      auto dev = torch::empty({bytes}, torch::dtype(torch::kUInt8).device(torch::Device(torch::kCUDA, d)));
      auto copy = [&] { to_device ? dev.copy_(host, true) : host.copy_(dev, true); };
      copy();
      c10::cuda::device_synchronize();
      ++ready;
      while (ready.load() < gpus) std::this_thread::yield();
      const int reps = 5;
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i) copy();
      c10::cuda::device_synchronize();
      gbs[d] = static_cast<double>(bytes) * reps / seconds_since(t0) / 1e9;
    });
  }
  for (auto& t : threads) t.join();
  double slowest = gbs.empty() ? -1 : gbs[0];
  for (double x : gbs) slowest = std::min(slowest, x);
  return slowest;
}
#endif

}  // namespace

HostMeasurement measure_host(bool cuda, int64_t copy_bytes, int64_t adam_params) {
  HostMeasurement m;
  m.cpu_adam_params_per_s = measure_cpu_adam(adam_params, &m.threads);
#if defined(HETPLAN_TORCH_CUDA)
  if (cuda && torch::cuda::is_available()) {
    m.gpus = static_cast<int>(torch::cuda::device_count());
    m.h2d_gbs = measure_copies(m.gpus, copy_bytes, true);
    m.d2h_gbs = measure_copies(m.gpus, copy_bytes, false);
    c10::cuda::set_device(0);
  } else {
    m.note = "no CUDA device: pinned copies not measured";
  }
#else
  (void)cuda;
  (void)copy_bytes;
  m.note = "CPU-only LibTorch: pinned copies not measured";
#endif
  return m;
}

void write_host_calibration(const HostMeasurement& m, const std::string& path, const std::string& device) {
  ordered_json j = ordered_json::object();
  if (std::filesystem::exists(path)) {
    j = read_json_file(path);
    if (!j.is_object()) throw InputError(path + ": expected a JSON object (whatif_calibration.json)");
  }
  ordered_json host;
  if (m.h2d_gbs > 0) host["h2d_gbs"] = m.h2d_gbs;
  if (m.d2h_gbs > 0) host["d2h_gbs"] = m.d2h_gbs;
  host["cpu_adam_params_per_s"] = m.cpu_adam_params_per_s;
  host["gpus_copying_at_once"] = m.gpus;
  host["cpu_threads"] = m.threads;
  host["source"] = "hetplan profile on " + device + " (profiler/host_meter.h)" + (m.note.empty() ? "" : "; " + m.note);
  j["host"] = host;
  write_json_file(path, j);
}

}  // namespace hetplan::profiler
