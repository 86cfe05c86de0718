#include "profiler/device_failure.h"

#include <c10/util/Exception.h>

#include <string_view>

#if __has_include(<gloo/common/error.h>)
#include <gloo/common/error.h>
#define HETPLAN_GLOO_ERRORS 1
#endif

namespace hetplan {

namespace {

// Words with which LibTorch's CUDA and NCCL checks start their messages, or which its lazy CUDA start
// uses when there is no usable driver or device.
constexpr std::string_view kDeviceSigns[] = {"CUDA error",     "CUDA driver",    "NVIDIA driver",
                                             "No CUDA GPUs",   "no CUDA-capable", "NCCL error",
                                             "cudaGetDeviceCount"};

std::string first_line(std::string_view text) { return std::string(text.substr(0, text.find('\n'))); }

}  // namespace

std::string device_failure(const std::exception& e) {
#if defined(HETPLAN_GLOO_ERRORS)
  if (dynamic_cast<const gloo::IoException*>(&e)) return "Gloo: " + first_line(e.what());
#endif
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  if (!error || dynamic_cast<const c10::OutOfMemoryError*>(&e)) return "";
  const std::string_view message = error->what_without_backtrace();
  for (std::string_view sign : kDeviceSigns)
    if (message.find(sign) != std::string_view::npos) return "LibTorch: " + first_line(message);
  return "";
}

}  // namespace hetplan
