#include "sim/offload.h"

#include <algorithm>
#include <string>

#include "sim/memory_model.h"

namespace hetplan {

HostSpec default_host_spec(double host_link_gbs, double host_memory_gbps) {
  HostSpec h;
  h.h2d_bytes_per_s = h.d2h_bytes_per_s = host_link_gbs * 1e9 * kPinnedCopyEfficiency;
  h.cpu_adam_params_per_s = host_memory_gbps * 1e9 / kCpuAdamBytesPerParam;
  h.cpu_cast_params_per_s = host_memory_gbps * 1e9 / kCpuCastBytesPerParam;
  h.source = "defaults: pinned copies at " + std::to_string(static_cast<int>(kPinnedCopyEfficiency * 100)) +
             "% of the GPU's nominal PCIe link per direction; CPU Adam 30 bytes/parameter over " + std::to_string(static_cast<int>(host_memory_gbps)) +
             " GB/s of host memory bandwidth, shared by the host's ranks; the fp32 -> 16-bit cast 6 bytes/parameter over "
             "the same bandwidth";
  return h;
}

bool deepspeed_overlap_comm(const TrainingSetup& s) {
  return s.deepspeed.overlap_comm < 0 ? s.zero_stage == 3 : s.deepspeed.overlap_comm != 0;
}

double deepspeed_buffer_bytes(const TrainingSetup& s, double largest_param) {
  const DeepSpeedBuffers& d = s.deepspeed;
  if (!d.model || s.zero_stage < 1) return 0;
  const double e = s.precision == Precision::kFp32 ? 4 : 2;  // the 16-bit (or fp32) dtype of the buckets
  if (s.zero_stage <= 2) {
    double bytes = 0;
    if (d.contiguous_gradients || s.offload_optimizer)
      bytes += d.reduce_bucket_size * e * (deepspeed_overlap_comm(s) ? 2 : 1);
    if (s.offload_optimizer) bytes += largest_param * e;  // temp_grad_buffer_for_gpu_offload
    return bytes;
  }
  double bytes = d.contiguous_gradients ? d.reduce_bucket_size * e : 0;
  // Gathered ahead of use beyond the current module, within the live-parameter cap.
  bytes += std::max(0.0, std::min(d.prefetch_bucket_size, d.max_live_parameters - largest_param)) * e;
  return bytes;
}

OffloadTime offload_time(const TrainingSetup& s, const HostSpec& h, double trainable, double weight_bytes, int dp,
                         int ranks_per_host, double forward_ms, double backward_ms) {
  OffloadTime t;
  const double n = s.zero_stage >= 1 ? std::max(dp, 1) : 1;
  const double e = s.precision == Precision::kFp32 ? 4 : 2;
  if (s.offload_optimizer && h.d2h_bytes_per_s > 0 && h.cpu_adam_params_per_s > 0) {
    const double part = trainable / n;
    // fp32 gradients cross the link (DeepSpeed's fp32 host buffer; the cast happens on the GPU).
    const double d2h_ms = part * 4 / h.d2h_bytes_per_s * 1e3;
    t.backward_exposed_ms += std::max(0.0, d2h_ms - backward_ms);
    const double ranks = std::max(ranks_per_host, 1);
    t.step_ms += part / (h.cpu_adam_params_per_s / ranks) * 1e3;
    // The updated fp32 partition cast to the 16-bit dtype on the host (none when training in fp32).
    if (e < 4 && h.cpu_cast_params_per_s > 0) t.step_ms += part / (h.cpu_cast_params_per_s / ranks) * 1e3;
    if (!(s.offload_params && s.zero_stage >= 3)) t.step_ms += part * e / h.h2d_bytes_per_s * 1e3;
  }
  if (s.offload_params && s.zero_stage >= 3 && h.h2d_bytes_per_s > 0) {
    const double fetch_ms = weight_bytes / n / h.h2d_bytes_per_s * 1e3;
    t.forward_exposed_ms += std::max(0.0, fetch_ms - forward_ms);
    t.backward_exposed_ms += std::max(0.0, fetch_ms - backward_ms);
  }
  return t;
}

}  // namespace hetplan
