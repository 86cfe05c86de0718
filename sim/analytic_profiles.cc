#include "sim/analytic_profiles.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "base/file_access.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/gpu_specs.h"
#include "sim/memory_model.h"
#include "sim/profile_model.h"
#include "sim/roofline.h"

namespace hetplan {

namespace {

constexpr double kBytes = 2.0;  // bf16 / fp16 activations and weights
constexpr double kMB = 1024.0 * 1024.0;
// Weights, fp32 main gradients, fp32 masters and Adam's two moments (Megatron's bf16 layout; what
// `hetplan profile` records as state_bytes_per_parameter).
constexpr double kStateBytesPerParameter = 18.0;
// HBM bytes per parameter of an Adam step on fp32 masters: read and write the master, m and v (24), read the
// fp32 main gradient (4) and zero it for the next iteration (4), write the 16-bit weight (2).
constexpr double kAdamBytesPerParameter = 34.0;

struct LayerEstimate {
  double ms = 0, forward_ms = 0, accumulation_ms = 0, host_ms = 0;
  KernelClassTimes classes;
  double params = 0;       // whole layer (before tp)
  double rank_params = 0;  // this rank's shard
  double activation_mb = 0, working_mb = 0, memory_mb = 0;
};

// The most a layer's forward or backward holds beyond what it stores: the largest transient tensors
// (the MLP's intermediate and its gradient; the head's logits gradient; the embedding table's gradient).
double working_bytes(const ModelShape& s, LayerKind kind, double tokens, int tp) {
  const double h = static_cast<double>(s.hidden_size);
  if (kind == LayerKind::kEmbedding) return static_cast<double>(s.vocab_size) / tp * h * kBytes + tokens * h * kBytes;
  if (kind == LayerKind::kHead) return 1.5 * tokens * static_cast<double>(s.vocab_size) / tp * 4.0;
  const double q = static_cast<double>(s.num_heads) * s.head_dim / tp;
  const double kv = static_cast<double>(s.num_kv_heads) * s.head_dim / tp;
  const double f = static_cast<double>(s.ffn_hidden_size) / tp;
  return 2.0 * tokens * std::max(f, q + 2 * kv) * kBytes;
}

std::vector<LayerEstimate> estimate_layers(const ModelShape& s, long long seq, const DeviceRates& r, int tp, int bs,
                                           const LayerKernels& kernels) {
  const int L = s.metis_num_layers();
  const double tokens = static_cast<double>(bs) * seq;
  const TrainingSetup setup;
  std::vector<LayerEstimate> out(L);
  const std::vector<long long> params = s.metis_layer_params();
  for (int i = 0; i < L; ++i) {
    LayerEstimate& e = out[i];
    const LayerKind kind = layer_kind(i, L);
    const bool flash = kernels.attention == AttentionKernels::kFused;
    e.classes = analytic_layer_classes(s, i, bs, seq, tp, Recompute::kNone, r, kernels);
    e.ms = e.classes.layer_ms();
    // The forward runs one of the three passes of the layer as it would run without the backward's overlap
    // (which only shortens the backward).
    e.forward_ms = (e.ms + e.classes.overlapped_ms) / 3.0;
    e.params = static_cast<double>(params[i]);
    e.rank_params = shard_params(s, i, i + 1, 1, setup).on_rank(tp);
    // Accumulating a micro-batch's gradients into the main gradients (kernels.main_grads: a 16-bit one reads two
    // and writes one 16-bit value per parameter; the GEMM weights' inside their weight-gradient GEMMs under
    // gradient accumulation fusion).
    e.accumulation_ms = gradient_accumulation_ms(s, kind, tp, e.rank_params, kBytes, r, kernels);
    double act = 0;
    if (kind == LayerKind::kEmbedding) act = embedding_activation_bytes(s, seq, bs, tp, false);
    else if (kind == LayerKind::kHead) act = head_activation_bytes(s, seq, bs, tp, false);
    else act = layer_activation_bytes(s, seq, bs, tp, false, Recompute::kNone, flash, Precision::kBf16);
    e.activation_mb = act / kMB;
    e.working_mb = working_bytes(s, kind, tokens, tp) / kMB;
    e.memory_mb = kStateBytesPerParameter * e.rank_params / kMB + e.activation_mb + e.working_mb;
  }
  return out;
}

// Throws unless `value` (a profile's step time or memory) is one ProfileSet::load reads back.
void require_readable_back(const std::string& gpu, int tp, int bs, double value, const char* unit, double limit) {
  if (value <= limit) return;
  throw InputError("gen-profiles --analytic: " + gpu + " tp " + std::to_string(tp) + " bs " + std::to_string(bs) +
                   ": the estimate is " + format_number(value) + " " + unit + ", past the " + format_number(limit) +
                   " " + unit + " a profile may hold (use a smaller model or MAX_BS)");
}

bool tp_fits(const ModelShape& s, int tp) {
  return s.num_heads % tp == 0 && s.num_kv_heads % tp == 0 && s.ffn_hidden_size % tp == 0 && s.vocab_size % tp == 0;
}

ordered_json round_kb(double mb) { return std::round(std::max(0.0, mb) * 1000.0) / 1000.0; }

}  // namespace

ModelShape analytic_shape(const AnalyticOptions& o, long long* seq) {
  if (o.shape) {
    *seq = o.sequence_length > 0 ? o.sequence_length : o.model.sequence_length;
    return *o.shape;
  }
  *seq = o.model.sequence_length;
  return shape_from_model_config(o.model);
}

std::vector<std::string> generate_analytic_profiles(const AnalyticOptions& o, const std::string& out_dir) {
  long long seq = 0;
  const ModelShape shape = analytic_shape(o, &seq);
  if (shape.metis_num_layers() < 3) throw InputError("gen-profiles --analytic: LAYERS must be at least 3");
  if (o.max_tp < 1 || o.max_bs < 1) throw InputError("gen-profiles --analytic: --max-tp and MAX_BS must be >= 1");
  if (!o.shape && o.model.hidden_size % o.model.attention_heads != 0)
    throw InputError("gen-profiles --analytic: --hidden-size must be a multiple of --heads");
  make_output_folder(out_dir);
  RateDefaults defaults;
  defaults.gemm_efficiency = o.compute_efficiency;
  defaults.memory_efficiency = o.memory_efficiency;
  std::vector<std::string> written;
  for (const std::string& type : o.device_types) {
    std::string base;
    int sms = 0;
    const bool emulated = !find_gpu_spec(type) && parse_emulated_type(type, base, sms) && find_gpu_spec(base);
    const GpuSpec* g = &require_gpu_spec(emulated ? base : type, "gen-profiles --analytic: device type");
    for (char c : type)
      if (!std::isalnum(static_cast<unsigned char>(c)) && !(emulated && c == '-'))
        throw InputError("gen-profiles --analytic: device type '" + excerpt(type) +
                         "': profile file names take letters and digits only (write the catalogue name without "
                         "punctuation, e.g. A10040GB for A100-40GB; an emulated type is BASE-<N>sm)");
    // The 16-bit training precision the GPU runs: bf16, or fp16 where it has none (V100).
    const ComputePrecision precision = g->supports(ComputePrecision::kBf16) ? ComputePrecision::kBf16 : ComputePrecision::kFp16;
    const DeviceRates rates = catalogue_rates(type, precision, defaults, "gen-profiles --analytic: device type");
    for (int tp = 1; tp <= o.max_tp; tp *= 2) {
      if (o.shape && !tp_fits(shape, tp)) continue;  // a config whose heads tp does not divide
      for (int bs = 1; bs <= o.max_bs; bs *= 2) {
        LayerKernels kernels;
        kernels.attention = o.flash_attention ? AttentionKernels::kFused : AttentionKernels::kMaterialized;
        kernels.sequence_parallel = o.sequence_parallel;
        kernels.async_tp_backward = o.async_tp_backward;
        kernels.gradient_accumulation_fusion = o.gradient_accumulation_fusion;
        kernels.main_grads = o.main_grads;
        const auto layers = estimate_layers(shape, seq, rates, tp, bs, kernels);
        ordered_json j;
        ordered_json est;
        est["method"] = "layer time model on datasheet rates (sim/layer_time_model.h)";
        est["note"] = "Estimated from datasheet numbers, not measured. Replace with `hetplan profile` output.";
        est["device"] = {{"name", g->name},
                         {"peak_tflops", g->peak_of(precision)},
                         {"memory_gb", g->memory_gb},
                         {"memory_bw_gbs", g->memory_bw_gbs},
                         {"nvlink_gbs", g->nvlink_gbs},
                         {"source", g->source_url}};
        est["rates"] = rates.record();
        est["compute_efficiency"] = o.compute_efficiency;
        est["memory_efficiency"] = o.memory_efficiency;
        est["attention"] = o.flash_attention ? "fused" : "materialized";
        est["sequence_parallel"] = o.sequence_parallel;  // the time's elementwise work only; memory: the plan's
        est["async_tp_backward"] = o.async_tp_backward;
        est["gradient_accumulation_fusion"] = o.gradient_accumulation_fusion;
        est["main_grads"] = to_string(o.main_grads);
        j["estimate"] = est;
        j["model"] = profile_model_record(shape, seq, static_cast<int>(kBytes));
        ordered_json et;
        double sum_ms = 0, total_rank_params = 0;
        ordered_json times = ordered_json::array(), forward = ordered_json::array(), acc = ordered_json::array(),
                     host = ordered_json::array();
        ordered_json kc_gemm = ordered_json::array(), kc_attn = ordered_json::array(), kc_elem = ordered_json::array(),
                     kc_comm = ordered_json::array(), kc_dev = ordered_json::array();
        for (const auto& l : layers) {
          times.push_back(l.ms);
          forward.push_back(l.forward_ms);
          acc.push_back(l.accumulation_ms);
          host.push_back(l.classes.host_ms);
          kc_gemm.push_back(l.classes.gemm_ms);
          kc_attn.push_back(l.classes.attention_ms);
          kc_elem.push_back(l.classes.elementwise_ms);
          kc_comm.push_back(l.classes.communication_ms);
          kc_dev.push_back(l.classes.device_ms());
          sum_ms += l.ms;
          total_rank_params += l.rank_params;
        }
        const double fb = sum_ms * 1.02 + 0.5;  // launch gaps and pipeline hand-off outside the layers
        const double optimizer = kAdamBytesPerParameter * total_rank_params / rates.bytes_per_s * 1e3;
        const double batch = 0.1;
        et["total_time_ms"] = fb + optimizer + batch;
        et["forward_backward_time_ms"] = fb;
        et["batch_generator_time_ms"] = batch;
        et["layernorm_grads_all_reduce_time_ms"] = 0.0;
        et["embedding_grads_all_reduce_time_ms"] = 0.0;
        et["optimizer_time_ms"] = optimizer;
        require_readable_back(g->name, tp, bs, fb + optimizer + batch, "ms", kMaxProfileMs);
        et["layer_compute_total_ms"] = times;
        if (o.extensions) {
        et["layer_forward_ms"] = forward;
        et["layer_grad_accumulation_ms"] = acc;
        et["layer_host_ms"] = host;
        et["kernel_classes"] = {{"how", "analytic: the layer time model on the catalogue's rates"},
                                {"device_ms", kc_dev},
                                {"gemm_ms", kc_gemm},
                                {"attention_ms", kc_attn},
                                {"communication_ms", kc_comm},
                                {"elementwise_ms", kc_elem},
                                {"host_ms", host}};
        }
        j["execution_time"] = et;
        ordered_json mem;
        ordered_json per_layer = ordered_json::array(), act = ordered_json::array(), work = ordered_json::array();
        double total_mem = 0;
        for (const auto& l : layers) {
          per_layer.push_back(round_kb(l.memory_mb));
          act.push_back(round_kb(l.activation_mb));
          work.push_back(round_kb(l.working_mb));
          total_mem += round_kb(l.memory_mb).get<double>();
        }
        require_readable_back(g->name, tp, bs, total_mem, "MB", kMaxProfileMb);
        mem["total_memory"] = total_mem;
        mem["layer_memory_total_mb"] = per_layer;
        if (o.extensions) {
          mem["layer_activation_mb"] = act;
          mem["layer_working_mb"] = work;
          mem["source"] = "analytic (sim/memory_model.h)";
          mem["state_bytes_per_parameter"] = static_cast<int>(kStateBytesPerParameter);
          mem["attention"] = o.flash_attention ? "fused" : "materialized";
          mem["cross_entropy"] = "vocab_parallel";
          mem["recompute"] = "none";
        }
        j["execution_memory"] = mem;
        j["profiler"] = {{"tool", "hetplan gen-profiles --analytic"},
                         {"device_type", type},
                         {"dtype", to_string(precision)},
                         {"tp", tp},
                         {"micro_batch_size", bs}};
        const std::string name =
            "DeviceType." + type + "_tp" + std::to_string(tp) + "_bs" + std::to_string(bs) + ".json";
        write_json_file_in(out_dir, name, j);
        written.push_back(name);
      }
    }
  }
  std::sort(written.begin(), written.end());
  return written;
}

}  // namespace hetplan
