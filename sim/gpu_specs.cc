#include "sim/gpu_specs.h"

#include <cctype>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "sim/gpus_json.h"
#include "base/limits.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/network.h"

namespace hetplan {

namespace {

constexpr const char* kPrecisionNames[kNumComputePrecisions] = {"fp32", "tf32", "fp16", "bf16", "fp8", "int8"};

std::string normalise(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != '-' && c != '_' && c != ' ') out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

struct Catalogue {
  std::deque<GpuSpec> storage;  // stable addresses
  std::vector<const GpuSpec*> order;
};

GpuSpec parse_entry(const ordered_json& e, const std::string& file, const std::string& where) {
  if (!e.is_object()) throw InputError(key_where(file, where) + ": expected an object");
  GpuSpec g;
  const ordered_json& name = require_key(e, "name", file, where);
  if (!name.is_string() || name.get<std::string>().empty())
    throw InputError(key_where(file, where + ".name") + ": expected a non-empty string");
  g.name = name.get<std::string>();
  if (e.contains("aliases")) {
    for (const auto& a : require_array(e, "aliases", file, where))
      if (a.is_string()) g.aliases.push_back(a.get<std::string>());
      else throw InputError(key_where(file, where + ".aliases") + ": expected strings");
  }
  g.memory_gb = require_number(e, "memory_gb", file, where, rules::positive_up_to(1e6));
  g.memory_bw_gbs = require_number(e, "memory_bw_gbs", file, where, rules::positive_up_to(1e6));
  // Links within what the network model carries (sim/network.h), so that no later check names a key of a
  // file the user never wrote.
  const NumberRule link{kMinBytesPerSecond / 1e9, kMaxBytesPerSecond / 1e9, false, false};
  g.nvlink_gbs = require_number(e, "link_gbs", file, where, link);
  g.host_link_gbs = require_number(e, "host_link_gbs", file, where, rules::positive_up_to(1e6));
  g.sm_count = static_cast<int>(require_integer(e, "sm_count", file, where, rules::int_in(1, 1e6)));
  if (e.contains("base")) {
    if (!e["base"].is_string()) throw InputError(key_where(file, where + ".base") + ": expected a GPU name");
    g.base = e["base"].get<std::string>();
  }
  const ordered_json& peaks = require_key(e, "peak_tflops", file, where);
  if (!peaks.is_object() || peaks.empty())
    throw InputError(key_where(file, where + ".peak_tflops") + ": expected an object of precision: TFLOP/s");
  for (auto it = peaks.begin(); it != peaks.end(); ++it) {
    const ComputePrecision p = parse_compute_precision(it.key(), key_where(file, where + ".peak_tflops"));
    g.peak[static_cast<int>(p)] =
        number_value(it.value(), file, where + ".peak_tflops." + it.key(), rules::positive_up_to(1e6));
  }
  g.peak_tflops = g.peak_of(ComputePrecision::kBf16) > 0 ? g.peak_of(ComputePrecision::kBf16)
                                                         : g.peak_of(ComputePrecision::kFp16);
  if (g.peak_tflops <= 0)
    throw InputError(key_where(file, where + ".peak_tflops") + ": expected a bf16 or fp16 peak (the training peak)");
  const ordered_json& src = require_key(e, "source", file, where);
  if (!src.is_object() || !src.contains("title") || !src["title"].is_string() || !src.contains("url") ||
      !src["url"].is_string())
    throw InputError(key_where(file, where + ".source") + ": expected {\"title\": ..., \"url\": ...} (the datasheet)");
  g.source_title = src["title"].get<std::string>();
  g.source_url = src["url"].get<std::string>();
  if (e.contains("price")) {  // {"usd_per_gpu_hour": N, "source": "..."}
    const ordered_json& pr = e["price"];
    if (!pr.is_object() || !pr.contains("source") || !pr["source"].is_string())
      throw InputError(key_where(file, where + ".price") +
                       ": expected {\"usd_per_gpu_hour\": N, \"source\": \"where and when the price was read\"}");
    g.price_per_gpu_hour = require_number(pr, "usd_per_gpu_hour", file, where + ".price",
                                          rules::non_negative_up_to(kMaxGpuPricePerHour));
    g.price_source = pr["source"].get<std::string>();
  }
  return g;
}

const GpuSpec* find_in(const Catalogue& c, const std::string& name) {
  const std::string n = normalise(name);
  if (n.empty()) return nullptr;
  for (const GpuSpec* g : c.order) {
    if (normalise(g->name) == n) return g;
    for (const auto& a : g->aliases)
      if (normalise(a) == n) return g;
  }
  return nullptr;
}

// Each normalised name and alias mapped to the first entry of `c.order` that carries it: find_in's
// answers for every key at once (one pass, so that a large --gpu-spec loads in linear time).
std::unordered_map<std::string, const GpuSpec*> name_index(const Catalogue& c) {
  std::unordered_map<std::string, const GpuSpec*> index;
  for (const GpuSpec* g : c.order) {
    const std::string n = normalise(g->name);
    if (!n.empty()) index.emplace(n, g);
    for (const auto& a : g->aliases) {
      const std::string k = normalise(a);
      if (!k.empty()) index.emplace(k, g);
    }
  }
  return index;
}

void add_entries(Catalogue& c, const ordered_json& j, const std::string& file) {
  // The entry of each normalised name; a later one of the same name replaces the last match.
  std::unordered_map<std::string, GpuSpec*> by_name;
  for (GpuSpec& s : c.storage) by_name[normalise(s.name)] = &s;
  auto add = [&](const ordered_json& e, const std::string& where) {
    GpuSpec g = parse_entry(e, file, where);
    // Only an exact name (or alias) replaces an entry: a new name is a new entry.
    GpuSpec*& existing = by_name[normalise(g.name)];
    if (existing) {
      *existing = std::move(g);
    } else {
      c.storage.push_back(std::move(g));
      c.order.push_back(&c.storage.back());
      existing = &c.storage.back();
    }
  };
  if (j.is_object() && j.contains("gpus")) {
    const ordered_json& list = require_array(j, "gpus", file, "");
    for (std::size_t i = 0; i < list.size(); ++i) add(list[i], "gpus[" + std::to_string(i) + "]");
  } else {
    add(j, "");
  }
  const auto index = name_index(c);
  for (const GpuSpec* g : c.order) {
    const std::string base = normalise(g->base);
    if (!g->base.empty() && (base.empty() || index.find(base) == index.end()))
      throw InputError(file + ": GPU '" + g->name + "' names base '" + excerpt(g->base) + "', which the catalogue lacks");
  }
}

Catalogue& catalogue() {
  static Catalogue c = [] {
    Catalogue out;
    add_entries(out, ordered_json::parse(generated::kGpusJson), "sim/data/gpus.json (embedded)");
    return out;
  }();
  return c;
}

}  // namespace

const char* to_string(ComputePrecision p) { return kPrecisionNames[static_cast<int>(p)]; }

ComputePrecision parse_compute_precision(const std::string& s, const std::string& where) {
  for (int i = 0; i < kNumComputePrecisions; ++i)
    if (s == kPrecisionNames[i]) return static_cast<ComputePrecision>(i);
  throw InputError(where + ": '" + excerpt(s) + "': expected fp32, tf32, fp16, bf16, fp8 or int8");
}

std::string GpuSpec::supported() const {
  std::string out;
  for (int i = 0; i < kNumComputePrecisions; ++i)
    if (peak[i] > 0) out += (out.empty() ? "" : ", ") + std::string(kPrecisionNames[i]);
  return out;
}

const std::vector<const GpuSpec*>& gpu_specs() { return catalogue().order; }

const GpuSpec* find_gpu_spec(const std::string& name) { return find_in(catalogue(), name); }

std::string gpu_names() {
  std::string out;
  for (const GpuSpec* g : gpu_specs()) out += (out.empty() ? "" : ", ") + g->name;
  return out;
}

const GpuSpec& require_gpu_spec(const std::string& name, const std::string& where) {
  if (const GpuSpec* g = find_gpu_spec(name)) return *g;
  throw InputError(where + ": '" + excerpt(name) + "': unknown GPU; known: " + gpu_names() +
                   " (or give a spec with --gpu-spec FILE)");
}

double require_peak(const GpuSpec& g, ComputePrecision p, const std::string& where) {
  if (!g.supports(p))
    throw InputError(where + ": " + g.name + " has no " + to_string(p) + " (it supports " + g.supported() + "; " +
                     g.source_url + ")");
  return g.peak_of(p) * 1e12;
}

const char* embedded_gpu_catalogue_json() { return generated::kGpusJson; }

void load_gpu_spec_file(const std::string& path) { add_entries(catalogue(), read_json_file(path), path); }

std::size_t check_gpu_spec_file(const std::string& path) {
  Catalogue c;
  add_entries(c, ordered_json::parse(generated::kGpusJson), "sim/data/gpus.json (embedded)");
  add_entries(c, read_json_file(path), path);
  return c.order.size();
}

const GpuSpec* match_device_description(const std::string& description) {
  const std::string d = normalise(description);
  const GpuSpec* best = nullptr;
  std::size_t best_len = 0;
  for (const GpuSpec* g : gpu_specs()) {
    std::vector<std::string> names = g->aliases;
    names.push_back(g->name);
    for (const auto& n : names) {
      const std::string k = normalise(n);
      if (!k.empty() && d.find(k) != std::string::npos && k.size() > best_len) best = g, best_len = k.size();
    }
  }
  return best;
}

}  // namespace hetplan
