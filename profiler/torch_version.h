// What ATen offers a LibTorch build depends on its version: fused attention (2.0), the flash kernel's
// forward and backward as ATen operators with bottom-right causal masking (2.3 as relied on here),
// ATen's RMSNorm (2.4), grouped-query heads inside fused attention (2.5). Code that calls one guards
// it with HETPLAN_TORCH_AT_LEAST(major, minor); the CPU tests build against LibTorch 1.13.
#pragma once

#include <torch/version.h>

#define HETPLAN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
