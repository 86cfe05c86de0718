// device_failure(): whether an exception LibTorch threw is a failure of the
// machine's devices rather than of hetplan: a CUDA error (no device, a driver
// too old or missing, a device that cannot start), an NCCL error, or a Gloo
// transport error. Returns its one-line reason ("LibTorch: ..."), or "" where
// it is something else (a bug, or out of memory, which is reported as such).
// The torch commands' edge (cli/torch_commands.cc) reports the named ones as
// environment errors (sim/environment_error.h). Thread-safe (no state).
#pragma once

#include <exception>
#include <string>

namespace hetplan {

std::string device_failure(const std::exception& e);

}  // namespace hetplan
