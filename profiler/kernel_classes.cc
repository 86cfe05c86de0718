#include "profiler/kernel_classes.h"

#include <algorithm>

#include "base/statistics.h"
#include "sim/layer_work.h"

namespace hetplan::profiler {

std::vector<LayerClasses> layer_gemm_shapes(const GPTConfig& c, int bs, int tp) {
  const int L = static_cast<int>(c.num_layers());
  const long long tokens = static_cast<long long>(bs) * c.seq_len;
  std::vector<LayerClasses> out(L);
  for (int i = 0; i < L; ++i) {
    const LayerKind kind = layer_kind(i, L);
    for (const GemmDims& g : layer_gemms(c.shape, kind, tokens, tp, c.recompute))
      out[i].gemms.push_back({g.m, g.k, g.n, g.passes, 0.0});
    out[i].attention_flops = layer_attention_flops(c.shape, kind, bs, c.seq_len, tp, c.recompute);
  }
  return out;
}

namespace {

// Each GEMM's passes as autograd runs a linear layer: y = x w^T, dx = dy w, dw = dy^T x.
double time_gemm(const GemmShape& s, const torch::TensorOptions& opts, int warmup, int iters, DeviceMeter& meter) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({s.m, s.k}, opts), w = torch::randn({s.n, s.k}, opts);
  const torch::Tensor dy = torch::randn({s.m, s.n}, opts);
  torch::Tensor y = torch::empty({s.m, s.n}, opts), dx = torch::empty({s.m, s.k}, opts),
                dw = torch::empty({s.n, s.k}, opts);
  std::vector<double> ms;
  for (int it = 0; it < warmup + iters; ++it) {
    meter.clear_marks();
    meter.sync();
    const int a = meter.mark();
    for (int p = 0; p + 2 < s.passes; ++p) torch::mm_out(y, x, w.t());  // forward (twice under recomputation)
    torch::mm_out(dx, dy, w);
    torch::mm_out(dw, dy.t(), x);
    const int b = meter.mark();
    meter.sync();
    if (it >= warmup) ms.push_back(meter.elapsed_ms(a, b));
  }
  return median(ms);
}

double time_attention(const GPTConfig& c, int bs, int tp, const torch::TensorOptions& opts, int warmup, int iters,
                      DeviceMeter& meter) {
  const int64_t heads = c.shape.num_heads / tp, kv = c.shape.num_kv_heads / tp, d = c.shape.head_dim;
  const torch::Tensor q = torch::randn({bs, heads, c.seq_len, d}, opts).requires_grad_(true);
  const torch::Tensor k = torch::randn({bs, kv, c.seq_len, d}, opts).requires_grad_(true);
  const torch::Tensor v = torch::randn({bs, kv, c.seq_len, d}, opts).requires_grad_(true);
  const torch::Tensor grad = torch::randn({bs, heads, c.seq_len, d}, opts);
  const int forwards = c.recompute == Recompute::kNone ? 1 : 2;
  std::vector<double> ms;
  for (int it = 0; it < warmup + iters; ++it) {
    meter.clear_marks();
    meter.sync();
    const int a = meter.mark();
    torch::Tensor out;
    for (int f = 0; f < forwards; ++f) out = causal_self_attention(q, k, v, heads / kv);
    out.backward(grad);
    const int b = meter.mark();
    meter.sync();
    q.mutable_grad() = torch::Tensor();
    k.mutable_grad() = torch::Tensor();
    v.mutable_grad() = torch::Tensor();
    if (it >= warmup) ms.push_back(meter.elapsed_ms(a, b));
  }
  return median(ms);
}

double time_allreduce(int64_t values, const TensorParallelGroup& g, const torch::TensorOptions& opts, int warmup,
                      int iters, DeviceMeter& meter) {
  torch::Tensor t = torch::randn({values}, opts);
  std::vector<double> ms;
  for (int it = 0; it < warmup + iters; ++it) {
    meter.clear_marks();
    meter.sync();
    const int a = meter.mark();
    g.all_reduce(t);
    const int b = meter.mark();
    meter.sync();
    if (it >= warmup) ms.push_back(meter.elapsed_ms(a, b));
  }
  return median(ms);
}

}  // namespace

std::vector<LayerClasses> measure_layer_classes(const GPTConfig& c, const TensorParallelGroup& g, int bs,
                                                torch::Device device, torch::Dtype dtype, int warmup, int iters,
                                                DeviceMeter& meter) {
  std::vector<LayerClasses> out = layer_gemm_shapes(c, bs, g.size());
  const auto opts = torch::TensorOptions().device(device).dtype(dtype);
  const int L = static_cast<int>(out.size());
  const int64_t act = static_cast<int64_t>(bs) * c.seq_len * c.shape.hidden_size;
  // Embedding, the first block (every block has its shape) and the head.
  for (int i : {0, 1, L - 1}) {
    LayerClasses& lc = out[i];
    for (GemmShape& s : lc.gemms) {
      s.ms = time_gemm(s, opts, warmup, iters, meter);
      lc.gemm_ms += s.ms;
    }
    if (lc.attention_flops > 0) lc.attention_ms = time_attention(c, bs, g.size(), opts, warmup, iters, meter);
    const int n = layer_allreduces(layer_kind(i, L), g.size());
    if (n > 0) lc.communication_ms = n * time_allreduce(act, g, opts, warmup, iters, meter);
  }
  for (int i = 2; i + 1 < L; ++i) out[i] = out[1];
  return out;
}

ordered_json kernel_classes_json(const std::vector<LayerClasses>& classes, const std::vector<double>& device_ms,
                                 const std::vector<double>& host_ms, const std::string& dtype_name) {
  ordered_json j;
  ordered_json dev = ordered_json::array(), gemm = ordered_json::array(), attn = ordered_json::array(),
               comm = ordered_json::array(), elem = ordered_json::array(), host = ordered_json::array(),
               shapes = ordered_json::array(), attn_flops = ordered_json::array();
  for (std::size_t i = 0; i < classes.size(); ++i) {
    const LayerClasses& c = classes[i];
    const double d = i < device_ms.size() ? device_ms[i] : 0.0;
    dev.push_back(d);
    gemm.push_back(c.gemm_ms);
    attn.push_back(c.attention_ms);
    comm.push_back(c.communication_ms);
    elem.push_back(std::max(0.0, d - c.gemm_ms - c.attention_ms - c.communication_ms));
    host.push_back(i < host_ms.size() ? host_ms[i] : 0.0);
    ordered_json gs = ordered_json::array();
    for (const GemmShape& s : c.gemms) gs.push_back({s.m, s.k, s.n, s.passes, s.ms});
    shapes.push_back(gs);
    attn_flops.push_back(c.attention_flops);
  }
  j["how"] =
      "device_ms: each layer's forward+backward with the device queue filled first (no host gaps); gemm_ms: its "
      "GEMMs each timed alone (gemms: [m, k, n, passes, ms]); attention_ms: fused causal attention forward+backward "
      "alone; communication_ms: its tensor-parallel all-reduces alone; elementwise_ms: device_ms minus those (>= 0); "
      "host_ms: the host time to issue the layer (the launch floor)";
  j["dtype"] = dtype_name;
  j["device_ms"] = dev;
  j["gemm_ms"] = gemm;
  j["attention_ms"] = attn;
  j["communication_ms"] = comm;
  j["elementwise_ms"] = elem;
  j["host_ms"] = host;
  j["attention_flops"] = attn_flops;
  j["gemms"] = shapes;
  return j;
}

}  // namespace hetplan::profiler
