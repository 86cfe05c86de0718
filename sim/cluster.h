// Cluster: the GPUs a plan may use, read from a hostfile and a clusterfile.
//
// The hostfile lists nodes ("<ip> slots=<N>", one per line, in order); the
// clusterfile maps each ip to its instance type, bandwidths (GB/s, as Metis
// writes them) and per-GPU memory (GB). Device types are kept sorted by name,
// and a type is referred to by its index in that order everywhere else.
//
// Emulated device types. A clusterfile may declare, once, device types that
// are a real GPU restricted to N of its SMs (run inside a CUDA green context,
// profiler/green_context.h), under the reserved top-level key
// "device_types" (no node ip is spelled so):
//
//   "device_types": {"H200-33sm": {"emulate": {"base": "H200", "sms": 33}}}
//
// Node entries then name the type like any other ("instance_type":
// "H200-33sm"). An emulated type has its base GPU's memory: its entries may
// leave "memory" out (it is then the first clusterfile entry of the base
// type's, else the GpuSpec datasheet value, sim/gpu_specs.h), and one that
// gives it must give exactly that. The base must be a plain (not emulated)
// type; sms is an integer from 1 to kMaxEmulatedSms. The CUDA driver rounds
// the SM count up to its partition granularity (documented as multiples of 8
// SMs on H100/H200): the
// granted count is recorded where the type runs (profiles, replay reports),
// never assumed. The planner and the simulator treat an emulated type as any
// other type: its speed comes from its profiles.
//
// What a Cluster promises: nodes() in hostfile order, each with a valid
// device type index and 1 to kMaxSlotsPerNode GPUs, at most kMaxClusterGpus
// GPUs in all; every node's ip has a clusterfile entry; per-type numbers
// (memory_mb, first_intra_bandwidth, min_intra_bandwidth) exist for every
// type a node uses. Which global rank sits on which node is RankLayout's
// business (sim/rank_layout.h), for a chosen node sequence.
// REQUIRES: type indices passed in are in [0, device_types().size()).
// Thread-safety: immutable after load()/from_parts(); safe to share between
// threads. It stores no pointers to its inputs.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "base/limits.h"

namespace hetplan {

// Limits on what a cluster may be (kMaxSlotsPerNode, kMaxClusterGpus, ...) are in base/limits.h: beyond
// them the hostfile is refused with a message naming the limit.
// The clusterfile's reserved top-level key for device type declarations.
inline constexpr const char* kDeviceTypesKey = "device_types";

// A device type that is `base` restricted to `sms` SMs (see above).
struct EmulatedDevice {
  std::string base;  // a plain device type, e.g. "H200"
  int sms = 0;       // requested SMs, 1 to kMaxEmulatedSms
  bool operator==(const EmulatedDevice&) const = default;
};

struct ClusterNode {
  std::string ip;
  int type = 0;         // index into Cluster::device_types()
  int num_devices = 0;  // the hostfile's slots
  double intra_bandwidth = 0;
  double inter_bandwidth = 0;
  int hostfile_line = 0;
};

struct ClusterfileEntry {
  std::string ip;
  std::string instance_type;
  double inter_bandwidth = 0;
  double intra_bandwidth = 0;
  double memory_gb = 0;
  // Optional "price_per_gpu_hour" (USD per GPU-hour, 0 to kMaxGpuPricePerHour); -1 when not given.
  // Every entry of one type that gives it gives the same.
  double price_per_gpu_hour = -1;
  // Set when instance_type is declared emulated in the clusterfile's
  // "device_types" (the same declaration on every entry of that type).
  std::optional<EmulatedDevice> emulate = std::nullopt;
};

class Cluster {
 public:
  // Throws InputError naming the file and line or key on malformed input.
  static Cluster load(const std::string& hostfile_path, const std::string& clusterfile_path);

  // Builds a cluster from parsed parts (used by tests and generators).
  static Cluster from_parts(const std::vector<std::pair<std::string, int>>& hosts,
                            const std::vector<ClusterfileEntry>& clusterfile, const std::string& hostfile_name = "",
                            const std::string& clusterfile_name = "");

  const std::vector<std::string>& device_types() const { return device_types_; }
  const std::vector<ClusterNode>& nodes() const { return nodes_; }
  const std::vector<ClusterfileEntry>& clusterfile() const { return clusterfile_; }
  int num_devices() const { return num_devices_; }
  int num_devices_of(int type) const { return devices_of_type_[type]; }
  int type_index(const std::string& name) const;  // -1 if absent
  // type_index of each name, in order (a plan's node_sequence as RankLayout takes it): -1 for one absent.
  std::vector<int> type_indices(const std::vector<std::string>& names) const;
  // The emulation declared for device type `name` in the clusterfile, or
  // nullptr for a plain type (or a name no clusterfile entry uses).
  const EmulatedDevice* emulation(const std::string& name) const;

  // Per-GPU memory in MB of the first clusterfile entry of this type, in file
  // order (Metis reads it that way, whatever node the GPU sits in).
  double memory_mb(int type) const { return memory_mb_[type]; }
  // intra_bandwidth of the first hostfile node of this type.
  double first_intra_bandwidth(int type) const { return first_intra_bw_[type]; }
  // Smallest intra_bandwidth over the hostfile nodes of this type. Metis's
  // "inter-node" bandwidth is this number: its get_inter_bandwidth reads the
  // intra_bandwidth key (a reference bug the metis cost model keeps).
  double min_intra_bandwidth(int type) const { return min_intra_bw_[type]; }
  // USD per GPU-hour of this type: the clusterfile's price_per_gpu_hour, else the GPU catalogue's
  // (sim/gpu_specs.h; an emulated type's base's), else -1 (unknown).
  double price_per_gpu_hour(int type) const { return price_per_gpu_hour_[type]; }
  // Where that price comes from: "clusterfile", the catalogue's source, or "" when unknown.
  const std::string& price_source(int type) const { return price_source_[type]; }

  const std::string& hostfile_path() const { return hostfile_path_; }
  const std::string& clusterfile_path() const { return clusterfile_path_; }

 private:
  std::vector<std::string> device_types_;
  std::vector<ClusterNode> nodes_;
  std::vector<ClusterfileEntry> clusterfile_;
  std::vector<int> devices_of_type_;
  std::vector<double> memory_mb_, first_intra_bw_, min_intra_bw_, price_per_gpu_hour_;
  std::vector<std::string> price_source_;
  int num_devices_ = 0;
  std::string hostfile_path_, clusterfile_path_;
};

// Parses a hostfile: "<ip> slots=<N>" per line; blank lines and '#' comments
// are skipped. N may have several digits (the reference reads one). Refuses
// lines over kMaxHostfileLineChars, N over kMaxSlotsPerNode, and more than
// kMaxClusterGpus GPUs in all.
std::vector<std::pair<std::string, int>> parse_hostfile(const std::string& path);

// Parses a clusterfile. Memory must be in (0, kMaxGpuMemoryGb] GB and the
// bandwidths positive; their plausible range depends on the unit and is
// checked by check_clusterfile_bandwidths (sim/network.h). The reserved key
// "device_types" declares emulated types (above); its declarations are
// attached to the entries of those types (ClusterfileEntry::emulate), and an
// emulated entry's memory is its base's. Throws InputError naming the file,
// the key and what was expected.
std::vector<ClusterfileEntry> parse_clusterfile(const std::string& path);

// The emulated types a clusterfile declares, by name, without its nodes
// (for `hetplan profile --clusterfile`). Validated as parse_clusterfile does.
std::vector<std::pair<std::string, EmulatedDevice>> parse_emulated_device_types(const std::string& path);

// A hostfile of N GPUs per ip: for each ip in order, N/slots lines of
// "<ip> slots=<slots>". With ips {0.0.0.1, 0.0.0.4} and slots 4 this is the
// file the reference's gen_hostfile.py N writes.
std::string make_hostfile(int n, const std::vector<std::string>& ips, int slots);

}  // namespace hetplan
