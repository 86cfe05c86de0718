#include "sim/profile.h"
#include "sim/cluster.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <map>
#include <thread>
#include <tuple>

#include "base/file_access.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "base/statistics.h"
#include "sim/network.h"

namespace hetplan {

namespace fs = std::filesystem;

SliceSums::SliceSums(const std::vector<double>& values) : n_(static_cast<int>(values.size())) {
  if (n_ > kTabulatedLayers) {
    values_ = values;
    return;
  }
  table_.assign(static_cast<std::size_t>(n_ + 1) * (n_ + 1), 0.0);
  for (int s = 0; s < n_; ++s) {
    double acc = 0.0;  // Python's sum() starts from int 0; 0 + x == x exactly
    for (int e = s; e < n_; ++e) {
      acc += values[e];
      table_[static_cast<std::size_t>(s) * (n_ + 1) + e + 1] = acc;
    }
  }
}

double SliceSums::sum_slice(int s, int e) const {
  double acc = 0.0;  // the order the table uses: values[s] first
  for (int i = s; i < e; ++i) acc += values_[i];
  return acc;
}

namespace {

double left_sum(const std::vector<double>& v) {
  double acc = 0.0;
  for (double x : v) acc += x;
  return acc;
}

}  // namespace

int ProfileSet::type_index(const std::string& name) const {
  auto it = std::lower_bound(types_.begin(), types_.end(), name);
  if (it == types_.end() || *it != name) return -1;
  return static_cast<int>(it - types_.begin());
}

double LayerProfile::net_allreduce_busbw_gbs(double hop_latency_s) const {
  if (allreduce_busbw_gbs <= 0 || hop_latency_s <= 0 || !has_allreduce_calls()) return allreduce_busbw_gbs;
  const double n = allreduce_ranks;
  const double latency_s = all_reduce_calls * ring_all_reduce_latency_s(allreduce_ranks, hop_latency_s);
  const double net_s = gradient_allreduce_ms * 1e-3 - latency_s;
  if (net_s <= 0) return allreduce_busbw_gbs;
  return 2 * (n - 1) / n * gradient_bytes / net_s / 1e9;
}

double ProfileSet::allreduce_busbw_gbs(int type, double hop_latency_s) const {
  int best_tp = 0;
  double bw = -1;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const LayerProfile& e = entries_[i];
    if (type_index(entry_types_[i]) != type || e.allreduce_busbw_gbs <= 0 || e.tp < best_tp) continue;
    if (e.tp > best_tp) bw = -1;
    best_tp = e.tp;
    bw = std::max(bw, e.net_allreduce_busbw_gbs(hop_latency_s));  // files of one tp share one measurement
  }
  return bw;
}

std::string ProfileSet::expected_path(int type, int tp, int bs) const {
  const std::string name = "DeviceType." + (type >= 0 && type < static_cast<int>(types_.size()) ? types_[type] : "?") +
                           "_tp" + std::to_string(tp) + "_bs" + std::to_string(bs) + ".json";
  return dir_.empty() ? name : (fs::path(dir_) / name).string();
}

std::string ProfileSet::missing_message(int type, int tp, int bs, const std::string& why) const {
  const std::string name = type >= 0 && type < static_cast<int>(types_.size()) ? types_[type] : "?";
  return expected_path(type, tp, bs) + ": missing profile (device " + name + ", tp " + std::to_string(tp) + ", bs " +
         std::to_string(bs) + "), needed for " + why +
         "; profile it, or lower --max_profiled_tp_degree / --max_profiled_batch_size";
}

double first_block_startup_ms(const LayerProfile& p) {
  const int layers = static_cast<int>(p.forward_ms.size());
  if (layers < 4 || static_cast<int>(p.layer_ms.size()) != layers) return 0;  // embedding, 2+ blocks, head
  const double others = median(std::vector<double>(p.forward_ms.begin() + 2, p.forward_ms.end() - 1));
  const double excess = p.forward_ms[1] - others;
  return excess > 0 && excess < p.layer_ms[1] ? excess : 0.0;  // (a file whose layer time is not above it: left)
}

void ProfileSet::add(const std::string& type, LayerProfile p) {
  p.first_block_startup_ms = first_block_startup_ms(p);
  if (p.first_block_startup_ms > 0) {
    p.forward_ms[1] -= p.first_block_startup_ms;
    p.layer_ms[1] -= p.first_block_startup_ms;
  }
  p.fb_sync_ms = p.forward_backward_ms - left_sum(p.layer_ms);
  p.total_layer_ms = left_sum(p.layer_ms);
  p.time = SliceSums(p.layer_ms);
  p.memory = SliceSums(p.memory_mb);
  if (p.has_forward()) p.forward_time = SliceSums(p.forward_ms);
  if (p.has_grad_accumulation()) p.accumulation_time = SliceSums(p.grad_accumulation_ms);
  if (p.has_activation_split()) {
    p.activation = SliceSums(p.activation_mb);
  }
  if (std::find(types_.begin(), types_.end(), type) == types_.end()) {
    types_.push_back(type);
    std::sort(types_.begin(), types_.end());
  }
  entry_types_.push_back(type);
  entries_.push_back(std::move(p));
  index_.clear();  // rebuilt by finalize()
}

double ProfileSet::framework_mb(int type, int tp) const {
  // tp's own: its smallest-bs file that records one (the index's bs slots are in increasing bs).
  const auto own = [&](int t) {
    if (type < 0 || static_cast<std::size_t>(type) >= types_.size() || t < 1 || t > max_tp_ || tp_slot_[t] < 0)
      return -1.0;
    const int* row = &index_[(static_cast<std::size_t>(type) * num_tps_ + tp_slot_[t]) * num_bss_];
    for (std::size_t b = 0; b < num_bss_; ++b)
      if (row[b] >= 0 && entries_[row[b]].framework_mb > 0) return entries_[row[b]].framework_mb;
    return -1.0;
  };
  const int top = std::min(tp, max_tp_);
  if (const double v = own(top); v > 0) return v;
  if (const double v = framework_mb(type); v > 0) return v;
  for (int t = top - 1; t >= 1; --t)
    if (const double v = own(t); v > 0) return v;
  return -1;
}

const LayerProfile* ProfileSet::activation_profile(int type, int tp, int bs) const {
  const int top = std::min(max_bs_, 2 * bs);
  for (int b = std::min(bs, top); b >= 1; --b)
    if (const LayerProfile* p = find(type, tp, b); p && p->has_activation_split()) return p;
  for (int b = bs + 1; b <= top; ++b)
    if (const LayerProfile* p = find(type, tp, b); p && p->has_activation_split()) return p;
  return nullptr;
}

void ProfileSet::rebuild_index() {
  max_tp_ = max_bs_ = 0;
  for (const auto& e : entries_) {
    max_tp_ = std::max(max_tp_, e.tp);
    max_bs_ = std::max(max_bs_, e.bs);
  }
  tp_slot_.assign(static_cast<std::size_t>(max_tp_) + 1, -1);
  bs_slot_.assign(static_cast<std::size_t>(max_bs_) + 1, -1);
  for (const auto& e : entries_) tp_slot_[e.tp] = bs_slot_[e.bs] = 0;
  int n = 0;
  for (int& slot : tp_slot_)
    if (slot == 0) slot = n++;
  num_tps_ = static_cast<std::size_t>(n);
  n = 0;
  for (int& slot : bs_slot_)
    if (slot == 0) slot = n++;
  num_bss_ = static_cast<std::size_t>(n);
  index_.assign(types_.size() * num_tps_ * num_bss_, -1);
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const int t = type_index(entry_types_[i]);
    index_[(static_cast<std::size_t>(t) * num_tps_ + tp_slot_[entries_[i].tp]) * num_bss_ + bs_slot_[entries_[i].bs]] =
        static_cast<int>(i);
  }
}

void ProfileSet::finalize(const std::string& model_path, double optimizer_time_ms, double batch_generator_ms,
                          std::vector<double> parameters_per_layer_bytes) {
  rebuild_index();
  model_.path = model_path;
  model_.optimizer_ms = optimizer_time_ms * 2;
  model_.batch_generator_ms = batch_generator_ms;
  model_.parameters_per_layer_bytes = std::move(parameters_per_layer_bytes);
  const LayerProfile* first = find(0, 1, 1);
  if (!first) throw InputError("profiles: no tp1_bs1 file for the first device type");
  const double total = left_sum(first->layer_ms);
  model_.norm_layer_duration.clear();
  for (double d : first->layer_ms) model_.norm_layer_duration.push_back(d / total);
  num_layers_ = static_cast<int>(first->layer_ms.size());
}

namespace {

// The tp or bs digits of a profile file name, as an int in [1, max].
int name_number(const std::string& digits, int max, const char* what, const std::string& path) {
  const std::size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos)
    throw InputError(path + ": " + what + " 0 in the file name (expected " + what + " >= 1)");
  if (digits.size() - first > 9 || std::stoi(digits.substr(first)) > max)
    throw InputError(path + ": " + what + " " + excerpt(digits.substr(first)) + " in the file name is more than " +
                     std::to_string(max) + " (remove the file, or rename it to a smaller " + what + ")");
  return std::stoi(digits.substr(first));
}

// communication's gradient_allreduce_ms, gradient_bytes, all_reduce_calls and
// ranks into p, where the file has all four (older files have none; a file
// with some of them is refused, naming the first missing key).
void read_allreduce_calls(const ordered_json& c, const std::string& path, LayerProfile* p) {
  static const char* const kKeys[] = {"gradient_allreduce_ms", "gradient_bytes", "all_reduce_calls", "ranks"};
  int present = 0;
  for (const char* k : kKeys) present += c.contains(k) ? 1 : 0;
  if (present == 0) return;
  for (const char* k : kKeys)
    if (!c.contains(k))
      throw InputError(path + ": 'communication' has some of gradient_allreduce_ms, gradient_bytes, all_reduce_calls "
                       "and ranks but not '" + std::string(k) + "' (expected all four or none)");
  p->gradient_allreduce_ms =
      require_number(c, "gradient_allreduce_ms", path, "communication", rules::positive_up_to(kMaxProfileMs));
  p->gradient_bytes = require_number(c, "gradient_bytes", path, "communication", rules::positive_up_to(1e15));
  p->all_reduce_calls =
      static_cast<int>(require_integer(c, "all_reduce_calls", path, "communication", rules::int_in(1, 1e6)));
  p->allreduce_ranks = static_cast<int>(require_integer(c, "ranks", path, "communication", rules::int_in(2, 1e6)));
}

// One profile file, read and checked: its LayerProfile (tp and bs from its
// name) and its JSON document. Throws InputError naming the file and key.
LayerProfile read_profile(const std::string& path, int tp, int bs, int num_layers, ordered_json* json) {
  const NumberRule positive_ms = rules::positive_up_to(kMaxProfileMs);
  const NumberRule non_negative_ms = rules::non_negative_up_to(kMaxProfileMs);
  const NumberRule non_negative_mb = rules::non_negative_up_to(kMaxProfileMb);
  const std::size_t max_layers = kMaxProfileLayers;
  LayerProfile p;
  p.path = path;
  p.tp = tp;
  p.bs = bs;
  ordered_json& j = *json;
  j = read_json_file(path);
  const ordered_json& et = require_key(j, "execution_time", path, "");
  p.layer_ms = require_number_list(et, "layer_compute_total_ms", path, "execution_time", positive_ms, max_layers);
  p.forward_backward_ms = require_number(et, "forward_backward_time_ms", path, "execution_time", positive_ms);
  const ordered_json& em = require_key(j, "execution_memory", path, "");
  p.memory_mb =
      require_number_list(em, "layer_memory_total_mb", path, "execution_memory", non_negative_mb, max_layers);
  if (em.contains("framework_mb"))
    p.framework_mb = require_number(em, "framework_mb", path, "execution_memory", non_negative_mb);
  if (et.contains("optimizer_time_ms"))
    p.optimizer_ms = require_number(et, "optimizer_time_ms", path, "execution_time", non_negative_ms);
  if (p.layer_ms.empty()) throw InputError(path + ": 'execution_time.layer_compute_total_ms' is empty");
  // One memory entry per layer, or one fewer (Metis's samples; the last layer then counts 0 MB, see profile.h).
  if (p.memory_mb.size() != p.layer_ms.size() && p.memory_mb.size() + 1 != p.layer_ms.size())
    throw InputError(path + ": 'execution_memory.layer_memory_total_mb' has " + std::to_string(p.memory_mb.size()) +
                     " entries, expected one per layer (" + std::to_string(p.layer_ms.size()) +
                     ", as 'execution_time.layer_compute_total_ms' has) or one fewer (the last layer then counts 0 MB, "
                     "as in Metis)");
  if (et.contains("sustained_forward_backward_ms"))
    p.sustained_fb_ms = require_number(et, "sustained_forward_backward_ms", path, "execution_time", positive_ms);
  if (j.contains("communication") && j["communication"].is_object() &&
      j["communication"].contains("allreduce_busbw_gbs")) {
    // A measurement, not a datasheet figure: CPU (Gloo) runs measure a few MB/s, so only
    // positivity and the upper end of the clusterfile rule apply.
    p.allreduce_busbw_gbs = require_number(j["communication"], "allreduce_busbw_gbs", path, "communication",
                                           rules::positive_up_to(1e4));
    read_allreduce_calls(j["communication"], path, &p);
  }
  // section.key, if present: one number per layer (as many as layer_compute_total_ms has), each by `rule`.
  auto per_layer = [&](const ordered_json& section, const char* section_name, const char* key, const NumberRule& rule,
                       std::vector<double>* out) {
    if (!section.contains(key)) return;
    *out = require_number_list(section, key, path, section_name, rule, max_layers);
    if (out->size() != p.layer_ms.size())
      throw InputError(path + ": '" + section_name + "." + key + "' has " + std::to_string(out->size()) +
                       " entries, expected one per layer (" + std::to_string(p.layer_ms.size()) + ")");
  };
  per_layer(em, "execution_memory", "layer_activation_mb", non_negative_mb, &p.activation_mb);
  per_layer(em, "execution_memory", "layer_working_mb", non_negative_mb, &p.working_mb);
  if (p.activation_mb.empty() != p.working_mb.empty())
    throw InputError(path + ": 'execution_memory' has one of 'layer_activation_mb' and 'layer_working_mb' but not "
                     "the other (expected both or neither)");
  for (const char* key : {"attention", "recompute"}) {
    if (!em.contains(key)) continue;
    const std::string where = key_where(path, std::string("execution_memory.") + key);
    if (!em[key].is_string()) throw InputError(where + " must be a string");
    const std::string v = em[key].get<std::string>();
    if (std::string(key) == "recompute") {
      p.recompute = parse_recompute(v, where);
    } else if (v == "fused" || v == "materialized") {
      p.attention = v;
    } else {
      throw InputError(where + ": '" + excerpt(v) + "': expected fused or materialized");
    }
  }
  if (em.contains("state_bytes_per_parameter"))
    p.state_bytes_per_parameter = require_number(em, "state_bytes_per_parameter", path, "execution_memory",
                                                 rules::positive_up_to(64));
  per_layer(et, "execution_time", "layer_forward_ms", non_negative_ms, &p.forward_ms);
  per_layer(et, "execution_time", "layer_grad_accumulation_ms", non_negative_ms, &p.grad_accumulation_ms);
  if (num_layers > 0 && static_cast<int>(p.layer_ms.size()) != num_layers)
    throw InputError(path + ": expected " + std::to_string(num_layers) +
                     " entries in 'execution_time.layer_compute_total_ms' (--num_layers), found " +
                     std::to_string(p.layer_ms.size()));
  return p;
}

}  // namespace

bool parse_profile_name(const std::string& name, ProfileName& out) {
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  const auto alnum = [&](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || digit(c); };  // ASCII
  std::size_t i = 0;
  const auto literal = [&](const char* lit) {
    const std::size_t n = std::char_traits<char>::length(lit);
    if (name.compare(i, n, lit) != 0) return false;
    i += n;
    return true;
  };
  const auto span = [&](auto pred) {
    const std::size_t from = i;
    while (i < name.size() && pred(name[i])) ++i;
    return name.substr(from, i - from);
  };
  if (!literal("DeviceType.") || i >= name.size() || !alnum(name[i])) return false;
  out.type = span([&](char c) { return alnum(c) || c == '-'; });
  if (!literal("_tp")) return false;
  out.tp_digits = span(digit);
  if (out.tp_digits.empty() || !literal("_bs")) return false;
  out.bs_digits = span(digit);
  return !out.bs_digits.empty() && literal(".json") && i == name.size();
}

namespace {

// The model keys a profile records, where present (ModelProfile's hidden_size, ...).
void record_profiled_model(const ordered_json& model, const std::string& path, ModelProfile& out) {
  auto count = [&](const char* key, long long& v) {
    if (model.contains(key) && !model[key].is_null())
      v = require_integer(model, key, path, "model", rules::int_in(1, 1e12));
  };
  count("hidden_size", out.hidden_size);
  count("sequence_length", out.sequence_length);
  count("vocab_size", out.vocab_size);
  count("num_heads", out.num_heads);
  count("num_kv_heads", out.num_kv_heads);
  count("ffn_hidden_size", out.ffn_hidden_size);
  if (model.contains("family") && model["family"].is_string()) out.family = model["family"].get<std::string>();
}

}  // namespace

ProfileSet ProfileSet::load(const std::string& dir, int num_layers, int threads) {
  // Every entry named like a profile is read: one that is a directory, a FIFO or a symlink loop is
  // refused by its reader (base/file_access.h), not taken for a missing profile.
  std::vector<std::string> names = list_directory(dir, "profile folder");
  std::sort(names.begin(), names.end());

  // The profiles in name order, up to the first name that repeats another's (device, tp, bs): its
  // error comes after those of the files before it, as a reading in order would give them.
  struct File {
    std::string type, path;
    int tp = 0, bs = 0;
    LayerProfile profile;
    ordered_json json;
    std::exception_ptr error;
  };
  std::vector<File> files;
  std::exception_ptr name_error;
  std::map<std::tuple<std::string, int, int>, std::string> seen;
  for (const auto& name : names) {
    ProfileName m;
    if (name.size() > 200 || !parse_profile_name(name, m)) continue;  // other files (READMEs, notes) are not profiles
    File f;
    f.type = m.type;
    f.path = (fs::path(dir) / name).string();
    try {
      f.tp = name_number(m.tp_digits, kMaxProfileTp, "tp", f.path);
      f.bs = name_number(m.bs_digits, kMaxProfileBs, "bs", f.path);
      auto [it, fresh] = seen.emplace(std::make_tuple(m.type, f.tp, f.bs), f.path);
      if (!fresh)
        throw InputError(f.path + ": the same device, tp and bs as " + it->second + " (keep one of the two files)");
    } catch (const InputError&) {
      name_error = std::current_exception();
      break;
    }
    files.push_back(std::move(f));
  }

  // Read and check the files, `threads` at a time (each thread takes the next file).
  std::atomic<std::size_t> next{0};
  auto read_some = [&] {
    for (std::size_t i = next.fetch_add(1); i < files.size(); i = next.fetch_add(1)) {
      File& f = files[i];
      try {
        f.profile = read_profile(f.path, f.tp, f.bs, num_layers, &f.json);
        // Only a tp1_bs1 file's document is read again below (the model-level values); the others are
        // freed here, by the thread that read them, not one after the other at the end.
        if (f.tp != 1 || f.bs != 1) f.json = ordered_json();
      } catch (...) {
        f.error = std::current_exception();
      }
    }
  };
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::size_t helpers = std::min<std::size_t>(threads - 1, files.size() / 8);
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < helpers; ++t) pool.emplace_back(read_some);
  read_some();
  for (auto& t : pool) t.join();

  const NumberRule non_negative_ms = rules::non_negative_up_to(kMaxProfileMs);
  const std::size_t max_layers = kMaxProfileLayers;
  ProfileSet set;
  set.dir_ = dir;
  const std::string probe = (fs::path(dir) / kOverlapProbeFile).string();
  if (std::find(names.begin(), names.end(), kOverlapProbeFile) != names.end())
    set.set_overlap_slowdowns(read_overlap_probe(probe));
  for (File& f : files) {
    if (f.error) std::rethrow_exception(f.error);
    set.add(f.type, std::move(f.profile));
  }
  if (name_error) std::rethrow_exception(name_error);
  if (set.entries_.empty())
    throw InputError(dir + ": no profile files (expected files named DeviceType.<TYPE>_tp<T>_bs<B>.json)");

  set.rebuild_index();
  const std::string first_type = set.types_.front();
  const LayerProfile* first = set.find(0, 1, 1);
  if (!first)
    throw InputError(set.expected_path(0, 1, 1) +
                     ": missing; the model-level values come from the tp1_bs1 file of the first device type (" +
                     first_type + ")");
  for (const File& p : files) {
    if (p.path != first->path) continue;
    const ordered_json& et = require_key(p.json, "execution_time", p.path, "");
    const double opt = require_number(et, "optimizer_time_ms", p.path, "execution_time", non_negative_ms);
    const double bg = require_number(et, "batch_generator_time_ms", p.path, "execution_time", non_negative_ms);
    const ordered_json& params = require_key(require_key(p.json, "model", p.path, ""), "parameters", p.path, "model");
    std::vector<double> per_layer = require_number_list(params, "parameters_per_layer_bytes", p.path, "model.parameters",
                                                        rules::non_negative_up_to(1e15), max_layers + 2);
    if (per_layer.size() < 2)
      throw InputError(p.path + ": 'model.parameters.parameters_per_layer_bytes' needs at least 2 entries");
    set.finalize(p.path, opt, bg, std::move(per_layer));
    record_profiled_model(require_key(p.json, "model", p.path, ""), p.path, set.model_);
  }
  return set;
}

// ---------------------------------------------------------------- holes

namespace {

// Whether `has(v)` holds for a value of `values` below `v` and for one above it.
template <class Has>
bool surrounded(const std::vector<int>& values, int v, Has has) {
  bool below = false, above = false;
  for (int x : values) {
    if (x < v) below = below || has(x);
    if (x > v) above = above || has(x);
  }
  return below && above;
}

}  // namespace

std::vector<ProfileHole> ProfileSet::holes() const {
  std::vector<int> tps, bss;
  for (const auto& e : entries_) {
    tps.push_back(e.tp);
    bss.push_back(e.bs);
  }
  for (auto* v : {&tps, &bss}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  std::vector<ProfileHole> out;
  for (int type = 0; type < static_cast<int>(types_.size()); ++type)
    for (int tp : tps)
      for (int bs : bss) {
        if (find(type, tp, bs)) continue;
        if (surrounded(bss, bs, [&](int b) { return find(type, tp, b) != nullptr; }) ||
            surrounded(tps, tp, [&](int t) { return find(type, t, bs) != nullptr; }))
          out.push_back({type, tp, bs});
      }
  return out;
}

std::string ProfileSet::holes_message(const std::vector<ProfileHole>& holes) const {
  std::string out;
  for (const auto& h : holes) {
    if (!out.empty()) out += ", ";
    out += expected_path(h.type, h.tp, h.bs) + " (device " + types_[h.type] + ", tp " + std::to_string(h.tp) +
           ", bs " + std::to_string(h.bs) + ")";
  }
  return out;
}

InputError unknown_device_type(const Cluster& cluster, const ProfileSet& profiles, const std::string& name) {
  std::string found;
  for (const auto& n : profiles.device_types()) found += (found.empty() ? "" : ", ") + n;
  std::string where = cluster.clusterfile_path();
  for (const auto& e : cluster.clusterfile())
    if (e.instance_type == name) {
      where += ": key '" + excerpt(e.ip) + ".instance_type'";
      break;
    }
  return InputError(where + ": unknown device type '" + excerpt(name) + "': expected profiles DeviceType." +
                    excerpt(name) + "_tp<T>_bs<B>.json in " + profiles.dir() + ", which has types: " + excerpt(found));
}

}  // namespace hetplan
