#include "sim/cluster.h"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>

#include "base/checked.h"
#include "base/file_access.h"
#include "sim/gpu_specs.h"
#include "base/input_error.h"
#include "base/json_util.h"

namespace hetplan {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

namespace {

// Reads one line into `line`. Stops after `max_chars` characters with
// *too_long set, leaving the rest unread (the caller refuses the file).
// Returns false at end of file.
bool read_line(std::istream& in, std::string& line, std::size_t max_chars, bool* too_long) {
  line.clear();
  *too_long = false;
  std::streambuf* buf = in.rdbuf();
  bool any = false;
  for (int c; (c = buf->sbumpc()) != std::char_traits<char>::eof();) {
    any = true;
    if (c == '\n') return true;
    if (line.size() == max_chars) {
      *too_long = true;
      return true;
    }
    line += static_cast<char>(c);
  }
  return any;
}

}  // namespace

std::vector<std::pair<std::string, int>> parse_hostfile(const std::string& path) {
  std::istringstream in(read_regular_file(path, kMaxHostfileBytes, "hostfile"));
  std::vector<std::pair<std::string, int>> hosts;
  std::string raw;
  int line_no = 0;
  long long total = 0;
  bool too_long = false;
  while (read_line(in, raw, kMaxHostfileLineChars, &too_long)) {
    if (line_no == std::numeric_limits<int>::max())
      throw InputError(path + ": more than " + std::to_string(line_no) + " lines");
    ++line_no;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    if (too_long)
      throw InputError(where + "line is longer than " + std::to_string(kMaxHostfileLineChars) +
                       " characters (expected '<ip> slots=<N>'), starts '" + excerpt(raw) + "'");
    std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    std::istringstream ss(line);
    std::string ip, slots_tok, extra;
    ss >> ip >> slots_tok;
    if (slots_tok.rfind("slots=", 0) != 0 || (ss >> extra))
      throw InputError(where + "expected '<ip> slots=<N>', got '" + excerpt(line) + "'");
    const std::string digits = slots_tok.substr(6);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit))
      throw InputError(where + "expected a positive integer after 'slots=', got '" + excerpt(slots_tok) + "'");
    const std::size_t first = digits.find_first_not_of('0');
    if (first == std::string::npos) throw InputError(where + "expected slots >= 1, got " + excerpt(digits));
    if (digits.size() - first > 9 || std::stoi(digits.substr(first)) > kMaxSlotsPerNode)
      throw InputError(where + "slots=" + excerpt(digits) + " is more than " + std::to_string(kMaxSlotsPerNode) +
                       " GPUs per node (expected at most " + std::to_string(kMaxSlotsPerNode) +
                       "; split the node into several lines of the same ip)");
    const int slots = std::stoi(digits.substr(first));
    total += slots;
    if (total > kMaxClusterGpus)
      throw InputError(where + "the hostfile lists more than " + std::to_string(kMaxClusterGpus) +
                       " GPUs by this line; hetplan plans for at most " + std::to_string(kMaxClusterGpus) +
                       " (list fewer nodes)");
    hosts.emplace_back(ip, slots);
  }
  if (hosts.empty()) throw InputError(path + ": hostfile lists no nodes (expected lines '<ip> slots=<N>')");
  return hosts;
}

namespace {

const char* const kDeviceTypeShape = "{\"emulate\": {\"base\": \"<GPU type>\", \"sms\": <N>}}";

// The clusterfile's "device_types" section (sim/cluster.h), validated: each
// type a non-empty name whose value is exactly {"emulate": {"base", "sms"}},
// the base a plain type other than itself.
std::vector<std::pair<std::string, EmulatedDevice>> read_device_types(const ordered_json& j, const std::string& path) {
  std::vector<std::pair<std::string, EmulatedDevice>> out;
  const auto section = j.find(kDeviceTypesKey);
  if (section == j.end()) return out;
  const std::string where = kDeviceTypesKey;
  if (!section->is_object())
    throw InputError(key_where(path, where) + " must be an object mapping device type names to " + kDeviceTypeShape);
  for (auto t = section->begin(); t != section->end(); ++t) {
    const std::string& name = t.key();
    const std::string tw = where + "." + name;
    if (name.empty()) throw InputError(key_where(path, tw) + ": expected a non-empty device type name");
    if (!t.value().is_object()) throw InputError(key_where(path, tw) + " must be an object " + kDeviceTypeShape);
    for (auto k = t.value().begin(); k != t.value().end(); ++k)
      if (k.key() != "emulate")
        throw InputError(key_where(path, tw + "." + k.key()) + " is not a device type property (expected only 'emulate')");
    const ordered_json& em = require_key(t.value(), "emulate", path, tw);
    const std::string ew = tw + ".emulate";
    if (!em.is_object()) throw InputError(key_where(path, ew) + " must be an object {\"base\": \"<GPU type>\", \"sms\": <N>}");
    for (auto k = em.begin(); k != em.end(); ++k)
      if (k.key() != "base" && k.key() != "sms")
        throw InputError(key_where(path, ew + "." + k.key()) + " is not an emulation property (expected 'base' and 'sms')");
    const ordered_json& base = require_key(em, "base", path, ew);
    if (!base.is_string() || base.get<std::string>().empty())
      throw InputError(key_where(path, ew + ".base") + " must name the GPU type emulated (a non-empty string, e.g. \"H200\")");
    EmulatedDevice d;
    d.base = base.get<std::string>();
    if (d.base == name)
      throw InputError(key_where(path, ew + ".base") + " is '" + excerpt(name) +
                       "' itself; expected the real GPU type it restricts");
    d.sms = static_cast<int>(require_integer(em, "sms", path, ew, rules::int_in(1, kMaxEmulatedSms)));
    out.emplace_back(name, d);
  }
  for (const auto& [name, d] : out)
    for (const auto& [other, unused] : out)
      if (d.base == other)
        throw InputError(key_where(path, where + "." + name + ".emulate.base") + " is '" + excerpt(d.base) +
                         "', which is itself emulated; expected a real GPU type");
  return out;
}

std::vector<ClusterfileEntry> parse_clusterfile_and_types(const std::string& path,
                                                          std::vector<std::pair<std::string, EmulatedDevice>>* types) {
  const ordered_json j = read_json_file(path);
  if (!j.is_object()) throw InputError(path + ": expected a JSON object keyed by node ip");
  *types = read_device_types(j, path);
  const auto declared = [&](const std::string& name) -> const EmulatedDevice* {
    for (const auto& [n, d] : *types)
      if (n == name) return &d;
    return nullptr;
  };
  std::vector<ClusterfileEntry> out;
  std::vector<bool> memory_given;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == kDeviceTypesKey) continue;
    ClusterfileEntry e;
    e.ip = it.key();
    const ordered_json& v = it.value();
    const ordered_json& type = require_key(v, "instance_type", path, e.ip);
    if (!type.is_string() || type.get<std::string>().empty())
      throw InputError(key_where(path, e.ip + ".instance_type") + " must be a device type name (a non-empty string)");
    e.instance_type = type.get<std::string>();
    if (const EmulatedDevice* d = declared(e.instance_type)) e.emulate = *d;
    // Bandwidths are checked against their unit by check_clusterfile_bandwidths (sim/network.h).
    e.inter_bandwidth = require_number(v, "inter_bandwidth", path, e.ip, rules::kPositive);
    e.intra_bandwidth = require_number(v, "intra_bandwidth", path, e.ip, rules::kPositive);
    memory_given.push_back(!e.emulate || v.contains("memory"));
    if (memory_given.back())
      e.memory_gb = require_number(v, "memory", path, e.ip, rules::positive_up_to(kMaxGpuMemoryGb));
    if (v.contains("price_per_gpu_hour")) {
      e.price_per_gpu_hour =
          require_number(v, "price_per_gpu_hour", path, e.ip, rules::non_negative_up_to(kMaxGpuPricePerHour));
      for (const auto& b : out)
        if (b.instance_type == e.instance_type && b.price_per_gpu_hour >= 0 && b.price_per_gpu_hour != e.price_per_gpu_hour)
          throw InputError(key_where(path, e.ip + ".price_per_gpu_hour") + " is " + format_number(e.price_per_gpu_hour) +
                           " but entry '" + excerpt(b.ip) + "' of the same type '" + excerpt(e.instance_type) +
                           "' gives " + format_number(b.price_per_gpu_hour) +
                           "; expected one price per device type (USD per GPU-hour)");
    }
    out.push_back(e);
  }
  // An emulated type has its base GPU's memory: the base's first entry, else its datasheet.
  for (std::size_t i = 0; i < out.size(); ++i) {
    ClusterfileEntry& e = out[i];
    if (!e.emulate) continue;
    const std::string& base = e.emulate->base;
    double base_gb = -1;
    std::string source;
    for (const auto& b : out)
      if (b.instance_type == base) {
        base_gb = b.memory_gb;
        source = "its entry '" + excerpt(b.ip) + "'";
        break;
      }
    if (base_gb < 0) {
      if (const GpuSpec* spec = find_gpu_spec(base)) {
        base_gb = spec->memory_gb;
        source = "its datasheet";
      }
    }
    if (base_gb < 0) {
      std::string known;
      for (const auto& s : gpu_specs()) known += (known.empty() ? "" : ", ") + s->name;
      throw InputError(key_where(path, std::string(kDeviceTypesKey) + "." + e.instance_type + ".emulate.base") + " is '" +
                       excerpt(base) + "', which has no node entry in this file and is not a GPU hetplan knows (" +
                       known + "), so the memory of '" + excerpt(e.instance_type) +
                       "' is unknown; expected a base type with an entry");
    }
    if (memory_given[i] && e.memory_gb != base_gb)
      throw InputError(key_where(path, e.ip + ".memory") + " is " + format_number(e.memory_gb) + " GB, but '" +
                       excerpt(e.instance_type) + "' emulates '" + excerpt(base) + "', which has " +
                       format_number(base_gb) + " GB (" + source +
                       "); expected that, or no 'memory' key (an emulated type has its base GPU's memory)");
    e.memory_gb = base_gb;
  }
  return out;
}

}  // namespace

std::vector<ClusterfileEntry> parse_clusterfile(const std::string& path) {
  std::vector<std::pair<std::string, EmulatedDevice>> types;
  return parse_clusterfile_and_types(path, &types);
}

std::vector<std::pair<std::string, EmulatedDevice>> parse_emulated_device_types(const std::string& path) {
  std::vector<std::pair<std::string, EmulatedDevice>> types;
  parse_clusterfile_and_types(path, &types);
  return types;
}

Cluster Cluster::load(const std::string& hostfile_path, const std::string& clusterfile_path) {
  return from_parts(parse_hostfile(hostfile_path), parse_clusterfile(clusterfile_path), hostfile_path,
                    clusterfile_path);
}

Cluster Cluster::from_parts(const std::vector<std::pair<std::string, int>>& hosts,
                            const std::vector<ClusterfileEntry>& clusterfile, const std::string& hostfile_name,
                            const std::string& clusterfile_name) {
  Cluster c;
  c.hostfile_path_ = hostfile_name;
  c.clusterfile_path_ = clusterfile_name;
  c.clusterfile_ = clusterfile;
  std::map<std::string, const ClusterfileEntry*> by_ip;
  for (const auto& e : clusterfile) by_ip[e.ip] = &e;

  std::vector<std::string> types;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    auto it = by_ip.find(hosts[i].first);
    if (it == by_ip.end()) {
      std::string known;
      for (const auto& e : clusterfile) known += (known.empty() ? "" : ", ") + e.ip;
      throw InputError(hostfile_name + ":" + std::to_string(i + 1) + ": host '" + excerpt(hosts[i].first) +
                       "' is not in clusterfile " + clusterfile_name + " (it lists: " + excerpt(known) + ")");
    }
    types.push_back(it->second->instance_type);
  }
  std::sort(types.begin(), types.end());
  types.erase(std::unique(types.begin(), types.end()), types.end());
  c.device_types_ = types;

  const std::size_t nt = types.size();
  c.devices_of_type_.assign(nt, 0);
  c.first_intra_bw_.assign(nt, -1);
  c.min_intra_bw_.assign(nt, std::numeric_limits<double>::infinity());
  c.memory_mb_.assign(nt, -1);
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    const ClusterfileEntry& e = *by_ip[hosts[i].first];
    ClusterNode n;
    const auto total = checked_add(c.num_devices_, hosts[i].second);
    if (hosts[i].second < 1 || hosts[i].second > kMaxSlotsPerNode || !total || *total > kMaxClusterGpus)
      throw InputError(hostfile_name + ":" + std::to_string(i + 1) + ": expected 1 to " +
                       std::to_string(kMaxSlotsPerNode) + " GPUs per node and at most " +
                       std::to_string(kMaxClusterGpus) + " in all");
    n.ip = e.ip;
    n.type = c.type_index(e.instance_type);
    n.num_devices = hosts[i].second;
    n.intra_bandwidth = e.intra_bandwidth;
    n.inter_bandwidth = e.inter_bandwidth;
    n.hostfile_line = static_cast<int>(i + 1);
    c.nodes_.push_back(n);
    c.num_devices_ += n.num_devices;
    c.devices_of_type_[n.type] += n.num_devices;
    if (c.first_intra_bw_[n.type] < 0) c.first_intra_bw_[n.type] = n.intra_bandwidth;
    c.min_intra_bw_[n.type] = std::min(c.min_intra_bw_[n.type], n.intra_bandwidth);
  }
  c.price_per_gpu_hour_.assign(nt, -1);
  c.price_source_.assign(nt, "");
  for (const auto& e : clusterfile) {
    const int t = c.type_index(e.instance_type);
    if (t >= 0 && c.memory_mb_[t] < 0) c.memory_mb_[t] = e.memory_gb * 1024;
    if (t >= 0 && c.price_per_gpu_hour_[t] < 0 && e.price_per_gpu_hour >= 0) {
      c.price_per_gpu_hour_[t] = e.price_per_gpu_hour;
      c.price_source_[t] = "clusterfile " + (clusterfile_name.empty() ? std::string("entry") : clusterfile_name) +
                           " ('" + e.ip + "'.price_per_gpu_hour)";
    }
  }
  for (std::size_t t = 0; t < nt; ++t) {  // else the catalogue's (an emulated type's base's)
    if (c.price_per_gpu_hour_[t] >= 0) continue;
    const EmulatedDevice* em = c.emulation(types[t]);
    const GpuSpec* g = find_gpu_spec(em ? em->base : types[t]);
    if (g && g->price_per_gpu_hour > 0) {
      c.price_per_gpu_hour_[t] = g->price_per_gpu_hour;
      c.price_source_[t] = "GPU catalogue " + g->name + ": " + g->price_source;
    }
  }
  return c;
}

const EmulatedDevice* Cluster::emulation(const std::string& name) const {
  for (const auto& e : clusterfile_)
    if (e.instance_type == name && e.emulate) return &*e.emulate;
  return nullptr;
}

int Cluster::type_index(const std::string& name) const {
  auto it = std::lower_bound(device_types_.begin(), device_types_.end(), name);
  if (it == device_types_.end() || *it != name) return -1;
  return static_cast<int>(it - device_types_.begin());
}

std::vector<int> Cluster::type_indices(const std::vector<std::string>& names) const {
  std::vector<int> out;
  out.reserve(names.size());
  for (const auto& name : names) out.push_back(type_index(name));
  return out;
}

std::string make_hostfile(int n, const std::vector<std::string>& ips, int slots) {
  std::string out;
  const int reps = n / slots;  // floor, as gen_hostfile.py's n // 4
  for (const auto& ip : ips)
    for (int i = 0; i < reps; ++i) out += ip + " slots=" + std::to_string(slots) + "\n";
  return out;
}

}  // namespace hetplan
