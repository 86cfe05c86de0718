// Analytic profiles: a Metis-format profile set estimated from GPU datasheet
// numbers, so that a fresh checkout can plan with no measured data.
//
// Each layer's forward+backward time is a roofline estimate: the larger of
// FLOPs over (peak x compute efficiency) and bytes moved over (HBM bandwidth
// x memory efficiency), plus, for tp > 1, Megatron's four activation
// all-reduces per transformer block over NVLink. Memory is mixed-precision
// Adam (16 bytes per parameter, split over tp) plus activations by
// Korthikanti et al.'s formula without recomputation. Every file carries an
// "estimate" block that says so.
#pragma once

#include <string>
#include <vector>

#include "sim/model_config.h"

namespace hetplan {

struct AnalyticOptions {
  ModelConfig model;  // num_layers counts the embedding and the head
  std::vector<std::string> device_types{"A100", "V100"};
  int max_tp = 8;
  int max_bs = 128;
  double compute_efficiency = 0.55;  // achieved fraction of peak on GEMMs
  double memory_efficiency = 0.75;   // achieved fraction of HBM bandwidth
};

// Writes DeviceType.<TYPE>_tp<T>_bs<B>.json for T, B in 1, 2, 4, ... up to
// the limits. Returns the file names written. Throws InputError for a device
// type without a spec.
std::vector<std::string> generate_analytic_profiles(const AnalyticOptions& options, const std::string& out_dir);

}  // namespace hetplan
