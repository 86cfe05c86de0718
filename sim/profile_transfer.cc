#include "sim/profile_transfer.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "base/file_access.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/profile.h"
#include "sim/profile_model.h"

namespace hetplan {

namespace fs = std::filesystem;

namespace {

// The analytic split that apportions a measured layer time without recorded classes: every collective of the
// layer in its communication class, as before the layer time model had Megatron's overlap (what the
// measurement ran is in its time; the split only shares it out).
LayerKernels measured_split_kernels() {
  LayerKernels k;
  k.async_tp_backward = false;
  return k;
}
const LayerKernels kMeasuredSplit = measured_split_kernels();

struct Source {
  std::string path, name;
  int tp = 0, bs = 0;
};

std::vector<double> numbers(const ordered_json& j, const char* key, const std::string& path, std::size_t n,
                            bool required) {
  std::vector<double> v;
  if (!j.is_object() || !j.contains(key)) {
    if (required) throw InputError(path + ": key '" + std::string(key) + "' is missing");
    return v;
  }
  const auto& a = j[key];
  if (!a.is_array() || (n > 0 && a.size() != n))
    throw InputError(path + ": key '" + std::string(key) + "' must be a list of " + std::to_string(n) + " numbers");
  for (const auto& x : a) {
    if (!x.is_number()) throw InputError(path + ": key '" + std::string(key) + "' must hold numbers");
    v.push_back(x.get<double>());
  }
  return v;
}

ordered_json to_json(const std::vector<double>& v) {
  ordered_json a = ordered_json::array();
  for (double x : v) a.push_back(x);
  return a;
}

// The probe record of `type` in the folders, or null.
ordered_json find_probe(const std::vector<std::string>& dirs, const std::string& type, std::string* where) {
  for (const auto& d : dirs) {
    const fs::path p = fs::path(d) / ("gpu_probe." + type + ".json");
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) {
      *where = p.string();
      return read_json_file(p.string());
    }
  }
  return nullptr;
}

// The measured layers of one profile: its kernel classes, or (absent) the analytic split of its layer times.
std::vector<MeasuredLayer> measured_layers(const ordered_json& et, const std::string& path, const ModelShape& shape,
                                           long long seq, int tp, int bs, const DeviceRates& from_catalogue,
                                           const std::vector<double>& layer_ms) {
  const std::size_t L = layer_ms.size();
  std::vector<MeasuredLayer> out(L);
  if (et.contains("kernel_classes") && et["kernel_classes"].is_object()) {
    const auto& k = et["kernel_classes"];
    const std::string where = path + ": execution_time.kernel_classes";
    const auto dev = numbers(k, "device_ms", where, L, true), gemm = numbers(k, "gemm_ms", where, L, true),
               attn = numbers(k, "attention_ms", where, L, true), comm = numbers(k, "communication_ms", where, L, true),
               elem = numbers(k, "elementwise_ms", where, L, true), host = numbers(k, "host_ms", where, L, true);
    const bool itemised = k.contains("gemms") && k["gemms"].is_array() && k["gemms"].size() == L;
    for (std::size_t i = 0; i < L; ++i) {
      MeasuredLayer& m = out[i];
      m.layer_ms = layer_ms[i];
      m.classes = {gemm[i], attn[i], elem[i], comm[i], host[i]};
      (void)dev;
      if (!itemised) continue;
      for (const auto& g : k["gemms"][i]) {
        if (!g.is_array() || g.size() != 5) throw InputError(where + ".gemms: each GEMM is [m, k, n, passes, ms]");
        m.gemms.push_back({g[0].get<long long>(), g[1].get<long long>(), g[2].get<long long>(), g[3].get<int>()});
        m.gemm_ms.push_back(g[4].get<double>());
      }
    }
    return out;
  }
  // No classes recorded: the analytic model's shares of each measured layer time.
  if (static_cast<std::size_t>(shape.metis_num_layers()) != L)
    throw InputError(path + ": " + std::to_string(L) + " layer times for a model of " +
                     std::to_string(shape.metis_num_layers()) + " layers");
  for (std::size_t i = 0; i < L; ++i) {
    const KernelClassTimes a =
        analytic_layer_classes(shape, static_cast<int>(i), bs, seq, tp, Recompute::kNone, from_catalogue, kMeasuredSplit);
    const double dev = a.device_ms();
    const double f = dev > 0 ? layer_ms[i] / dev : 0.0;
    MeasuredLayer& m = out[i];
    m.layer_ms = layer_ms[i];
    m.classes = {a.gemm_ms * f, a.attention_ms * f, a.elementwise_ms * f, a.communication_ms * f, 0.0};
  }
  return out;
}

ordered_json transfer_one(const ordered_json& src, const Source& s, const std::string& target,
                          const DeviceRates& from, const DeviceRates& to, const DeviceRates& from_catalogue) {
  long long seq = 0;
  const ModelShape shape = shape_from_profile_record(src.contains("model") ? src["model"] : ordered_json(), s.path, &seq);
  if (!src.contains("execution_time") || !src["execution_time"].is_object())
    throw InputError(s.path + ": key 'execution_time' is missing");
  ordered_json j = src;
  ordered_json& et = j["execution_time"];
  const std::vector<double> layer_ms = numbers(et, "layer_compute_total_ms", s.path + ": execution_time", 0, true);
  const std::size_t L = layer_ms.size();
  const auto layers = measured_layers(et, s.path, shape, seq, s.tp, s.bs, from_catalogue, layer_ms);

  std::vector<double> new_ms(L), ratio(L);
  ordered_json kc;
  std::vector<double> dev, gemm, attn, elem, comm, host;
  ordered_json gemms = ordered_json::array();
  for (std::size_t i = 0; i < L; ++i) {
    const KernelClassTimes c = transfer_layer(layers[i], from, to, &new_ms[i]);
    ratio[i] = layer_ms[i] > 0 ? new_ms[i] / layer_ms[i] : 1.0;
    dev.push_back(c.device_ms());
    gemm.push_back(c.gemm_ms);
    attn.push_back(c.attention_ms);
    elem.push_back(c.elementwise_ms);
    comm.push_back(c.communication_ms);
    host.push_back(c.host_ms);
    ordered_json gs = ordered_json::array();
    for (std::size_t g = 0; g < layers[i].gemms.size(); ++g) {
      const GemmDims& d = layers[i].gemms[g];
      gs.push_back({d.m, d.k, d.n, d.passes,
                    layers[i].gemm_ms[g] * from.gemm_flops_per_s(d) / to.gemm_flops_per_s(d)});
    }
    gemms.push_back(gs);
  }
  double old_sum = 0, new_sum = 0;
  for (std::size_t i = 0; i < L; ++i) {
    old_sum += layer_ms[i];
    new_sum += new_ms[i];
  }
  const double layers_ratio = old_sum > 0 ? new_sum / old_sum : 1.0;
  const double memory_ratio = from.bytes_per_s / to.bytes_per_s;
  et["layer_compute_total_ms"] = to_json(new_ms);
  auto scale_list = [&](const char* key, const std::vector<double>& f) {
    if (!et.contains(key) || !et[key].is_array() || et[key].size() != L) return;
    for (std::size_t i = 0; i < L; ++i) et[key][i] = et[key][i].get<double>() * f[i];
  };
  scale_list("layer_forward_ms", ratio);
  scale_list("layer_boost_ms", ratio);
  scale_list("layer_grad_accumulation_ms", std::vector<double>(L, memory_ratio));
  if (et.contains("layer_host_ms") && et["layer_host_ms"].is_array() && et["layer_host_ms"].size() == L)
    et["layer_host_ms"] = to_json(host);
  auto scale = [&](const char* key, double f) {
    if (et.contains(key) && et[key].is_number()) et[key] = et[key].get<double>() * f;
  };
  const double fb_old = et.value("forward_backward_time_ms", old_sum);
  scale("forward_backward_time_ms", layers_ratio);
  scale("sustained_forward_backward_ms", layers_ratio);
  scale("optimizer_time_ms", memory_ratio);
  const double fb = et.value("forward_backward_time_ms", fb_old);
  et["total_time_ms"] = fb + et.value("optimizer_time_ms", 0.0) + et.value("batch_generator_time_ms", 0.0);
  kc["how"] = "derived by gen-profiles --from: each class of the source's scaled by the two GPUs' rates";
  kc["device_ms"] = to_json(dev);
  kc["gemm_ms"] = to_json(gemm);
  kc["attention_ms"] = to_json(attn);
  kc["communication_ms"] = to_json(comm);
  kc["elementwise_ms"] = to_json(elem);
  kc["host_ms"] = to_json(host);
  kc["gemms"] = gemms;
  et["kernel_classes"] = kc;
  if (j.contains("communication") && j["communication"].is_object()) {
    auto& c = j["communication"];
    const double link = to.link_bytes_per_s / from.link_bytes_per_s;
    if (c.contains("allreduce_busbw_gbs") && c["allreduce_busbw_gbs"].is_number())
      c["allreduce_busbw_gbs"] = c["allreduce_busbw_gbs"].get<double>() * link;
    if (c.contains("gradient_allreduce_ms") && c["gradient_allreduce_ms"].is_number())
      c["gradient_allreduce_ms"] = c["gradient_allreduce_ms"].get<double>() / link;
  }
  ordered_json& prof = j["profiler"];
  if (!prof.is_object()) prof = ordered_json::object();
  prof["device_type"] = target;
  prof["dtype"] = to_string(to.precision);
  prof["device"] = "derived for " + target + " (not measured)";
  if (prof.contains("block_tflops") && prof["block_tflops"].is_number() && L > 2 && ratio[1] > 0)
    prof["block_tflops"] = prof["block_tflops"].get<double>() / ratio[1];
  prof.erase("emulation");
  ordered_json tr;
  tr["method"] = "gen-profiles --from: kernel classes scaled by the GPUs' rates (sim/layer_time_model.h)";
  tr["from_file"] = s.path;
  tr["from_type"] = from.type;
  tr["classes"] = et.contains("kernel_classes") && src["execution_time"].contains("kernel_classes")
                      ? "measured"
                      : "analytic shares of the measured layer times";
  tr["from_rates"] = from.record();
  tr["to_rates"] = to.record();
  prof["transfer"] = tr;
  return j;
}

void check_type_name(const std::string& type) {
  if (type.empty() || !std::all_of(type.begin(), type.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; }))
    throw InputError("gen-profiles --types: '" + excerpt(type) +
                     "': profile file names take letters, digits and '-' (write A10040GB for A100-40GB)");
}

}  // namespace

std::vector<std::string> transfer_profiles(const TransferOptions& o) {
  if (o.types.empty()) throw InputError("gen-profiles --from: --types names no GPU");
  for (const auto& t : o.types) check_type_name(t);
  std::vector<Source> sources;
  std::set<std::string> source_types;
  for (const std::string& name : list_directory(o.from_dir, "--from")) {
    ProfileName pn;
    if (!parse_profile_name(name, pn)) continue;
    source_types.insert(pn.type);
    if (!o.from_type.empty() && pn.type != o.from_type) continue;
    sources.push_back({(fs::path(o.from_dir) / name).string(), name, std::stoi(pn.tp_digits), std::stoi(pn.bs_digits)});
  }
  std::string from_type = o.from_type;
  if (from_type.empty()) {
    if (source_types.size() != 1) {
      std::string known;
      for (const auto& t : source_types) known += (known.empty() ? "" : ", ") + t;
      throw InputError("gen-profiles --from " + o.from_dir + ": " +
                       (source_types.empty() ? std::string("no DeviceType.<TYPE>_tp<T>_bs<B>.json files")
                                             : "holds several device types (" + known + "); name one with --from-type"));
    }
    from_type = *source_types.begin();
  }
  if (sources.empty()) throw InputError("gen-profiles --from " + o.from_dir + ": no profiles of type '" + excerpt(from_type) + "'");
  std::sort(sources.begin(), sources.end(), [](const Source& a, const Source& b) { return a.name < b.name; });
  std::vector<std::string> probe_dirs{o.from_dir};
  probe_dirs.insert(probe_dirs.end(), o.probe_dirs.begin(), o.probe_dirs.end());
  make_output_folder(o.out_dir);
  std::vector<std::string> written;
  for (const Source& s : sources) {
    const ordered_json src = read_json_file(s.path);
    std::string dtype = "bf16";
    if (src.contains("profiler") && src["profiler"].is_object() && src["profiler"].contains("dtype") &&
        src["profiler"]["dtype"].is_string())
      dtype = src["profiler"]["dtype"].get<std::string>();
    const ComputePrecision precision = parse_compute_precision(dtype, s.path + ": profiler.dtype");
    const DeviceRates from_catalogue = catalogue_rates(from_type, precision, o.defaults, s.path + ": device type");
    std::string from_probe_path;
    const ordered_json from_probe = find_probe(probe_dirs, from_type, &from_probe_path);
    for (const std::string& target : o.types) {
      const DeviceRates to_catalogue = catalogue_rates(target, precision, o.defaults, "gen-profiles --types");
      std::string to_probe_path;
      const ordered_json to_probe = find_probe(probe_dirs, target, &to_probe_path);
      const bool both = !from_probe.is_null() && !to_probe.is_null();
      const DeviceRates from =
          both ? probe_rates(from_probe, from_probe_path, from_type, precision, o.defaults) : from_catalogue;
      const DeviceRates to = both ? probe_rates(to_probe, to_probe_path, target, precision, o.defaults) : to_catalogue;
      const ordered_json j = transfer_one(src, s, target, from, to, from_catalogue);
      const std::string name = "DeviceType." + target + "_tp" + std::to_string(s.tp) + "_bs" + std::to_string(s.bs) + ".json";
      write_json_file_in(o.out_dir, name, j);
      written.push_back(name);
    }
  }
  std::sort(written.begin(), written.end());
  return written;
}

}  // namespace hetplan
