#include "sim/layer_time_model.h"

#include <algorithm>
#include <cmath>

#include "base/input_error.h"
#include "sim/dp_overlap.h"
#include "sim/roofline.h"

namespace hetplan {

namespace {

constexpr int kSmGranularity = 8;  // the driver's green-context split (profiler/green_context.h)

bool split_emulated_name(const std::string& type, std::string& base, int& sms) {
  const std::size_t dash = type.rfind('-');
  if (dash == std::string::npos || type.size() < dash + 4 || type.compare(type.size() - 2, 2, "sm") != 0)
    return false;
  const std::string digits = type.substr(dash + 1, type.size() - dash - 3);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  if (digits.size() > 5) return false;
  base = type.substr(0, dash);
  sms = std::stoi(digits);
  return sms > 0;
}

}  // namespace

bool parse_emulated_type(const std::string& type, std::string& base, int& sms) {
  return split_emulated_name(type, base, sms);
}

namespace {

double ms_of(double work, double rate) { return rate > 0 ? work / rate * 1e3 : 0.0; }

}  // namespace

double DeviceRates::gemm_flops_per_s(const GemmDims& g) const {
  const double size = std::cbrt(static_cast<double>(g.m) * static_cast<double>(g.k) * static_cast<double>(g.n));
  if (gemm_curve.empty()) {
    const double s2 = size * size, h2 = gemm_half_size * gemm_half_size;
    return peak_flops * gemm_efficiency * s2 / (s2 + h2);
  }
  const auto& c = gemm_curve;
  if (size <= c.front().first) return c.front().second * size / c.front().first;
  if (size >= c.back().first) return c.back().second;
  for (std::size_t i = 1; i < c.size(); ++i) {
    if (size > c[i].first) continue;
    const double t = std::log(size / c[i - 1].first) / std::log(c[i].first / c[i - 1].first);
    return c[i - 1].second + t * (c[i].second - c[i - 1].second);
  }
  return c.back().second;
}

ordered_json DeviceRates::record() const {
  ordered_json j;
  j["type"] = type;
  j["source"] = source;
  ordered_json curve = ordered_json::array();
  for (const auto& [m, f] : gemm_curve) curve.push_back({m, f / 1e12});
  if (gemm_curve.empty()) {
    j["gemm"] = {{"peak_tflops", peak_flops / 1e12}, {"efficiency", gemm_efficiency}, {"half_size", gemm_half_size}};
  } else {
    j["gemm_tflops_by_size"] = curve;
  }
  j["attention_tflops"] = attention_flops_per_s / 1e12;
  j["memory_tbs"] = bytes_per_s / 1e12;
  j["link_gbs"] = link_bytes_per_s / 1e9;
  j["launch_host_us"] = launch_host_us;
  return j;
}

DeviceRates catalogue_rates(const std::string& type, ComputePrecision precision, const RateDefaults& d,
                            const std::string& where) {
  std::string base = type;
  int sms = 0;
  const GpuSpec* g = find_gpu_spec(type);
  if (!g && parse_emulated_type(type, base, sms)) g = find_gpu_spec(base);
  if (!g) g = &require_gpu_spec(type, where);  // throws, naming the known GPUs
  double fraction = 1.0;
  DeviceRates r;
  r.type = type;
  r.source = "catalogue " + g->name;
  if (sms > 0 && g->sm_count > 0) {
    const int granted = std::min(g->sm_count, (sms + kSmGranularity - 1) / kSmGranularity * kSmGranularity);
    fraction = static_cast<double>(granted) / g->sm_count;
    r.source += " x " + std::to_string(granted) + "/" + std::to_string(g->sm_count) + " SMs";
  }
  // bf16 training runs as fp16 on a GPU without bf16 (V100): the same bytes, its 16-bit peak.
  if (precision == ComputePrecision::kBf16 && !g->supports(precision) && g->supports(ComputePrecision::kFp16)) {
    precision = ComputePrecision::kFp16;
    r.source += " (fp16: no bf16)";
  }
  r.precision = precision;
  r.peak_flops = require_peak(*g, precision, where) * fraction;
  r.gemm_efficiency = d.gemm_efficiency;
  r.gemm_half_size = d.gemm_half_size;
  r.attention_flops_per_s = r.peak_flops * d.attention_efficiency;
  r.bytes_per_s = achieved_bytes_per_s(g->memory_bw_gbs, d.memory_efficiency) * fraction;
  r.link_bytes_per_s = achieved_bytes_per_s(g->nvlink_gbs, d.link_efficiency);
  r.launch_host_us = d.launch_host_us;
  return r;
}

DeviceRates probe_rates(const ordered_json& probe, const std::string& path, const std::string& type,
                        ComputePrecision precision, const RateDefaults& d) {
  DeviceRates r = catalogue_rates(type, precision, d, path + ": device_type");
  r.source = "probe " + path;
  r.probed = true;
  const char* p = to_string(r.precision);
  const auto& gemm = probe.contains("gemm") ? probe["gemm"] : ordered_json();
  if (gemm.is_object() && gemm.contains(p) && gemm[p].is_array()) {
    for (const auto& row : gemm[p])
      if (row.is_object() && row.contains("m") && row.contains("tflops") && row["tflops"].is_number() &&
          row["tflops"].get<double>() > 0)
        r.gemm_curve.emplace_back(row["m"].get<double>(), row["tflops"].get<double>() * 1e12);
    std::sort(r.gemm_curve.begin(), r.gemm_curve.end());
  }
  if (!r.gemm_curve.empty())  // attention keeps its share of what the largest GEMMs reach
    r.attention_flops_per_s = r.gemm_curve.back().second * d.attention_efficiency / d.gemm_efficiency;
  if (probe.contains("copy") && probe["copy"].is_array() && !probe["copy"].empty()) {
    double largest = 0;
    for (const auto& row : probe["copy"])
      if (row.contains("mb") && row.contains("tbs") && row["mb"].get<double>() >= largest) {
        largest = row["mb"].get<double>();
        r.bytes_per_s = row["tbs"].get<double>() * 1e12;
      }
  }
  if (probe.contains("launch") && probe["launch"].contains("eager_host_us"))
    r.launch_host_us = probe["launch"]["eager_host_us"].get<double>();
  return r;
}

double materialized_attention_ms(const ScoreTraffic& t, const DeviceRates& r) {
  const double per_gemm = std::max(ms_of(t.scores * t.gemm_flops_per_score, r.attention_flops_per_s),
                                   ms_of(t.scores * t.gemm_bytes_per_score, r.bytes_per_s));
  return t.gemm_passes * per_gemm + ms_of(t.stream_bytes(), r.bytes_per_s);
}

double async_tp_hidden_ms(const ModelShape& s, LayerKind kind, long long tokens, int tp, double collective_ms,
                          const DeviceRates& r, double* slowdown_ms) {
  *slowdown_ms = 0;
  if (tp <= 1) return 0.0;
  const LayerGemms gemms = layer_gemms(s, kind, tokens, tp, Recompute::kNone);
  int groups[2][2];
  const int n = column_parallel_input_groups(s, kind, groups);
  double hidden = 0;
  for (int i = 0; i < n; ++i) {
    double wgrad_ms = 0;  // one pass of each GEMM of the input: its weight gradient
    for (int g = groups[i][0]; g < groups[i][1] && g < gemms.count; ++g) {
      GemmDims one = gemms.items[g];
      one.passes = 1;
      wgrad_ms += ms_of(one.flops(), r.gemm_flops_per_s(one));
    }
    hidden += std::min(collective_ms, wgrad_ms);
  }
  *slowdown_ms = (kCommComputeSlowdown - 1.0) * hidden;
  return hidden;
}

double gradient_accumulation_ms(const ModelShape& s, LayerKind kind, int tp, double rank_params,
                                double bytes_per_value, const DeviceRates& r, LayerKernels k) {
  const double fused = k.gradient_accumulation_fusion ? layer_gemm_weight_params(s, kind, tp) : 0.0;
  return ms_of(main_grad_accumulation_bytes(k.main_grads, bytes_per_value) * std::max(0.0, rank_params - fused),
               r.bytes_per_s);
}

KernelClassTimes analytic_layer_classes(const ModelShape& s, int metis_layer, long long bs, long long seq, int tp,
                                        Recompute recompute, const DeviceRates& r, LayerKernels k) {
  const LayerKind kind = layer_kind(metis_layer, s.metis_num_layers());
  const long long tokens = bs * seq;
  KernelClassTimes c;
  for (const GemmDims& g : layer_gemms(s, kind, tokens, tp, recompute)) c.gemm_ms += ms_of(g.flops(), r.gemm_flops_per_s(g));
  c.attention_ms = k.attention == AttentionKernels::kFused
                       ? ms_of(layer_attention_flops(s, kind, bs, seq, tp, recompute), r.attention_flops_per_s)
                       : materialized_attention_ms(layer_score_traffic(s, kind, bs, seq, tp, recompute, 2.0), r);
  c.elementwise_ms =
      ms_of(layer_elementwise_bytes(s, kind, tokens, tp, recompute, 2.0, k.sequence_parallel), r.bytes_per_s);
  const double ring = tp > 1 ? 2.0 * (tp - 1) / tp : 0.0;
  const double all_reduce_ms = ms_of(ring * static_cast<double>(tokens) * s.hidden_size * 2.0, r.link_bytes_per_s);
  c.communication_ms = layer_allreduces(kind, tp) * all_reduce_ms;
  if (k.async_tp_backward && tp > 1) {
    // Under sequence parallelism the backward's collective of a column-parallel input is a reduce-scatter.
    double slowdown_ms = 0;
    c.overlapped_ms = async_tp_hidden_ms(s, kind, tokens, tp, k.sequence_parallel ? all_reduce_ms / 2 : all_reduce_ms,
                                         r, &slowdown_ms);
    c.communication_ms -= c.overlapped_ms;
    c.gemm_ms += slowdown_ms;
  }
  c.host_ms = layer_kernel_count(s, kind, recompute) * r.launch_host_us * 1e-3;
  return c;
}

KernelClassTimes transfer_layer(const MeasuredLayer& m, const DeviceRates& from, const DeviceRates& to,
                                double* layer_ms) {
  KernelClassTimes c;
  double priced = 0;
  for (std::size_t i = 0; i < m.gemms.size() && i < m.gemm_ms.size(); ++i) {
    c.gemm_ms += m.gemm_ms[i] * from.gemm_flops_per_s(m.gemms[i]) / to.gemm_flops_per_s(m.gemms[i]);
    priced += m.gemm_ms[i];
  }
  // GEMM time the list does not itemise: at the ratio of large GEMMs.
  const GemmDims large{8192, 8192, 8192, 1};
  c.gemm_ms += std::max(0.0, m.classes.gemm_ms - priced) * from.gemm_flops_per_s(large) / to.gemm_flops_per_s(large);
  c.attention_ms = m.classes.attention_ms * from.attention_flops_per_s / to.attention_flops_per_s;
  c.elementwise_ms = m.classes.elementwise_ms * from.bytes_per_s / to.bytes_per_s;
  c.communication_ms = m.classes.communication_ms * from.link_bytes_per_s / to.link_bytes_per_s;
  const bool hosts_known = from.launch_host_us > 0 && to.launch_host_us > 0 && from.probed && to.probed;
  // The floor as the chained measurement saw it: the host time to issue the layer from an idle device
  // (host_ms) overstates the pace of a host that runs ahead; the layer never took longer than measured.
  const double floor_ms = m.layer_ms > 0 ? std::min(m.classes.host_ms, m.layer_ms) : m.classes.host_ms;
  c.host_ms = floor_ms * (hosts_known ? to.launch_host_us / from.launch_host_us : 1.0);
  if (layer_ms) {
    KernelClassTimes before_classes = m.classes;
    before_classes.host_ms = floor_ms;
    const double before = before_classes.layer_ms();
    // What the chained measurement had beyond max(device, floor) (clocks, gaps) scales with the layer.
    *layer_ms = before > 0 ? m.layer_ms * c.layer_ms() / before : c.layer_ms();
  }
  return c;
}

}  // namespace hetplan
