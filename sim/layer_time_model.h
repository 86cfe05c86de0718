// LayerTimeModel: one performance model of a layer's forward+backward time,
// used by every path that makes a profile: measured (`hetplan profile`
// records the classes), transferred (`gen-profiles --from`: a measured
// profile moved to another GPU) and analytic (`gen-profiles --analytic`:
// datasheet numbers, no measurement).
//
// A layer's time is its kernel classes (sim/layer_work.h counts the work):
//   device = gemm + attention + elementwise + communication
//   layer  = max(device, launch floor)  (+ what the measurement adds beyond)
// where gemm is priced GEMM by GEMM at the GPU's achieved FLOP/s for that
// GEMM's size, attention at its achieved attention FLOP/s, elementwise at
// its achieved HBM bandwidth, communication over its link, and the launch
// floor is kernel count x per-kernel host time (the GPU waits on the CPU).
//
// DeviceRates says what one GPU achieves: from a probe file (`hetplan
// gpu-probe --out`: measured curves), else from the catalogue's datasheet
// numbers (sim/gpu_specs.h) at the default efficiencies below (the one
// roofline, sim/roofline.h). An emulated type "BASE-<N>sm" is its base's
// numbers restricted to N SMs (rounded up to the driver's granularity of 8):
// FLOP/s and, without a probe, bandwidth in proportion to the SMs granted.
//
// Thread-safety: value types; functions are pure. REQUIRES: positive rates.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/json_util.h"
#include "sim/gpu_specs.h"
#include "sim/layer_work.h"
#include "sim/runtime_overheads.h"

namespace hetplan {

// Datasheet defaults (no measurement): a large bf16/fp16 GEMM reaches ~72% of
// the dense peak, half of that at m = 1024 (m^2 / (m^2 + 1024^2)); fused
// attention (FLOPs counted without the causal discount, as ModelShape does)
// ~55% of the peak; streaming kernels ~80% of the HBM bandwidth; NCCL ~70% of
// the link; an eager op issued by the host at runtime_overheads.h's kDefaultEagerOpUs.
struct RateDefaults {
  double gemm_efficiency = 0.72;
  double gemm_half_size = 1024;
  double attention_efficiency = 0.55;
  double memory_efficiency = 0.80;
  double link_efficiency = 0.70;
  double launch_host_us = kDefaultEagerOpUs;  // sim/runtime_overheads.h (the one home of the launch cost)
};

struct DeviceRates {
  std::string type;
  std::string source;  // "probe <file>" or "catalogue <GPU> (x N/M SMs)"
  ComputePrecision precision = ComputePrecision::kBf16;  // what it runs: bf16 becomes fp16 where the GPU lacks it
  std::vector<std::pair<double, double>> gemm_curve;  // (m, achieved FLOP/s), ascending m; empty: catalogue
  double peak_flops = 0;       // dense peak at the precision, FLOP/s (x SM fraction)
  double gemm_efficiency = 0.72, gemm_half_size = 1024;  // the catalogue curve, when gemm_curve is empty
  double attention_flops_per_s = 0;
  double bytes_per_s = 0;       // streaming HBM bandwidth achieved
  double link_bytes_per_s = 0;  // tensor-parallel all-reduce bus bandwidth achieved
  double launch_host_us = 0;    // host time per kernel in eager mode (0: unknown)
  bool probed = false;

  // Achieved FLOP/s of an (m x k) (k x n) GEMM: the curve at the cube size (m k n)^(1/3), interpolated in
  // log size (below its smallest point: proportional to size^3 / smallest^3 of time... held at the smallest
  // point's efficiency scaled by size; above its largest: the largest point's).
  double gemm_flops_per_s(const GemmDims& g) const;
  ordered_json record() const;
};

// "H200-66sm" -> ("H200", 66): an emulated type's base and requested SMs; false for any other name.
bool parse_emulated_type(const std::string& type, std::string& base, int& sms);

// Rates from the catalogue (`type` a catalogue GPU or an emulated "BASE-<N>sm"), at `precision` (bf16 runs as
// fp16 on a GPU without bf16, as mixed-precision training does there).
// Throws InputError naming `where` for an unknown GPU or a precision it lacks.
DeviceRates catalogue_rates(const std::string& type, ComputePrecision precision, const RateDefaults& d,
                            const std::string& where);
// Rates from a probe file's record (gpu-probe --out) at `precision`, the catalogue's for what it lacks
// (link, and each part that failed). Throws InputError naming the file.
DeviceRates probe_rates(const ordered_json& probe, const std::string& path, const std::string& type,
                        ComputePrecision precision, const RateDefaults& d);

// A layer's time split into kernel classes, in ms.
struct KernelClassTimes {
  double gemm_ms = 0, attention_ms = 0, elementwise_ms = 0, communication_ms = 0;
  double host_ms = 0;  // the launch floor
  // Collective time that runs beside a GEMM and so is in no class above (LayerKernels::async_tp_backward:
  // the backward's column-parallel input-gradient collectives hidden by their weight-gradient GEMMs; the
  // GEMMs' slowdown beside them is in gemm_ms).
  double overlapped_ms = 0;
  double device_ms() const { return gemm_ms + attention_ms + elementwise_ms + communication_ms; }
  double layer_ms() const { return device_ms() > host_ms ? device_ms() : host_ms; }
};

// The analytic classes of Metis layer `metis_layer` of `s` (bf16/fp16 values) on `r`, its kernels run as `k`
// says. Attention: fused, its FLOPs at the attention rate; materialised, the score tensor's batched GEMMs
// each at its roofline (max of its FLOPs at the attention rate and its score traffic at the HBM rate) plus
// the softmax and dropout kernels' traffic at the HBM rate (ScoreTraffic, sim/layer_work.h). Elementwise:
// layer_elementwise_bytes, with k's sequence parallelism. Communication: layer_allreduces ring all-reduces of
// the tokens' activations over the link, less what k.async_tp_backward hides (async_tp_hidden_ms).
KernelClassTimes analytic_layer_classes(const ModelShape& s, int metis_layer, long long bs, long long seq, int tp,
                                        Recompute recompute, const DeviceRates& r, LayerKernels k = {});

// Megatron's asynchronous tensor-parallel backward (LayerKernels::async_tp_backward): per column-parallel input
// of the layer (column_parallel_input_groups), its backward collective, `collective_ms` (an all-reduce; under
// sequence parallelism a reduce-scatter, half its bytes), runs beside the weight-gradient GEMM(s) of that
// input (one pass of each GEMM at its rate), hiding min(collective, GEMMs). Returns the hidden ms; *slowdown_ms
// the GEMMs' stretch beside it, (kCommComputeSlowdown - 1) x hidden (sim/dp_overlap.h: a GEMM beside an NCCL
// all-reduce, measured). 0 at tp 1.
double async_tp_hidden_ms(const ModelShape& s, LayerKind kind, long long tokens, int tp, double collective_ms,
                          const DeviceRates& r, double* slowdown_ms);

// The layer's gradient accumulation per micro-batch in ms on `r`: read the new gradient (`bytes_per_value` per
// value) and the main gradient, write the main gradient (main_grad_accumulation_bytes of k.main_grads per
// parameter, sim/layer_work.h) for each of the rank's `rank_params`, less the GEMM weights'
// (layer_gemm_weight_params) under k.gradient_accumulation_fusion.
double gradient_accumulation_ms(const ModelShape& s, LayerKind kind, int tp, double rank_params,
                                double bytes_per_value, const DeviceRates& r, LayerKernels k);

// Materialised attention's time in ms on `r` (see analytic_layer_classes).
double materialized_attention_ms(const ScoreTraffic& t, const DeviceRates& r);

// One measured layer's classes as a profile records them, with its GEMMs (dims and ms each).
struct MeasuredLayer {
  KernelClassTimes classes;
  std::vector<GemmDims> gemms;
  std::vector<double> gemm_ms;  // per GEMM
  double layer_ms = 0;          // as the profile's layer_compute_total_ms says
};

// The layer moved from GPU `from` to GPU `to`: each class scaled by the two
// GPUs' rates (each GEMM by its size's), the launch floor (at most the
// measured layer time) by the host's per-kernel time where both GPUs were
// probed (else kept: same host and runtime), and the layer time scaled by
// max(device, floor) after over before (what the chained measurement had
// beyond it, clocks and gaps, in proportion).
// Returns the classes on `to`; *layer_ms the layer's time there.
KernelClassTimes transfer_layer(const MeasuredLayer& m, const DeviceRates& from, const DeviceRates& to,
                                double* layer_ms);

}  // namespace hetplan
