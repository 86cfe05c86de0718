#include "profiler/layer_profiler.h"

#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "profiler/device_meter.h"
#include "profiler/kernel_classes.h"
#include "profiler/mixed_precision.h"
#include "base/statistics.h"
#include "base/json_util.h"
#include "sim/profile_model.h"

namespace hetplan::profiler {

namespace fs = std::filesystem;

namespace {

void drop_grads(const std::vector<torch::Tensor>& params) {
  for (auto p : params) p.mutable_grad() = torch::Tensor();
}

struct Measurement {
  std::vector<std::vector<double>> layer_ms;  // [layer][iteration]: forward + backward
  std::vector<std::vector<double>> forward_ms, accumulation_ms;  // [layer][iteration]
  std::vector<std::vector<double>> host_ms;                       // [layer][repeat]
  std::vector<std::vector<double>> device_ms;                     // [layer][iteration]: queue filled first
  std::vector<LayerClasses> classes;                              // per layer: GEMMs, attention, all-reduces
  std::vector<double> sustained_fb_ms;                            // back-to-back passes, in order
  std::vector<std::vector<double>> boost_ms;                      // [layer][iteration]: from idle
  std::vector<double> fb_ms, optimizer_ms, batch_ms;
  std::vector<double> layer_mb;
  // Per layer and micro-batch: the bytes its forward stores for the backward,
  // and the most its forward or backward holds beyond them (MB).
  std::vector<double> stored_mb, working_mb;
};

// For timing layers one at a time: a fresh batch (its targets set on the head) run through the model
// without gradients, and each layer's input kept.
std::vector<torch::Tensor> layer_inputs(GPT& model, int bs, const torch::TensorOptions& opts) {
  const GPTConfig& c = model.config();
  const torch::Tensor ids = torch::randint(c.shape.vocab_size, {bs, c.seq_len}, opts);
  model.head().set_targets(torch::randint(c.shape.vocab_size, {bs, c.seq_len}, opts));
  auto& layers = model.layers();
  std::vector<torch::Tensor> ins(layers.size());
  torch::NoGradGuard no_grad;
  torch::Tensor x = ids;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    ins[i] = x;
    if (i + 1 < layers.size()) x = layers[i]->forward(x);
  }
  return ins;
}

// The backward of one layer's output: the last layer's is the loss; the others take a gradient of ones.
void layer_backward(const torch::Tensor& out, bool last) {
  if (last) {
    out.backward();
  } else {
    out.backward(torch::ones_like(out));
  }
}

// Chained pace: `warmup + iters` iterations of the model layer by layer (inputs detached at the boundaries),
// each layer's gradient accumulation, then the whole model and the optimizer step; records the last `iters`.
void measure_iterations(GPT& model, const ProfileRequest& req, int bs, const torch::TensorOptions& opts,
                        MixedPrecisionAdam& adam, DeviceMeter& meter, Measurement& m) {
  const GPTConfig& c = model.config();
  auto& layers = model.layers();
  const std::size_t L = layers.size();
  for (int it = 0; it < req.warmup + req.iters; ++it) {
    const bool record = it >= req.warmup;
    meter.clear_marks();
    const int b0 = meter.mark();
    const torch::Tensor ids = torch::randint(c.shape.vocab_size, {bs, c.seq_len}, opts);
    const torch::Tensor targets = torch::randint(c.shape.vocab_size, {bs, c.seq_len}, opts);
    const int b1 = meter.mark();
    model.head().set_targets(targets);

    // Layer by layer, inputs detached at the boundaries.
    std::vector<torch::Tensor> inputs(L), outputs(L);
    std::vector<int> fwd_start(L), fwd_end(L), bwd_start(L), bwd_end(L);
    for (std::size_t i = 0; i < L; ++i) {
      inputs[i] = i == 0 ? ids : outputs[i - 1].detach().requires_grad_(true);
      fwd_start[i] = meter.mark();
      outputs[i] = layers[i]->forward(inputs[i]);
      fwd_end[i] = meter.mark();
    }
    torch::Tensor upstream;
    for (std::size_t k = L; k-- > 0;) {
      bwd_start[k] = meter.mark();
      if (k == L - 1) {
        outputs[k].backward();
      } else {
        outputs[k].backward(upstream);
      }
      bwd_end[k] = meter.mark();
      if (k > 0) upstream = inputs[k].grad();
    }
    inputs.clear();
    outputs.clear();
    upstream = torch::Tensor();

    // Each layer's backward above created its gradients. A later micro-batch
    // adds new ones into them instead (autograd's AccumulateGrad: one in-place
    // add per parameter), which costs a pass over the gradients that the
    // timings above do not contain: time exactly that add.
    std::vector<int> acc_start(L), acc_end(L);
    for (std::size_t i = 0; i < L; ++i) {
      std::vector<torch::Tensor> grads, fresh;
      for (const auto& p : layers[i]->parameters())
        if (p.grad().defined()) {
          grads.push_back(p.grad());
          fresh.push_back(torch::zeros_like(p.grad()));
        }
      acc_start[i] = meter.mark();
      for (std::size_t k = 0; k < grads.size(); ++k) grads[k].add_(fresh[k]);
      acc_end[i] = meter.mark();
    }

    // The whole model, and the optimizer step.
    adam.zero_grad();
    const int f0 = meter.mark();
    model.loss(ids, targets).backward();
    adam.accumulate_grads();
    const int f1 = meter.mark();
    adam.step();
    const int f2 = meter.mark();
    adam.zero_grad();
    meter.sync();
    if (!record) continue;
    for (std::size_t i = 0; i < L; ++i) {
      m.layer_ms[i].push_back(meter.elapsed_ms(fwd_start[i], fwd_end[i]) + meter.elapsed_ms(bwd_start[i], bwd_end[i]));
      m.forward_ms[i].push_back(meter.elapsed_ms(fwd_start[i], fwd_end[i]));
      m.accumulation_ms[i].push_back(meter.elapsed_ms(acc_start[i], acc_end[i]));
    }
    m.batch_ms.push_back(meter.elapsed_ms(b0, b1));
    m.fb_ms.push_back(meter.elapsed_ms(f0, f1));
    m.optimizer_ms.push_back(meter.elapsed_ms(f1, f2));
  }
}

// Boost pace: each layer's forward, then its backward, timed on its own
// after boost_idle_ms of idle. A GPU that idles ~20 ms is back at its
// boost clocks, and an H200 holds them for the first 40-80 ms of work
// (logs/greenctx_h200.md, round 7): so every op here starts at boost,
// where the chained pass above is power-capped after its first tens of ms.
void measure_boost(GPT& model, const ProfileRequest& req, int bs, const torch::TensorOptions& opts,
                   const std::vector<torch::Tensor>& params, DeviceMeter& meter, Measurement& m) {
  auto& layers = model.layers();
  const std::size_t L = layers.size();
  const auto idle = std::chrono::duration<double, std::milli>(req.boost_idle_ms);
  const std::vector<torch::Tensor> ins = layer_inputs(model, bs, opts);
  m.boost_ms.assign(L, {});
  for (int it = 0; it < req.iters; ++it)
    for (std::size_t i = 0; i < L; ++i) {
      torch::Tensor in = i == 0 ? ins[i] : ins[i].detach().requires_grad_(true);
      meter.clear_marks();
      meter.sync();
      std::this_thread::sleep_for(idle);
      const int f0 = meter.mark();
      torch::Tensor out = layers[i]->forward(in);
      const int f1 = meter.mark();
      meter.sync();
      std::this_thread::sleep_for(idle);
      const int b0 = meter.mark();
      layer_backward(out, i + 1 == L);
      const int b1 = meter.mark();
      meter.sync();
      m.boost_ms[i].push_back(meter.elapsed_ms(f0, f1) + meter.elapsed_ms(b0, b1));
    }
  drop_grads(params);
}

// Sustained pace: passes back to back, no sync in between, so the GPU never
// idles; the power limiter settles within the first second or so, hence
// the median of the second half.
void measure_sustained(GPT& model, const ProfileRequest& req, const TensorParallelGroup& group, int bs,
                       const torch::TensorOptions& opts, const std::vector<torch::Tensor>& params,
                       MixedPrecisionAdam& adam, DeviceMeter& meter, Measurement& m) {
  const GPTConfig& c = model.config();
  const torch::Tensor ids = torch::randint(c.shape.vocab_size, {bs, c.seq_len}, opts);
  const torch::Tensor targets = torch::randint(c.shape.vocab_size, {bs, c.seq_len}, opts);
  // A pass count, not a deadline: every rank of a tp group must run the
  // same number of passes (each holds collectives), so they agree on the
  // mean of their own estimates.
  torch::Tensor want = torch::full({1}, std::ceil(req.sustained_seconds * 1e3 / median(m.fb_ms)),
                                   torch::TensorOptions().dtype(torch::kFloat32).device(req.device));
  group.all_reduce(want);
  const int passes = std::max(2, static_cast<int>(std::lround(want.item<double>() / group.size())));
  meter.clear_marks();
  meter.sync();
  std::vector<int> marks{meter.mark()};
  for (int pass = 0; pass < passes; ++pass) {
    drop_grads(params);
    model.loss(ids, targets).backward();
    marks.push_back(meter.mark());
    // Keep the host at most 16 passes ahead, so the wall clock tracks the device.
    if (marks.size() % 16 == 0) meter.sync();
  }
  meter.sync();
  for (std::size_t k = marks.size() / 2; k + 1 < marks.size(); ++k)
    m.sustained_fb_ms.push_back(meter.elapsed_ms(marks[k], marks[k + 1]));
  adam.zero_grad();
}

// Host time: how long the CPU takes to issue a layer's forward and
// backward, each layer starting from an idle device so that the CPU never
// waits on a full launch queue. Where it exceeds the device time (small
// micro-batches), a stage that never waits for its neighbours runs at the
// host's pace, not the device's.
void measure_host(GPT& model, int bs, const torch::TensorOptions& opts, const std::vector<torch::Tensor>& params,
                  DeviceMeter& meter, Measurement& m) {
  auto& layers = model.layers();
  const std::size_t L = layers.size();
  const std::vector<torch::Tensor> ins = layer_inputs(model, bs, opts);
  m.host_ms.assign(L, {});
  for (int rep = 0; rep < 3; ++rep)
    for (std::size_t i = 0; i < L; ++i) {
      torch::Tensor in = i == 0 ? ins[i] : ins[i].detach().requires_grad_(true);
      meter.sync();
      const auto t0 = std::chrono::steady_clock::now();
      torch::Tensor out = layers[i]->forward(in);
      layer_backward(out, i + 1 == L);
      const auto t1 = std::chrono::steady_clock::now();
      meter.sync();
      m.host_ms[i].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  drop_grads(params);
}

// Device time: each layer's forward and backward issued while the device is
// still busy with a stall longer than the host takes to issue all layers, so
// the marks time the device's work alone (no launch gaps). With host_ms, the
// two sides of the launch floor.
void measure_device(GPT& model, const ProfileRequest& req, int bs, const torch::TensorOptions& opts,
                    const std::vector<torch::Tensor>& params, DeviceMeter& meter, Measurement& m) {
  auto& layers = model.layers();
  const std::size_t L = layers.size();
  const std::vector<torch::Tensor> ins = layer_inputs(model, bs, opts);
  double host_total = 0;
  for (const auto& h : m.host_ms) host_total += h.empty() ? 0.0 : median(h);
  m.device_ms.assign(L, {});
  for (int it = 0; it < req.iters; ++it) {
    drop_grads(params);
    meter.clear_marks();
    meter.sync();
    meter.stall(2.0 * host_total + 5.0);
    std::vector<int> a(L), b(L);
    for (std::size_t i = 0; i < L; ++i) {
      torch::Tensor in = i == 0 ? ins[i] : ins[i].detach().requires_grad_(true);
      a[i] = meter.mark();
      torch::Tensor out = layers[i]->forward(in);
      layer_backward(out, i + 1 == L);
      b[i] = meter.mark();
    }
    meter.sync();
    for (std::size_t i = 0; i < L; ++i) m.device_ms[i].push_back(meter.elapsed_ms(a[i], b[i]));
  }
  drop_grads(params);
}

// Memory, one layer at a time: what its forward and backward add on top of
// what is live, plus its weights, gradients and Adam state.
void measure_memory(GPT& model, const ProfileRequest& req, int bs, const torch::TensorOptions& opts,
                    const std::vector<torch::Tensor>& params, DeviceMeter& meter, Measurement& m) {
  const GPTConfig& c = model.config();
  auto& layers = model.layers();
  const std::size_t L = layers.size();
  const torch::Tensor ids = torch::randint(c.shape.vocab_size, {bs, c.seq_len}, opts);
  model.head().set_targets(torch::randint(c.shape.vocab_size, {bs, c.seq_len}, opts));
  torch::Tensor x = ids;
  // Gradients are transient, one at a time, as in replay's (and Megatron's)
  // backward, which adds each into its fp32 main gradient (counted below).
  const GradientDropper dropper(params);
  for (std::size_t i = 0; i < L; ++i) {
    torch::Tensor in = x;
    {
      drop_grads(params);
      if (i > 0) in = x.detach().requires_grad_(true);
      meter.sync();
      const int64_t base = meter.allocated();
      meter.reset_peak();
      torch::Tensor out = layers[i]->forward(in);
      meter.sync();
      // What the forward leaves for the backward (its output included: the
      // next layer's input, or what the stage sends on), and the most it
      // held beyond that at any moment of the forward or the backward.
      const int64_t after_forward = meter.allocated();
      const int64_t forward_peak = meter.peak();
      meter.reset_peak();
      layer_backward(out, i + 1 == L);
      meter.sync();
      const int64_t backward_peak = meter.peak();
      const int64_t activations = std::max(forward_peak, backward_peak) - base;  // with one transient gradient at a time
      m.stored_mb.push_back(static_cast<double>(after_forward - base) / (1024.0 * 1024.0));
      m.working_mb.push_back(static_cast<double>(std::max(forward_peak, backward_peak) - after_forward) /
                             (1024.0 * 1024.0));
      int64_t numel = 0;
      for (const auto& p : layers[i]->parameters()) numel += p.numel();
      // Weights, fp32 main gradients, fp32 masters (unless the weights are fp32) and Adam's moments.
      const int64_t state = numel * static_cast<int64_t>(MixedPrecisionAdam::state_bytes_per_parameter(req.dtype));
      m.layer_mb.push_back(static_cast<double>(state + activations) / (1024.0 * 1024.0));
      x = out.detach();
    }
  }
  drop_grads(params);  // (before the dropper goes)
}

// One measured configuration: all layers, `iters` times after `warmup`.
Measurement measure(GPT& model, const ProfileRequest& req, const TensorParallelGroup& group, int bs,
                    DeviceMeter& meter) {
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(req.device);
  const std::size_t L = model.layers().size();
  std::vector<torch::Tensor> params = model.parameters();
  MixedPrecisionAdam adam(params, 1e-4);
  Measurement m;
  m.layer_ms.assign(L, {});
  m.forward_ms.assign(L, {});
  m.accumulation_ms.assign(L, {});
  measure_iterations(model, req, bs, opts, adam, meter, m);
  if (req.boost_idle_ms > 0) measure_boost(model, req, bs, opts, params, meter, m);
  if (req.sustained_seconds > 0 && !m.fb_ms.empty())
    measure_sustained(model, req, group, bs, opts, params, adam, meter, m);
  measure_host(model, bs, opts, params, meter, m);
  measure_device(model, req, bs, opts, params, meter, m);
  m.classes = measure_layer_classes(req.model, group, bs, req.device, req.dtype, 2, req.iters, meter);
  measure_memory(model, req, bs, opts, params, meter, m);
  return m;
}

ordered_json profile_json(const ProfileRequest& req, const TensorParallelGroup& g, int bs, const Measurement& m,
                          const DeviceMeter& meter, const ordered_json& communication) {
  const GPTConfig& c = req.model;
  const std::size_t L = m.layer_ms.size();
  ordered_json j;
  j["model"] = profile_model_record(c.shape, c.seq_len, static_cast<int>(torch::elementSize(req.dtype)));

  ordered_json et;
  std::vector<double> layer_median;
  ordered_json layer_ms = ordered_json::array(), layer_spread = ordered_json::array();
  for (std::size_t i = 0; i < L; ++i) {
    layer_median.push_back(median(m.layer_ms[i]));
    layer_ms.push_back(layer_median.back());
    layer_spread.push_back(spread(m.layer_ms[i]));
  }
  const double fb = median(m.fb_ms), opt = median(m.optimizer_ms), batch = median(m.batch_ms);
  et["total_time_ms"] = fb + opt + batch;
  et["forward_backward_time_ms"] = fb;
  et["batch_generator_time_ms"] = batch;
  // No sequence parallelism and untied embeddings: neither all-reduce occurs.
  et["layernorm_grads_all_reduce_time_ms"] = 0.0;
  et["embedding_grads_all_reduce_time_ms"] = 0.0;
  et["optimizer_time_ms"] = opt;
  et["layer_compute_total_ms"] = layer_ms;
  et["layer_compute_spread"] = layer_spread;
  // hetplan's extensions (Metis reads none of them).
  ordered_json forward = ordered_json::array(), accumulation = ordered_json::array(), host = ordered_json::array();
  for (std::size_t i = 0; i < L; ++i) {
    forward.push_back(median(m.forward_ms[i]));
    accumulation.push_back(median(m.accumulation_ms[i]));
    host.push_back(median(m.host_ms[i]));
  }
  et["layer_forward_ms"] = forward;
  et["layer_grad_accumulation_ms"] = accumulation;
  et["layer_host_ms"] = host;
  if (!m.boost_ms.empty()) {
    ordered_json boost = ordered_json::array();
    for (std::size_t i = 0; i < L; ++i) boost.push_back(median(m.boost_ms[i]));
    et["layer_boost_ms"] = boost;
    et["boost_idle_ms"] = req.boost_idle_ms;
  }
  if (!m.sustained_fb_ms.empty()) {
    et["sustained_forward_backward_ms"] = median(m.sustained_fb_ms);
    et["sustained_passes"] = m.sustained_fb_ms.size();
    et["sustained_seconds"] = req.sustained_seconds;
  }
  et["forward_backward_spread"] = spread(m.fb_ms);
  {
    std::vector<double> device, host_median;
    for (std::size_t i = 0; i < L; ++i) {
      device.push_back(m.device_ms[i].empty() ? layer_median[i] : median(m.device_ms[i]));
      host_median.push_back(median(m.host_ms[i]));
    }
    et["kernel_classes"] = kernel_classes_json(m.classes, device, host_median, req.dtype_name);
  }
  j["execution_time"] = et;

  ordered_json mem;
  ordered_json layer_mb = ordered_json::array();
  double total_mb = 0;
  for (double v : m.layer_mb) {
    const double mb = std::round(v * 1000.0) / 1000.0;  // MB, to the KB
    layer_mb.push_back(mb);
    total_mb += mb;
  }
  mem["total_memory"] = total_mb;
  mem["layer_memory_total_mb"] = layer_mb;
  // hetplan's extensions: the activation part of the above, split into what
  // a micro-batch's forward stores until its backward, and the working set
  // the layer's forward or backward holds beyond that for a moment.
  const auto to_kb = [](const std::vector<double>& v) {
    ordered_json a = ordered_json::array();
    for (double x : v) a.push_back(std::round(std::max(0.0, x) * 1000.0) / 1000.0);
    return a;
  };
  if (meter.has_memory_stats()) {
    mem["layer_activation_mb"] = to_kb(m.stored_mb);
    mem["layer_working_mb"] = to_kb(m.working_mb);
  }
  mem["source"] = meter.has_memory_stats() ? "allocator peak statistics" : "not measured";
  // How the layers above hold their memory (hetplan's extensions):
  // weights + fp32 main gradients + fp32 masters + Adam moments per parameter
  // (18 for bf16 weights, Megatron's; 16 for fp32), attention fused (scores
  // never stored: scaled_dot_product_attention, LibTorch >= 2) or
  // materialized (softmax(QK^T) stored per head), and the head's loss over
  // each tp rank's vocabulary slice only (fp32 logits of V / tp per token).
  mem["state_bytes_per_parameter"] = static_cast<int>(MixedPrecisionAdam::state_bytes_per_parameter(req.dtype));
#if TORCH_VERSION_MAJOR >= 2
  mem["attention"] = "fused";
#else
  mem["attention"] = "materialized";
#endif
  mem["cross_entropy"] = "vocab_parallel";
  mem["recompute"] = to_string(c.recompute);
  // What the process holds beyond the tensors (on a GPU it has to itself).
  if (const int64_t fw = meter.framework_bytes(); fw >= 0) mem["framework_mb"] = std::round(fw / 1048.576) / 1000.0;
  j["execution_memory"] = mem;
  if (!communication.is_null()) j["communication"] = communication;

  ordered_json prof;
  prof["tool"] = "hetplan profile";
  prof["device"] = device_description(req.device);
  prof["device_type"] = req.device_type;
  prof["dtype"] = req.dtype_name;
  prof["tp"] = g.size();
  prof["micro_batch_size"] = bs;
  prof["warmup"] = req.warmup;
  prof["iters"] = req.iters;
  prof["statistic"] = "median; spread = (max - min) / median";
  prof["timer"] = req.device.is_cuda() ? "CUDA events" : "steady clock";
  prof["libtorch"] = TORCH_VERSION;
  if (!req.emulation.is_null()) prof["emulation"] = req.emulation;
  if (L > 2) {
    const double ms = layer_median[1];
    prof["block_tflops"] = block_flops(c, bs, g.size()) / (ms * 1e-3) / 1e12;
  }
  j["profiler"] = prof;
  return j;
}

// The data-parallel gradient all-reduce as replay issues it (one all-reduce
// per parameter tensor, no buckets), over this tp group's ranks and links:
// its time and bus bandwidth, 2 (n - 1) / n x bytes / time (nccl-tests'
// definition), which the simulator uses for collectives between GPUs of this
// type on one node. Null for a group of one.
ordered_json measure_gradient_all_reduce(GPT& model, const ProfileRequest& req, const TensorParallelGroup& g,
                                         DeviceMeter& meter) {
  if (g.size() < 2) return nullptr;
  std::vector<torch::Tensor> grads;
  int64_t bytes = 0;
  for (const auto& p : model.parameters()) {  // fp32 main gradients, as replay (and Megatron) reduce them
    grads.push_back(torch::zeros(p.sizes(), p.options().dtype(torch::kFloat32)));
    bytes += p.numel() * 4;
  }
  std::vector<double> ms;
  for (int it = 0; it < std::max(1, req.warmup) + std::max(3, req.iters); ++it) {
    meter.clear_marks();
    meter.sync();
    const int a = meter.mark();
    for (auto& t : grads) g.all_reduce(t);
    const int b = meter.mark();
    meter.sync();
    if (it >= std::max(1, req.warmup)) ms.push_back(meter.elapsed_ms(a, b));
  }
  const double n = g.size(), t = median(ms);
  ordered_json c;
  c["gradient_allreduce_ms"] = t;
  c["gradient_allreduce_spread"] = spread(ms);
  c["gradient_bytes"] = bytes;
  c["all_reduce_calls"] = grads.size();
  c["ranks"] = g.size();
  c["allreduce_busbw_gbs"] = 2 * (n - 1) / n * static_cast<double>(bytes) / (t * 1e-3) / 1e9;
  c["gradient_dtype"] = "fp32";
  c["how"] = "one all-reduce per parameter tensor of this rank's fp32 main gradients, over the tp group";
  return c;
}

}  // namespace

double block_flops(const GPTConfig& c, int bs, int tp) {
  return 3.0 * c.shape.block_forward_flops_per_token(c.seq_len) * static_cast<double>(bs) * c.seq_len / tp;
}

std::vector<BatchOutcome> profile_batch_sizes(const ProfileRequest& req, const TensorParallelGroup& group,
                                              const std::function<void(const BatchOutcome&)>& on_outcome) {
  GPT model(req.model, group);
  model.to(req.device, req.dtype);
  DeviceMeter meter(req.device);
  const ordered_json communication = measure_gradient_all_reduce(model, req, group, meter);
  meter.release_cached();
  std::vector<BatchOutcome> outcomes;
  for (int bs : req.batch_sizes) {
    BatchOutcome o;
    o.bs = bs;
    try {
      const Measurement m = measure(model, req, group, bs, meter);
      const ordered_json j = profile_json(req, group, bs, m, meter, communication);
      o.ok = true;
      o.block_ms = j["execution_time"]["layer_compute_total_ms"].size() > 2
                       ? j["execution_time"]["layer_compute_total_ms"][1].get<double>()
                       : 0.0;
      o.block_spread = j["execution_time"]["layer_compute_spread"].size() > 2
                           ? j["execution_time"]["layer_compute_spread"][1].get<double>()
                           : 0.0;
      o.block_tflops = j["profiler"].contains("block_tflops") ? j["profiler"]["block_tflops"].get<double>() : 0.0;
      if (j["execution_time"].contains("layer_boost_ms") && j["execution_time"]["layer_boost_ms"].size() > 2)
        o.block_boost_ms = j["execution_time"]["layer_boost_ms"][1].get<double>();
      if (group.rank() == 0) {
        fs::create_directories(req.out_dir);
        o.path = (fs::path(req.out_dir) / ("DeviceType." + req.device_type + "_tp" + std::to_string(group.size()) +
                                           "_bs" + std::to_string(bs) + ".json"))
                     .string();
        write_json_file(o.path, j);
      }
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
      o.error = std::string("out of memory: ") + e.what();
      o.error = o.error.substr(0, o.error.find('\n'));
      meter.release_cached();
    }
    outcomes.push_back(o);
    if (on_outcome) on_outcome(o);
  }
  meter.release_cached();  // the next tp group's ranks may share this GPU
  return outcomes;
}

}  // namespace hetplan::profiler
