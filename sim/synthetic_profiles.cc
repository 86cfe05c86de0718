#include "sim/synthetic_profiles.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "base/file_access.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/model_config.h"
#include "sim/profile.h"

namespace hetplan {

namespace fs = std::filesystem;

namespace {

std::string file_name(const std::string& type, int tp, int bs) {
  return "DeviceType." + type + "_tp" + std::to_string(tp) + "_bs" + std::to_string(bs) + ".json";
}

// Python arithmetic on JSON numbers: int * int stays int, anything else is float.
ordered_json times(const ordered_json& v, double factor) {
  const bool int_factor = factor == std::floor(factor);
  if (v.is_number_integer() && int_factor) return v.get<long long>() * static_cast<long long>(factor);
  return v.get<double>() * factor;
}
ordered_json divided(const ordered_json& v, double d) { return v.get<double>() / d; }

// Python's sum(): ints add exactly, a float turns the rest into float.
ordered_json python_sum(const ordered_json& list) {
  bool is_int = true;
  long long isum = 0;
  double fsum = 0;
  for (const auto& v : list) {
    if (is_int && v.is_number_integer()) {
      isum += v.get<long long>();
      continue;
    }
    if (is_int) {
      fsum = static_cast<double>(isum);
      is_int = false;
    }
    fsum += v.get<double>();
  }
  if (is_int) return isum;
  return fsum;
}

ordered_json stretch(const ordered_json& list, int layers) {
  ordered_json out = ordered_json::array();
  out.push_back(list.front());
  for (int i = 0; i < blocks_from_metis_layers(layers); ++i) out.push_back(list[1]);
  out.push_back(list.back());
  return out;
}

double num(const ordered_json& j) { return j.get<double>(); }

class ProfileFiles {
 public:
  ordered_json& at(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end()) throw InputError(name + ": needed to derive the synthetic set but was not produced");
    return it->second;
  }
  void put(const std::string& name, ordered_json j) { files_[name] = std::move(j); }
  std::map<std::string, ordered_json>& all() { return files_; }

 private:
  std::map<std::string, ordered_json> files_;
};

// total_time_ms after a tp/bs rescale, in the reference's order of terms.
void retotal_scaled(ordered_json& et) {
  et["total_time_ms"] = num(et["forward_backward_time_ms"]) + num(et["optimizer_time_ms"]) +
                        num(et["batch_generator_time_ms"]) + num(et["layernorm_grads_all_reduce_time_ms"]) +
                        num(et["embedding_grads_all_reduce_time_ms"]);
}

}  // namespace

std::vector<std::string> generate_synthetic_profiles(const std::string& samples_dir, const std::string& out_dir,
                                                     int layers, int max_bs) {
  if (layers < 2 || layers > kMaxModelLayers)
    throw InputError("gen-profiles: LAYERS must be from 2 to " + std::to_string(kMaxModelLayers) + ", got " +
                     std::to_string(layers));
  if (max_bs < 1 || max_bs > kMaxProfileBs)
    throw InputError("gen-profiles: MAX_BS must be from 1 to " + std::to_string(kMaxProfileBs) + ", got " +
                     std::to_string(max_bs));
  require_directory(samples_dir, "samples folder");

  ProfileFiles files;
  // 1. The A100 samples, with the two derived fields.
  std::vector<std::string> names;
  for (const auto& name : list_directory(samples_dir, "samples folder")) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    ProfileName parts;
    if (!parse_profile_name(name, parts) || parts.type != "A100") continue;
    const std::string path = (fs::path(samples_dir) / name).string();
    ordered_json j = read_json_file(path);
    ordered_json& et = const_cast<ordered_json&>(require_key(j, "execution_time", path, ""));
    ordered_json& model = const_cast<ordered_json&>(require_key(j, "model", path, ""));
    // The same value rules as ProfileSet::load (sim/profile.h); every list needs a first, second and last entry.
    const NumberRule ms = rules::positive_up_to(kMaxProfileMs), ms0 = rules::non_negative_up_to(kMaxProfileMs);
    auto list = [&](const ordered_json& parent, const char* key, const char* where, const NumberRule& rule) {
      if (require_number_list(parent, key, path, where, rule, kMaxProfileLayers + 2).size() < 2)
        throw InputError(key_where(path, std::string(where) + "." + key) + " needs at least 2 entries");
    };
    list(et, "layer_compute_total_ms", "execution_time", ms);
    require_number(et, "forward_backward_time_ms", path, "execution_time", ms);
    for (const char* k : {"optimizer_time_ms", "batch_generator_time_ms", "layernorm_grads_all_reduce_time_ms",
                          "embedding_grads_all_reduce_time_ms", "total_time_ms"})
      require_number(et, k, path, "execution_time", ms0);
    require_integer(model, "num_layers", path, "model", rules::int_in(2, kMaxModelLayers));
    const ordered_json& params = require_key(model, "parameters", path, "model");
    list(params, "parameters_per_layer_bytes", "model.parameters", rules::non_negative_up_to(1e15));
    list(require_key(j, "execution_memory", path, ""), "layer_memory_total_mb", "execution_memory",
         rules::non_negative_up_to(kMaxProfileMb));
    et["between_forward_backward_time_ms"] =
        num(et["forward_backward_time_ms"]) - num(python_sum(et["layer_compute_total_ms"]));
    model["num_MHA_layers"] = blocks_from_metis_layers(static_cast<int>(model["num_layers"].get<long long>()));
    files.put(name, std::move(j));
  }
  if (files.all().empty())
    throw InputError(samples_dir + ": no DeviceType.A100_tp<T>_bs<B>.json samples (expected Metis's sample profiles)");

  // 2. Stretch every sample to `layers` layers.
  for (auto& [name, j] : files.all()) {
    ordered_json& model = j["model"];
    model["num_layers"] = layers;
    model["num_MHA_layers"] = blocks_from_metis_layers(layers);
    ordered_json& params = model["parameters"];
    params["parameters_per_layer_bytes"] = stretch(params["parameters_per_layer_bytes"], layers);
    params["total_parameters_bytes"] = python_sum(params["parameters_per_layer_bytes"]);
    ordered_json& mem = j["execution_memory"];
    mem["layer_memory_total_mb"] = stretch(mem["layer_memory_total_mb"], layers);
    mem["total_memory"] = python_sum(mem["layer_memory_total_mb"]);
    ordered_json& et = j["execution_time"];
    et["layer_compute_total_ms"] = stretch(et["layer_compute_total_ms"], layers);
    et["forward_backward_time_ms"] =
        num(et["between_forward_backward_time_ms"]) + num(python_sum(et["layer_compute_total_ms"]));
    et["layernorm_grads_all_reduce_time_ms"] = num(et["layernorm_grads_all_reduce_time_ms"]) / 10 * layers;
    et["optimizer_time_ms"] = num(et["optimizer_time_ms"]) / 10 * layers;
    et["total_time_ms"] = num(et["forward_backward_time_ms"]) + num(et["batch_generator_time_ms"]) +
                          num(et["layernorm_grads_all_reduce_time_ms"]) +
                          num(et["embedding_grads_all_reduce_time_ms"]) + num(et["optimizer_time_ms"]);
  }

  // 3. Larger micro-batches for tp 1, 2, 4; then larger tp for every batch size.
  auto rescale = [&](const std::string& from, const std::string& to, double factor, bool divide) {
    ordered_json j = files.at(from);
    ordered_json& et = j["execution_time"];
    ordered_json scaled = ordered_json::array();
    for (const auto& t : et["layer_compute_total_ms"]) scaled.push_back(divide ? divided(t, factor) : times(t, factor));
    et["layer_compute_total_ms"] = scaled;
    for (const char* k : {"forward_backward_time_ms", "between_forward_backward_time_ms"})
      et[k] = divide ? divided(et[k], factor) : times(et[k], factor);
    retotal_scaled(et);
    files.put(to, std::move(j));
  };
  for (int tp : {1, 2, 4})
    for (int bs = 4; bs < max_bs; bs *= 2) rescale(file_name("A100", tp, bs), file_name("A100", tp, bs * 2), 2, false);
  const int top_exp = static_cast<int>(std::log2(static_cast<double>(max_bs)) + 1);
  for (int e = 0; e < top_exp; ++e) {
    const int bs = 1 << e;
    for (int tp = 4; tp < max_bs; tp *= 2) rescale(file_name("A100", tp, bs), file_name("A100", tp * 2, bs), 2, true);
  }

  // 4. V100: every time x 3.5.
  std::vector<std::pair<std::string, ordered_json>> v100;
  for (const auto& [name, j] : files.all()) {
    ordered_json v = j;
    ordered_json& et = v["execution_time"];
    for (const char* k : {"total_time_ms", "forward_backward_time_ms", "batch_generator_time_ms",
                          "layernorm_grads_all_reduce_time_ms", "embedding_grads_all_reduce_time_ms",
                          "optimizer_time_ms"})
      et[k] = times(et[k], 3.5);
    ordered_json scaled = ordered_json::array();
    for (const auto& t : et["layer_compute_total_ms"]) scaled.push_back(times(t, 3.5));
    et["layer_compute_total_ms"] = scaled;
    et["between_forward_backward_time_ms"] = times(et["between_forward_backward_time_ms"], 3.5);
    std::string vname = name;
    vname.replace(vname.find("A100"), 4, "V100");
    v100.emplace_back(vname, std::move(v));
  }
  for (auto& [name, j] : v100) files.put(name, std::move(j));

  make_output_folder(out_dir);
  std::vector<std::string> written;
  for (const auto& [name, j] : files.all()) {
    write_json_file_in(out_dir, name, j);
    written.push_back(name);
  }
  return written;
}

}  // namespace hetplan
