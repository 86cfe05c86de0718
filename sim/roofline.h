// Roofline: the time one GPU takes for some FLOPs and some HBM bytes, at
// achieved fractions of its datasheet's dense peak and memory bandwidth.
//
// It promises one formula, used by whatif, the inference what-if and the
// layer time model (sim/layer_time_model.h: the analytic profiles and the
// profile transfer, which apply it per kernel class with a GEMM efficiency
// that depends on the GEMM's size):
//   time = max(flops / (peak x compute efficiency), bytes / (bandwidth x memory efficiency))
// in seconds. Callers add their floors (per-kernel launch floors, per-row
// dequantisation) on top, and sum kernel classes that run one after another
// (whatif's GEMMs, attention and elementwise kernels) with compute_s and
// memory_s. The rates multiply as peak x 1e12 x efficiency and
// bandwidth x 1e9 x efficiency, in that order (callers' numbers depend on it).
// REQUIRES: positive peaks, bandwidths and efficiencies (a zero rate gives inf).
// Thread-safety: a value type; every function is pure.
#pragma once

#include <algorithm>

namespace hetplan {

// Achieved FLOP/s from a dense peak in TFLOP/s and the achieved fraction of it.
inline double achieved_flops_per_s(double peak_tflops, double compute_efficiency) {
  return peak_tflops * 1e12 * compute_efficiency;
}
// Achieved bytes/s from an HBM bandwidth in GB/s and the achieved fraction of it.
inline double achieved_bytes_per_s(double bandwidth_gbs, double memory_efficiency) {
  return bandwidth_gbs * 1e9 * memory_efficiency;
}

struct Roofline {
  double flops_per_s = 0;  // achieved: achieved_flops_per_s
  double bytes_per_s = 0;  // achieved: achieved_bytes_per_s

  double compute_s(double flops) const { return flops / flops_per_s; }
  double memory_s(double bytes) const { return bytes / bytes_per_s; }
  // The roofline: whichever of compute and memory is slower.
  double seconds(double flops, double bytes) const { return std::max(compute_s(flops), memory_s(bytes)); }
};

inline Roofline make_roofline(double peak_tflops, double compute_efficiency, double bandwidth_gbs,
                              double memory_efficiency) {
  return Roofline{achieved_flops_per_s(peak_tflops, compute_efficiency),
                  achieved_bytes_per_s(bandwidth_gbs, memory_efficiency)};
}

}  // namespace hetplan
