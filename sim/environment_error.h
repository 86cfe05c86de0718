// EnvironmentError: the machine cannot run what was asked, through no fault of
// the input or of hetplan: no GPU is visible, the CUDA driver or runtime
// cannot start, NCCL or Gloo cannot start, or this LibTorch lacks what the run
// needs (CUDA, Gloo).
//
// Its message says what is missing in one line; the CLI prints it as
// "hetplan: environment error: ..." and exits 5 (cli/app_runner.h). Thrown
// where the profiler and executor detect the failure; LibTorch's own device
// errors are mapped to it at the torch commands' edge.
#pragma once

#include <stdexcept>
#include <string>

namespace hetplan {

class EnvironmentError : public std::runtime_error {
 public:
  explicit EnvironmentError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace hetplan
