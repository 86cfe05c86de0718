#include "profiler/device_meter.h"

#include <torch/version.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#if defined(HETPLAN_TORCH_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

#include <c10/core/CPUAllocator.h>

#include "sim/environment_error.h"
#include "base/input_error.h"

namespace hetplan::profiler {

namespace {

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 3)
#define HETPLAN_COUNTING_CPU_ALLOCATOR 1
// Wraps the default CPU allocator to count live bytes, keep the peak, and
// refuse allocations past a limit with an out-of-memory error. LibTorch's
// raw_allocate() needs data == context, so sizes are kept in a side table.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) { self_ = this; }

  c10::DataPtr allocate(size_t n) const override {
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t now = live_.fetch_add(bytes) + bytes;
    const int64_t limit = limit_.load();
    if (limit > 0 && now > limit) {
      live_.fetch_sub(bytes);
      TORCH_CHECK(false, "CPU out of memory: tried to allocate ", n, " bytes with ", now - bytes,
                  " in use under the ", limit, "-byte limit (--cpu-memory-limit-mb)");
    }
    int64_t p = peak_.load();
    while (now > p && !peak_.compare_exchange_weak(p, now)) {
    }
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    c10::DeleterFnPtr deleter = inner.get_deleter();
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_[data] = Block{bytes, deleter};
    }
    return c10::DataPtr(data, data, &release, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }
  void set_limit(int64_t bytes) { limit_.store(bytes); }

 private:
  struct Block {
    int64_t bytes;
    c10::DeleterFnPtr deleter;
  };
  static void release(void* p) {
    if (!p) return;
    Block b;
    {
      std::lock_guard<std::mutex> lock(self_->mu_);
      auto it = self_->blocks_.find(p);
      if (it == self_->blocks_.end()) return;
      b = it->second;
      self_->blocks_.erase(it);
    }
    self_->live_.fetch_sub(b.bytes);
    if (b.deleter) b.deleter(p);
  }
  static CountingAllocator* self_;
  c10::Allocator* base_;
  mutable std::mutex mu_;
  mutable std::unordered_map<void*, Block> blocks_;
  mutable std::atomic<int64_t> live_{0}, peak_{0};
  std::atomic<int64_t> limit_{0};
};
CountingAllocator* CountingAllocator::self_ = nullptr;

CountingAllocator* counting_allocator() {
  static CountingAllocator* a = [] {
    auto* alloc = new CountingAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(alloc, /*priority=*/100);
    return alloc;
  }();
  return a;
}
#endif

}  // namespace

struct DeviceMeter::Impl {
  std::vector<std::chrono::steady_clock::time_point> wall;
#if defined(HETPLAN_TORCH_CUDA)
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events;
#endif
};

DeviceMeter::DeviceMeter(torch::Device device) : device_(device), impl_(new Impl) {
#if defined(HETPLAN_COUNTING_CPU_ALLOCATOR)
  if (device_.is_cpu()) counting_allocator();
#endif
}

DeviceMeter::~DeviceMeter() { delete impl_; }

int DeviceMeter::mark() {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda()) {
    impl_->events.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    impl_->events.back()->record();
    return static_cast<int>(impl_->events.size()) - 1;
  }
#endif
  impl_->wall.push_back(std::chrono::steady_clock::now());
  return static_cast<int>(impl_->wall.size()) - 1;
}

#if defined(HETPLAN_TORCH_CUDA)
namespace {
// Runs on a CUDA driver thread; the stream waits until it returns.
void CUDART_CB sleep_on_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*static_cast<double*>(ms)));
  delete static_cast<double*>(ms);
}
}  // namespace
#endif

void DeviceMeter::stall(double ms) {
#if defined(HETPLAN_TORCH_CUDA)
  if (!device_.is_cuda() || ms <= 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  if (cudaLaunchHostFunc(stream, sleep_on_stream, new double(ms)) != cudaSuccess) (void)cudaGetLastError();
#else
  (void)ms;
#endif
}

void DeviceMeter::sync() {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda()) c10::cuda::device_synchronize();
#endif
}

double DeviceMeter::elapsed_ms(int a, int b) const {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda()) return impl_->events[a]->elapsed_time(*impl_->events[b]);
#endif
  return std::chrono::duration<double, std::milli>(impl_->wall[b] - impl_->wall[a]).count();
}

void DeviceMeter::clear_marks() {
  impl_->wall.clear();
#if defined(HETPLAN_TORCH_CUDA)
  impl_->events.clear();
#endif
}

bool DeviceMeter::has_memory_stats() const {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda()) return true;
#endif
#if defined(HETPLAN_COUNTING_CPU_ALLOCATOR)
  return device_.is_cpu();
#else
  return false;
#endif
}

int64_t DeviceMeter::allocated() const {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).allocated_bytes[0].current;
#endif
#if defined(HETPLAN_COUNTING_CPU_ALLOCATOR)
  return counting_allocator()->live();
#else
  return 0;
#endif
}

int64_t DeviceMeter::peak() const {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).allocated_bytes[0].peak;
#endif
#if defined(HETPLAN_COUNTING_CPU_ALLOCATOR)
  return counting_allocator()->peak();
#else
  return 0;
#endif
}

void DeviceMeter::reset_peak() {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
    return;
  }
#endif
#if defined(HETPLAN_COUNTING_CPU_ALLOCATOR)
  counting_allocator()->reset_peak();
#endif
}

int64_t DeviceMeter::framework_bytes() const {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda()) {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
    const int64_t reserved =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).reserved_bytes[0].current;
    return static_cast<int64_t>(total - free) - reserved;
  }
#endif
  return -1;
}

int64_t DeviceMeter::peak_reserved() const {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).reserved_bytes[0].peak;
#endif
  return -1;
}

int64_t DeviceMeter::device_used() const {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda()) {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
    return static_cast<int64_t>(total - free);
  }
#endif
  return -1;
}

void DeviceMeter::release_cached() {
#if defined(HETPLAN_TORCH_CUDA)
  if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

bool DeviceMeter::set_cpu_memory_limit(int64_t bytes) {
#if defined(HETPLAN_COUNTING_CPU_ALLOCATOR)
  counting_allocator()->set_limit(bytes);
  return true;
#else
  (void)bytes;
  return false;
#endif
}

torch::Device parse_device(const std::string& d, int local_rank) {
  if (d == "cpu") return torch::Device(torch::kCPU);
  if (d == "cuda" || (d == "auto" && torch::cuda::is_available())) {
    if (!torch::cuda::is_available()) throw EnvironmentError("--device cuda: no CUDA device is visible");
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  }
  if (d != "auto") throw InputError("--device: expected auto, cpu or cuda, got '" + d + "'");
  return torch::Device(torch::kCPU);
}

torch::Dtype parse_dtype(const std::string& s) {
  if (s == "bf16") return torch::kBFloat16;
  if (s == "fp16") return torch::kFloat16;
  if (s == "fp32") return torch::kFloat32;
  throw InputError("--dtype: expected bf16, fp16 or fp32, got '" + s + "'");
}

void use_device(torch::Device device) {
#if defined(HETPLAN_TORCH_CUDA)
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const std::string what = e.what();
  return what.find("out of memory") != std::string::npos || what.find("can't allocate memory") != std::string::npos;
}

std::string device_description(torch::Device device) {
#if defined(HETPLAN_TORCH_CUDA)
  if (device.is_cuda()) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) return prop.name;
  }
#endif
  return device.is_cuda() ? "CUDA device" : "CPU (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
}

}  // namespace hetplan::profiler
