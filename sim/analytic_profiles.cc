#include "sim/analytic_profiles.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "base/file_access.h"
#include "sim/gpu_specs.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/model_shape.h"
#include "sim/roofline.h"

namespace hetplan {

namespace fs = std::filesystem;

namespace {

constexpr double kBytes = 2.0;  // bf16 / fp16 activations and weights
constexpr double kMB = 1024.0 * 1024.0;

struct LayerEstimate {
  double ms;
  double memory_mb;
  double params;
};

Roofline roofline_of(const GpuSpec& g, const AnalyticOptions& o) {
  return make_roofline(g.peak_tflops, o.compute_efficiency, g.memory_bw_gbs, o.memory_efficiency);
}

double roofline_ms(double flops, double bytes, const GpuSpec& g, const AnalyticOptions& o) {
  return roofline_of(g, o).seconds(flops, bytes) * 1e3;
}

// One ring all-reduce of `bytes` over tp GPUs on NVLink, in ms.
double allreduce_ms(double bytes, int tp, const GpuSpec& g) {
  if (tp <= 1) return 0.0;
  return 2.0 * (tp - 1) / tp * bytes / (g.nvlink_gbs * 1e9) * 1e3;
}

std::vector<LayerEstimate> estimate_layers(const ModelConfig& m, const GpuSpec& g, int tp, int bs,
                                           const AnalyticOptions& o) {
  const double b = bs, s = m.sequence_length, h = m.hidden_size, v = m.vocab_size, a = m.attention_heads;
  const int L = m.num_layers;
  const ModelShape shape = shape_from_model_config(m);  // the FLOP count (GPT-2: ffn 4 h)
  const double tokens = b * s;
  std::vector<LayerEstimate> out;

  // Embedding: token + position lookup forward, scatter-add backward.
  const double emb_params = v * h + s * h;
  const double emb_bytes = 3 * b * s * h * kBytes + 2 * emb_params * kBytes / tp;
  const double emb_act = b * s * h * kBytes;
  out.push_back({roofline_ms(0, emb_bytes, g, o), (16 * emb_params / tp + emb_act) / kMB, emb_params});

  // Transformer block: forward 24bsh^2 + 4bs^2h FLOPs (ModelShape's count), backward twice that.
  const double block_params = 12 * h * h + 13 * h;
  const double block_flops =
      kTrainingFlopsPerForwardFlop * (tokens * shape.block_forward_flops_per_token(m.sequence_length)) / tp;
  const double block_bytes = 3 * (kBytes * block_params / tp + 20 * b * s * h * kBytes / tp);
  const double block_ms = roofline_ms(block_flops, block_bytes, g, o) + 4 * allreduce_ms(b * s * h * kBytes, tp, g);
  // Korthikanti et al. (2022): s*b*h*(34 + 5*a*s/h) bytes per block, tensor parallel parts / tp.
  const double block_act = s * b * h * (10 + 24.0 / tp + 5 * a * s / (h * tp));
  for (int i = 0; i < blocks_from_metis_layers(L); ++i) out.push_back({block_ms, (16 * block_params / tp + block_act) / kMB, block_params});

  // Final LayerNorm + LM head (vocab-parallel) + cross-entropy.
  const double head_params = v * h + 2 * h;
  const double head_flops = kTrainingFlopsPerForwardFlop * (tokens * shape.head_forward_flops_per_token()) / tp;
  const double head_bytes = 3 * (kBytes * head_params / tp + 4 * b * s * v / tp);
  const double head_act = b * s * (h * kBytes + 4 * v / tp);
  out.push_back({roofline_ms(head_flops, head_bytes, g, o), (16 * head_params / tp + head_act) / kMB, head_params});
  return out;
}

// Throws unless `value` (a profile's step time or memory) is one ProfileSet::load reads back.
void require_readable_back(const std::string& gpu, int tp, int bs, double value, const char* unit, double limit) {
  if (value <= limit) return;
  throw InputError("gen-profiles --analytic: " + gpu + " tp " + std::to_string(tp) + " bs " + std::to_string(bs) +
                   ": the estimate is " + format_number(value) + " " + unit + ", past the " + format_number(limit) +
                   " " + unit + " a profile may hold (use a smaller model or MAX_BS)");
}

}  // namespace

std::vector<std::string> generate_analytic_profiles(const AnalyticOptions& o, const std::string& out_dir) {
  if (o.model.num_layers < 3) throw InputError("gen-profiles --analytic: LAYERS must be at least 3");
  if (o.max_tp < 1 || o.max_bs < 1) throw InputError("gen-profiles --analytic: --max-tp and MAX_BS must be >= 1");
  if (o.model.hidden_size % o.model.attention_heads != 0)
    throw InputError("gen-profiles --analytic: --hidden-size must be a multiple of --heads");
  make_output_folder(out_dir);
  std::vector<std::string> written;
  for (const std::string& type : o.device_types) {
    const GpuSpec* g = &require_gpu_spec(type, "gen-profiles --analytic: device type");
    for (char c : type)
      if (!std::isalnum(static_cast<unsigned char>(c)))
        throw InputError("gen-profiles --analytic: device type '" + excerpt(type) +
                         "': profile file names take letters and digits only (write the catalogue name without "
                         "punctuation, e.g. A10040GB for A100-40GB)");
    for (int tp = 1; tp <= o.max_tp; tp *= 2) {
      for (int bs = 1; bs <= o.max_bs; bs *= 2) {
        const auto layers = estimate_layers(o.model, *g, tp, bs, o);
        ordered_json j;
        ordered_json est;
        est["method"] = "roofline";
        est["note"] = "Estimated from datasheet numbers, not measured. Replace with `hetplan profile` output.";
        est["device"] = {{"name", g->name},
                         {"peak_tflops", g->peak_tflops},
                         {"memory_gb", g->memory_gb},
                         {"memory_bw_gbs", g->memory_bw_gbs},
                         {"nvlink_gbs", g->nvlink_gbs},
                         {"source", g->source_url}};
        est["compute_efficiency"] = o.compute_efficiency;
        est["memory_efficiency"] = o.memory_efficiency;
        j["estimate"] = est;
        ordered_json model;
        model["model_name"] = o.model.name;
        model["num_layers"] = o.model.num_layers;
        ordered_json params = ordered_json::array();
        double total_params = 0;
        for (const auto& l : layers) {
          params.push_back(static_cast<long long>(l.params * kBytes));
          total_params += l.params * kBytes;
        }
        model["parameters"] = {{"total_parameters_bytes", static_cast<long long>(total_params)},
                               {"parameters_per_layer_bytes", params}};
        j["model"] = model;
        ordered_json et;
        double sum_ms = 0;
        ordered_json times = ordered_json::array();
        for (const auto& l : layers) {
          times.push_back(l.ms);
          sum_ms += l.ms;
        }
        const double fb = sum_ms * 1.02 + 0.5;  // launch gaps and pipeline hand-off outside the layers
        const double optimizer = roofline_of(*g, o).memory_s(total_params / kBytes * 32.0 / tp) * 1e3;
        et["total_time_ms"] = fb + optimizer + 0.5;
        et["forward_backward_time_ms"] = fb;
        et["batch_generator_time_ms"] = 0.5;
        et["layernorm_grads_all_reduce_time_ms"] = 0.0;
        et["embedding_grads_all_reduce_time_ms"] = 0.0;
        et["optimizer_time_ms"] = optimizer;
        require_readable_back(g->name, tp, bs, fb + optimizer + 0.5, "ms", kMaxProfileMs);
        et["layer_compute_total_ms"] = times;
        j["execution_time"] = et;
        ordered_json mem;
        ordered_json per_layer = ordered_json::array();
        double total_mem = 0;
        for (const auto& l : layers) {
          per_layer.push_back(static_cast<long long>(l.memory_mb + 0.5));
          total_mem += static_cast<long long>(l.memory_mb + 0.5);
        }
        require_readable_back(g->name, tp, bs, total_mem, "MB", kMaxProfileMb);
        mem["total_memory"] = static_cast<long long>(total_mem);
        mem["layer_memory_total_mb"] = per_layer;
        j["execution_memory"] = mem;
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
