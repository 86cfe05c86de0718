#include "sim/offload.h"

#include <algorithm>
#include <string>

#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/memory_model.h"
#include "sim/model_shape.h"

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

OffloadTime offload_time(const TrainingSetup& s, const HostSpec& host, double trainable, double weight_bytes, int dp,
                         int ranks_per_host, double forward_ms, double backward_ms) {
  OffloadTime t;
  if (s.zero_stage < 1) return t;  // ZeRO-Offload is a ZeRO stage's: nothing without one
  const double n = std::max(dp, 1);
  const double e = s.precision == Precision::kFp32 ? 4 : 2;
  HostSpec h = host;
  if (s.deepspeed.model && !s.deepspeed.pin_memory) {  // DeepSpeed's pin_memory false: staged copies
    h.h2d_bytes_per_s *= kPageableCopyFactor;
    h.d2h_bytes_per_s *= kPageableCopyFactor;
  }
  // With overlap_comm the backward hides its copies: the gradients device-to-host (on DeepSpeed's
  // reduction stream) and (parameter offload) the weights host-to-device run at once, in opposite
  // directions of the link, so the backward hides the longer of the two, once (subtracting it from each
  // would count its time twice: recomputation, which lengthens the backward, would then shorten the step).
  // Without overlap_comm (ZeRO-1/2's default) DeepSpeed issues the gradient copies on the compute stream
  // (stage_1_and_2.py reduce_ipg_grads: "copy_grad_stream is disabled", current_stream()): they run
  // between the backward's kernels and none of their time is hidden.
  double d2h_ms = 0, fetch_ms = 0;
  if (s.offload_optimizer && h.d2h_bytes_per_s > 0 && h.cpu_adam_params_per_s > 0) {
    const double part = trainable / n;
    // fp32 gradients cross the link (DeepSpeed's fp32 host buffer; the cast happens on the GPU).
    d2h_ms = part * 4 / h.d2h_bytes_per_s * 1e3;
    const double ranks = std::max(ranks_per_host, 1);
    t.step_ms += part / (h.cpu_adam_params_per_s / ranks) * 1e3;
    // The updated fp32 partition cast to the 16-bit dtype on the host (none when training in fp32).
    if (e < 4 && h.cpu_cast_params_per_s > 0) t.step_ms += part / (h.cpu_cast_params_per_s / ranks) * 1e3;
    if (!(s.offload_params && s.zero_stage >= 3)) t.step_ms += part * e / h.h2d_bytes_per_s * 1e3;
  }
  // (DeepSpeed's ZeRO-3 model fetches module by module with its gathers: zero3_pass_ms, not here.)
  if (s.offload_params && s.zero_stage >= 3 && h.h2d_bytes_per_s > 0 && !s.deepspeed.model) {
    fetch_ms = weight_bytes / n / h.h2d_bytes_per_s * 1e3;
    t.forward_exposed_ms += std::max(0.0, fetch_ms - forward_ms);
  }
  if (deepspeed_overlap_comm(s))
    t.backward_exposed_ms += std::max(0.0, std::max(d2h_ms, fetch_ms) - backward_ms);
  else
    t.backward_exposed_ms += d2h_ms + std::max(0.0, fetch_ms - backward_ms);
  return t;
}

namespace {

// A config number, or "auto" (-1); InputError naming the key otherwise.
double config_number(const ordered_json& o, const char* key, const std::string& file, const std::string& where,
                     double fallback, bool allow_auto) {
  if (!o.contains(key) || o[key].is_null()) return fallback;
  const ordered_json& v = o[key];
  if (allow_auto && v.is_string() && v.get<std::string>() == "auto") return -1;
  if (!v.is_number())
    throw InputError(key_where(file, where + key) + ": expected a number" + (allow_auto ? " or \"auto\"" : ""));
  return check_number(v.get<double>(), rules::positive_up_to(1e15), key_where(file, where + key));
}

bool config_bool(const ordered_json& o, const char* key, const std::string& file, const std::string& where,
                 bool fallback) {
  if (!o.contains(key) || o[key].is_null()) return fallback;
  if (!o[key].is_boolean()) throw InputError(key_where(file, where + key) + ": expected true or false");
  return o[key].get<bool>();
}

// offload_optimizer / offload_param: {"device": "cpu"|"none", "pin_memory": bool}. Returns whether on.
bool config_offload(const ordered_json& z, const char* key, const std::string& file, bool* pin) {
  if (!z.contains(key) || z[key].is_null()) return false;
  const ordered_json& o = z[key];
  const std::string where = std::string("zero_optimization.") + key + ".";
  if (!o.is_object()) throw InputError(key_where(file, std::string("zero_optimization.") + key) + ": expected an object");
  std::string device = "none";
  if (o.contains("device")) {
    if (!o["device"].is_string()) throw InputError(key_where(file, where + "device") + ": expected \"cpu\" or \"none\"");
    device = o["device"].get<std::string>();
  }
  if (device == "nvme")
    throw InputError(key_where(file, where + "device") + ": \"nvme\" (ZeRO-Infinity) is not modelled; expected \"cpu\" or \"none\"");
  if (device != "cpu" && device != "none")
    throw InputError(key_where(file, where + "device") + ": '" + excerpt(device) + "': expected \"cpu\" or \"none\"");
  const bool on = device == "cpu";
  if (on) *pin = config_bool(o, "pin_memory", file, where, false) || *pin;
  return on;
}

bool enabled(const ordered_json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return false;
  if (!j[key].is_object()) throw InputError(key_where(file, key) + ": expected an object with \"enabled\"");
  const ordered_json& e = j[key];
  if (!e.contains("enabled")) return false;
  if (e["enabled"].is_string() && e["enabled"].get<std::string>() == "auto")
    throw InputError(key_where(file, std::string(key) + ".enabled") +
                     ": \"auto\" is resolved by the Hugging Face Trainer; write true or false");
  return config_bool(e, "enabled", file, std::string(key) + ".", false);
}

int config_batch(const ordered_json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return 0;
  if (j[key].is_string() && j[key].get<std::string>() == "auto") return 0;
  if (!j[key].is_number_integer()) throw InputError(key_where(file, key) + ": expected a positive integer or \"auto\"");
  return static_cast<int>(check_integer(j[key].get<double>(), rules::int_in(1, 1 << 24), key_where(file, key)));
}

}  // namespace

DeepSpeedRunConfig read_deepspeed_config(const std::string& path) {
  DeepSpeedRunConfig c;
  c.path = path;
  const ordered_json j = read_json_file(path);
  if (!j.is_object()) throw InputError(path + ": expected a JSON object (a DeepSpeed config)");
  c.buffers.from_config = path;
  if (j.contains("zero_optimization") && !j["zero_optimization"].is_null()) {
    const ordered_json& z = j["zero_optimization"];
    if (!z.is_object()) throw InputError(key_where(path, "zero_optimization") + ": expected an object");
    const std::string w = "zero_optimization.";
    if (z.contains("stage")) {
      if (!z["stage"].is_number_integer()) throw InputError(key_where(path, w + "stage") + ": expected 0, 1, 2 or 3");
      c.stage = static_cast<int>(check_integer(z["stage"].get<double>(), rules::int_in(0, 3), key_where(path, w + "stage")));
    }
    bool pin = false;
    c.offload_optimizer = config_offload(z, "offload_optimizer", path, &pin);
    if (config_bool(z, "cpu_offload", path, w, false)) c.offload_optimizer = true;
    c.offload_params = config_offload(z, "offload_param", path, &pin);
    c.buffers.pin_memory = pin;
    if (c.offload_params && c.stage < 3)
      throw InputError(key_where(path, w + "offload_param") + ": parameter offload needs stage 3 (the stage is " +
                       std::to_string(c.stage) + ")");
    if ((c.offload_optimizer) && c.stage < 1)
      throw InputError(key_where(path, w + "offload_optimizer") + ": optimizer offload needs stage 1, 2 or 3");
    DeepSpeedBuffers& b = c.buffers;
    b.reduce_bucket_size = config_number(z, "reduce_bucket_size", path, w, b.reduce_bucket_size, true);
    b.allgather_bucket_size = config_number(z, "allgather_bucket_size", path, w, b.allgather_bucket_size, false);
    b.prefetch_bucket_size = config_number(z, "stage3_prefetch_bucket_size", path, w, b.prefetch_bucket_size, true);
    b.max_live_parameters = config_number(z, "stage3_max_live_parameters", path, w, b.max_live_parameters, false);
    b.param_persistence_threshold =
        config_number(z, "stage3_param_persistence_threshold", path, w, b.param_persistence_threshold, true);
    if (z.contains("overlap_comm") && !z["overlap_comm"].is_null())
      b.overlap_comm = config_bool(z, "overlap_comm", path, w, false) ? 1 : 0;
    b.contiguous_gradients = config_bool(z, "contiguous_gradients", path, w, b.contiguous_gradients);
  }
  const bool fp16 = enabled(j, "fp16", path), bf16 = enabled(j, "bf16", path) || enabled(j, "bfloat16", path);
  if (fp16 && bf16) throw InputError(path + ": fp16.enabled and bf16.enabled are both true (DeepSpeed allows one)");
  c.precision = fp16 ? "fp16" : bf16 ? "bf16" : "fp32";
  c.micro_batch = config_batch(j, "train_micro_batch_size_per_gpu", path);
  c.accumulation = config_batch(j, "gradient_accumulation_steps", path);
  return c;
}

std::vector<double> zero3_gathered_modules(const ModelShape& m, int first, int end, int tp, double threshold) {
  std::vector<double> out;
  auto add = [&](double elements) {
    if (elements >= threshold) out.push_back(elements / tp);
  };
  const int last = m.metis_num_layers() - 1;
  const double vh = static_cast<double>(m.vocab_size) * m.hidden_size;
  const bool c_attn = m.learned_positions && m.mlp == MlpKind::kGelu;  // GPT-2's fused q, k, v (Conv1D)
  for (int layer = first; layer < end; ++layer) {
    if (layer == 0) {
      add(vh);
      if (m.learned_positions) add(static_cast<double>(m.max_positions) * m.hidden_size);
    } else if (layer == last) {
      add(vh);  // the LM head (tied: the embedding's weight, gathered again)
    } else {
      double qkv = 0;
      for (const LinearShape& l : m.block_linears()) {
        const bool attn_in = l.target == kTargetQ || l.target == kTargetK || l.target == kTargetV;
        if (c_attn && attn_in) {
          qkv += static_cast<double>(l.params());
          if (l.target == kTargetV) add(qkv);
        } else {
          add(static_cast<double>(l.params()));
        }
      }
    }
  }
  return out;
}

void resolve_deepspeed_auto(DeepSpeedRunConfig& c, long long hidden) {
  const double h = static_cast<double>(hidden);
  if (c.buffers.reduce_bucket_size < 0) c.buffers.reduce_bucket_size = h * h;
  if (c.buffers.prefetch_bucket_size < 0) c.buffers.prefetch_bucket_size = 0.9 * h * h;
  if (c.buffers.param_persistence_threshold < 0) c.buffers.param_persistence_threshold = 10 * h;
}

}  // namespace hetplan
