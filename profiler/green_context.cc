#include "profiler/green_context.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include "profiler/device_meter.h"
#include "base/statistics.h"
#include "sim/environment_error.h"
#include "base/input_error.h"

#if defined(HETPLAN_TORCH_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstddef>
// Where the toolkit's driver header is on the include path, check the layout
// declared below against it (the build does not otherwise need it).
#if __has_include(<cuda.h>)
#include <cuda.h>
#define HETPLAN_HAVE_CUDA_H 1
#endif
#endif

namespace hetplan::profiler {

const char* const kGreenContextCurrentEnv = "HETPLAN_GREEN_CONTEXT_CURRENT";

const char* const kOutsidePartition =
    "NCCL kernels (tensor-, data- and pipeline-parallel collectives and p2p run on ProcessGroupNCCL's own "
    "streams of the primary context, on any SM); work a library issues on a stream of its own; copy-engine "
    "transfers (no SMs). Not partitioned: HBM capacity and bandwidth, L2 cache and the power budget are the "
    "whole GPU's; cuBLAS and other libraries choose kernels for the whole GPU's SM count. Memory "
    "allocations (caching allocator, cuBLAS workspaces) are the primary context's, as without a partition.";

#if defined(HETPLAN_TORCH_CUDA)

namespace {

// The CUDA driver API declarations used here, as NVIDIA documents them
// (CUDA 12.4+ driver API, "Green Contexts"), under our own names: the build
// needs no cuda.h. CUstream_st is the runtime's own forward-declared type, so
// a stream handle is a cudaStream_t.
namespace drv {
using Result = int;  // CUresult; 0 is CUDA_SUCCESS
using Device = int;  // CUdevice
struct GreenCtxSt;
using GreenCtx = GreenCtxSt*;
struct ContextSt;
using Context = ContextSt*;  // CUcontext
struct ResourceDescSt;
using ResourceDesc = ResourceDescSt*;
using Stream = cudaStream_t;  // CUstream == struct CUstream_st*

constexpr int kResourceTypeSm = 1;              // CU_DEV_RESOURCE_TYPE_SM
constexpr unsigned kGreenCtxDefaultStream = 1;  // CU_GREEN_CTX_DEFAULT_STREAM (required)
constexpr unsigned kStreamNonBlocking = 1;      // CU_STREAM_NON_BLOCKING (required by cuGreenCtxStreamCreate)
constexpr int kAttributeMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT

// CUdevResource: type, 92 bytes the driver keeps, then a 48-byte union whose
// SM member starts with smCount (CUDA 13 puts a nextResource pointer in the
// union's last 8 bytes; the size stays 144). Zero-initialised; the slack
// after it is only insurance.
struct alignas(8) DevResource {
  int type = 0;
  unsigned char internal_padding[92] = {};
  union {
    struct {
      unsigned sm_count;
      unsigned min_partition_size;      // later drivers fill these two (unused here)
      unsigned coscheduled_alignment;
    } sm;
    unsigned char oversize[48];
  };
  DevResource() { std::fill(std::begin(oversize), std::end(oversize), 0); }
};
static_assert(sizeof(DevResource) == 144, "CUdevResource is 144 bytes");
static_assert(offsetof(DevResource, sm) == 96, "CUdevResource's union starts at byte 96");
struct ResourceSlot {
  DevResource r;
  unsigned char slack[112] = {};
};
#if defined(HETPLAN_HAVE_CUDA_H) && defined(CUDA_VERSION) && CUDA_VERSION >= 12040
static_assert(sizeof(CUdevResource) == sizeof(DevResource), "our CUdevResource differs from cuda.h's");
static_assert(offsetof(CUdevResource, sm) == offsetof(DevResource, sm), "our CUdevResource differs from cuda.h's");
static_assert(CU_DEV_RESOURCE_TYPE_SM == kResourceTypeSm && CU_GREEN_CTX_DEFAULT_STREAM == kGreenCtxDefaultStream &&
                  CU_STREAM_NON_BLOCKING == kStreamNonBlocking &&
                  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT == kAttributeMultiprocessorCount,
              "our CUDA constants differ from cuda.h's");
#endif

struct Api {
  Result (*driver_get_version)(int*) = nullptr;
  Result (*get_error_name)(Result, const char**) = nullptr;
  Result (*device_get)(Device*, int) = nullptr;
  Result (*device_get_attribute)(int*, int, Device) = nullptr;
  Result (*device_get_dev_resource)(Device, DevResource*, int) = nullptr;
  Result (*sm_resource_split_by_count)(DevResource*, unsigned*, const DevResource*, DevResource*, unsigned,
                                       unsigned) = nullptr;
  Result (*resource_generate_desc)(ResourceDesc*, DevResource*, unsigned) = nullptr;
  Result (*green_ctx_create)(GreenCtx*, ResourceDesc, Device, unsigned) = nullptr;
  Result (*green_ctx_get_dev_resource)(GreenCtx, DevResource*, int) = nullptr;  // optional
  Result (*green_ctx_stream_create)(Stream*, GreenCtx, unsigned, int) = nullptr;
  Result (*stream_get_green_ctx)(Stream, GreenCtx*) = nullptr;  // optional
  // For kGreenContextCurrentEnv only:
  Result (*ctx_from_green_ctx)(Context*, GreenCtx) = nullptr;
  Result (*ctx_set_current)(Context) = nullptr;
  Result (*ctx_get_current)(Context*) = nullptr;
  int version = 0;
};

template <typename F>
void load(void* lib, const char* name, F& fn, bool required) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && required)
    throw EnvironmentError(std::string("emulated device types: the CUDA driver (libcuda.so.1) has no ") + name +
                     "; green contexts need an NVIDIA driver for CUDA 12.5 or newer");
}

const Api& api() {
  static const Api a = [] {
    Api x;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
      throw EnvironmentError(std::string("emulated device types: cannot load the CUDA driver libcuda.so.1 (") + dlerror() +
                       ")");
    load(lib, "cuDriverGetVersion", x.driver_get_version, true);
    load(lib, "cuGetErrorName", x.get_error_name, true);
    load(lib, "cuDeviceGet", x.device_get, true);
    load(lib, "cuDeviceGetAttribute", x.device_get_attribute, true);
    if (x.driver_get_version(&x.version) != 0) x.version = 0;
    if (x.version < 12040)
      throw EnvironmentError("emulated device types: the CUDA driver supports CUDA " + std::to_string(x.version / 1000) +
                       "." + std::to_string(x.version % 1000 / 10) + "; green contexts need 12.4 or newer (12.5 for "
                       "cuGreenCtxStreamCreate)");
    load(lib, "cuDeviceGetDevResource", x.device_get_dev_resource, true);
    load(lib, "cuDevSmResourceSplitByCount", x.sm_resource_split_by_count, true);
    load(lib, "cuDevResourceGenerateDesc", x.resource_generate_desc, true);
    load(lib, "cuGreenCtxCreate", x.green_ctx_create, true);
    load(lib, "cuGreenCtxGetDevResource", x.green_ctx_get_dev_resource, false);
    load(lib, "cuGreenCtxStreamCreate", x.green_ctx_stream_create, true);
    load(lib, "cuStreamGetGreenCtx", x.stream_get_green_ctx, false);
    load(lib, "cuCtxFromGreenCtx", x.ctx_from_green_ctx, true);
    load(lib, "cuCtxSetCurrent", x.ctx_set_current, true);
    load(lib, "cuCtxGetCurrent", x.ctx_get_current, true);
    return x;
  }();
  return a;
}

// Throws EnvironmentError "<what>: CUDA driver error <name> (<code>)" unless r is CUDA_SUCCESS.
void check(Result r, const std::string& what) {
  if (r == 0) return;
  const char* name = nullptr;
  if (api().get_error_name(r, &name) != 0 || !name) name = "unknown";
  throw EnvironmentError(what + ": CUDA driver error " + name + " (" + std::to_string(r) + ")");
}

}  // namespace drv
}  // namespace

struct SmPartition::Impl {
  c10::DeviceIndex index = 0;
  std::optional<c10::cuda::CUDAStream> previous;
  drv::Stream stream = nullptr;  // null: the whole GPU, no stream change
  drv::Context previous_context = nullptr;  // set only with kGreenContextCurrentEnv
};

SmPartition::SmPartition(torch::Device device, const std::string& device_type, const EmulatedDevice& emulated)
    : impl_(std::make_unique<Impl>()) {
  const std::string who = "device type '" + excerpt(device_type) + "' (" + excerpt(emulated.base) + " restricted to " +
                          std::to_string(emulated.sms) + " SMs)";
  if (!device.is_cuda()) throw InputError(who + " runs on a GPU only; this run's device is the CPU");
  const drv::Api& a = drv::api();
  info_.device_type = device_type;
  info_.base = emulated.base;
  info_.requested_sms = emulated.sms;
  info_.driver_version = a.version;
  info_.device_index = device.index() < 0 ? c10::cuda::current_device() : device.index();
  impl_->index = static_cast<c10::DeviceIndex>(info_.device_index);
  info_.device_name = device_description(torch::Device(torch::kCUDA, impl_->index));
  info_.base_matches_device = info_.device_name.find(emulated.base) != std::string::npos;

  // The primary context first (the driver advises it), as LibTorch uses it.
  c10::cuda::set_device(impl_->index);
  if (cudaFree(nullptr) != cudaSuccess) throw EnvironmentError(who + ": cannot initialise CUDA on device " + std::to_string(info_.device_index));
  drv::Device dev = 0;
  drv::check(a.device_get(&dev, info_.device_index), who + ": cuDeviceGet");
  drv::ResourceSlot whole;
  drv::check(a.device_get_dev_resource(dev, &whole.r, drv::kResourceTypeSm), who + ": cuDeviceGetDevResource");
  info_.device_sms = static_cast<int>(whole.r.sm.sm_count);
  if (info_.device_sms <= 0) {
    int count = 0;
    drv::check(a.device_get_attribute(&count, drv::kAttributeMultiprocessorCount, dev), who + ": cuDeviceGetAttribute");
    info_.device_sms = count;
  }
  if (emulated.sms >= info_.device_sms) {  // the whole GPU: nothing to partition
    info_.granted_sms = info_.device_sms;
    return;
  }

  drv::ResourceSlot group, remaining;
  unsigned groups = 1;
  drv::check(a.sm_resource_split_by_count(&group.r, &groups, &whole.r, &remaining.r, 0,
                                          static_cast<unsigned>(emulated.sms)),
             who + ": cuDevSmResourceSplitByCount of the GPU's " + std::to_string(info_.device_sms) + " SMs");
  if (groups < 1)
    throw InputError(who + ": the driver could not cut a group of " + std::to_string(emulated.sms) + " SMs out of " +
                     std::to_string(info_.device_sms));
  drv::ResourceDesc desc = nullptr;
  drv::check(a.resource_generate_desc(&desc, &group.r, 1), who + ": cuDevResourceGenerateDesc");
  drv::GreenCtx ctx = nullptr;
  drv::check(a.green_ctx_create(&ctx, desc, dev, drv::kGreenCtxDefaultStream), who + ": cuGreenCtxCreate");
  info_.granted_sms = static_cast<int>(group.r.sm.sm_count);
  if (a.green_ctx_get_dev_resource) {  // what the context itself holds
    drv::ResourceSlot held;
    drv::check(a.green_ctx_get_dev_resource(ctx, &held.r, drv::kResourceTypeSm), who + ": cuGreenCtxGetDevResource");
    info_.granted_sms = static_cast<int>(held.r.sm.sm_count);
  }
  if (info_.granted_sms <= 0 || info_.granted_sms > info_.device_sms)
    throw InputError(who + ": the driver reports a partition of " + std::to_string(info_.granted_sms) + " SMs on a " +
                     std::to_string(info_.device_sms) + "-SM GPU (expected 1 to " + std::to_string(info_.device_sms) +
                     "); is the CUdevResource layout of this driver the documented one?");
  drv::check(a.green_ctx_stream_create(&impl_->stream, ctx, drv::kStreamNonBlocking, 0), who + ": cuGreenCtxStreamCreate");
  if (a.stream_get_green_ctx) {
    drv::GreenCtx owner = nullptr;
    drv::check(a.stream_get_green_ctx(impl_->stream, &owner), who + ": cuStreamGetGreenCtx");
    if (owner != ctx) throw InputError(who + ": the stream cuGreenCtxStreamCreate made is not in the green context");
    info_.stream_verified = true;
  }
  info_.green_context = true;

  // Work queued so far finishes first; from here on, this thread's LibTorch
  // kernels on the device go to the partition's stream.
  c10::cuda::device_synchronize();
  impl_->previous = c10::cuda::getCurrentCUDAStream(impl_->index);
  // The escape hatch: also make the green context this thread's current
  // context (as torch.cuda.green_contexts' set_context does), so that events,
  // streams and NCCL communicators created on this thread from here on
  // belong to it (NCCL's kernels are then confined to the partition too).
  if (const char* v = std::getenv(kGreenContextCurrentEnv); v && std::string(v) == "1") {
    drv::Context current = nullptr;
    drv::check(a.ctx_get_current(&impl_->previous_context), who + ": cuCtxGetCurrent");
    drv::check(a.ctx_from_green_ctx(&current, ctx), who + ": cuCtxFromGreenCtx");
    drv::check(a.ctx_set_current(current), who + ": cuCtxSetCurrent");
    info_.green_context_current = true;
  }

  c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromExternal(impl_->stream, impl_->index));
}

SmPartition::~SmPartition() {
  if (!impl_ || !impl_->stream) return;
  cudaStreamSynchronize(impl_->stream);  // a destructor reports nothing; the next CUDA call would
  if (impl_->previous) c10::cuda::setCurrentCUDAStream(*impl_->previous);
  if (impl_->previous_context) drv::api().ctx_set_current(impl_->previous_context);
}

#else  // no CUDA LibTorch: a clear refusal

struct SmPartition::Impl {};

SmPartition::SmPartition(torch::Device, const std::string& device_type, const EmulatedDevice& emulated) {
  throw InputError("device type '" + excerpt(device_type) + "' is emulated (" + excerpt(emulated.base) +
                   " restricted to " + std::to_string(emulated.sms) +
                   " SMs): emulated device types need a CUDA build (LibTorch with CUDA; scripts/gpu_build.sh)");
}

SmPartition::~SmPartition() = default;

#endif

ordered_json SmPartition::record() const {
  ordered_json j;
  j["device_type"] = info_.device_type;
  j["base"] = info_.base;
  j["device"] = info_.device_name;
  j["device_index"] = info_.device_index;
  j["requested_sms"] = info_.requested_sms;
  j["granted_sms"] = info_.granted_sms;
  j["device_sms"] = info_.device_sms;
  j["how"] = info_.green_context
                 ? "CUDA green context (cuDevSmResourceSplitByCount, cuGreenCtxCreate); LibTorch's current stream "
                   "made by cuGreenCtxStreamCreate"
                 : "whole GPU (requested SMs >= the GPU's): no green context";
  j["stream_in_green_context_verified"] = info_.stream_verified;
  j["current_context"] = info_.green_context_current
                             ? std::string("green (") + kGreenContextCurrentEnv + "=1: NCCL confined too)"
                             : "primary";
  j["base_matches_device"] = info_.base_matches_device;
  j["cuda_driver_version"] = info_.driver_version;
  j["outside_partition"] = kOutsidePartition;
  return j;
}

std::string SmPartition::summary() const {
  std::ostringstream s;
  s << info_.device_type << ": " << info_.base << " emulated on " << info_.device_name << " (device "
    << info_.device_index << "), " << info_.granted_sms << " of " << info_.device_sms << " SMs (requested "
    << info_.requested_sms << ")" << (info_.green_context ? ", green context" : ", whole GPU");
  return s.str();
}

std::unique_ptr<SmPartition> enter_device_type(
    torch::Device device, const std::string& device_type,
    const std::vector<std::pair<std::string, EmulatedDevice>>& cluster_types) {
  for (const auto& [name, emulated] : cluster_types) {
    if (name != device_type) continue;
    auto p = std::make_unique<SmPartition>(device, device_type, emulated);
    const SmPartitionInfo& i = p->info();
    std::cerr << "hetplan: " << p->summary() << "\n";
    if (!i.base_matches_device)
      std::cerr << "hetplan: warning: " << device_type << " declares base GPU " << i.base << ", but this GPU is "
                << i.device_name << "\n";
    if (i.granted_sms != i.requested_sms)
      std::cerr << "hetplan: note: the driver granted " << i.granted_sms << " SMs for " << i.requested_sms
                << " requested (its partition granularity)\n";
    return p;
  }
  return nullptr;
}

PartitionProbe probe_partition(torch::Device device, int sms, int64_t m, int64_t bytes, int iters) {
  PartitionProbe out;
  std::unique_ptr<SmPartition> part;
  EmulatedDevice e;
  e.base = "probe";
  e.sms = sms > 0 ? sms : kMaxEmulatedSms;  // >= any GPU's count: the whole GPU
  part = std::make_unique<SmPartition>(device, "probe-" + std::to_string(sms) + "sm", e);
  out.requested_sms = sms;
  out.granted_sms = part->info().granted_sms;
  out.device_sms = part->info().device_sms;
  out.green_context = part->info().green_context;

  const auto opts = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  DeviceMeter meter(device);
  std::vector<double> gemm, copy;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor a = torch::randn({m, m}, opts), b = torch::randn({m, m}, opts);
    torch::Tensor c = torch::empty({m, m}, opts);
    const int64_t n = std::max<int64_t>(1, bytes / 2);  // bf16 elements
    const torch::Tensor src = torch::randn({n}, opts);
    torch::Tensor dst = torch::empty({n}, opts);
    for (int it = 0; it < 3 + iters; ++it) {
      meter.clear_marks();
      const int g0 = meter.mark();
      torch::mm_out(c, a, b);
      const int g1 = meter.mark();
      torch::neg_out(dst, src);
      const int c1 = meter.mark();
      meter.sync();
      if (it < 3) continue;
      gemm.push_back(meter.elapsed_ms(g0, g1));
      copy.push_back(meter.elapsed_ms(g1, c1));
    }
  }
  out.gemm_ms = median(gemm);
  out.copy_ms = median(copy);
  out.gemm_tflops = 2.0 * static_cast<double>(m) * m * m / (out.gemm_ms * 1e-3) / 1e12;
  const double moved = 2.0 * 2.0 * static_cast<double>(std::max<int64_t>(1, bytes / 2));  // read + written
  out.copy_tbs = moved / (out.copy_ms * 1e-3) / 1e12;
  return out;
}

}  // namespace hetplan::profiler
