// GpuSpec: the GPU catalogue, datasheet numbers of the GPUs hetplan can
// estimate without measuring. One home: sim/data/gpus.json, embedded into the
// binary at build time (CMake generates the header that holds it), so an
// installed hetplan needs no file; `--gpu-spec FILE` adds or overrides entries
// (load_gpu_spec_file). Every reader of GPU numbers (gen-profiles --analytic,
// whatif, the simulators' MFU and HBM terms, replay's MFU, the profiler's
// device name) asks this table.
//
// Peaks are dense (no 2:4 sparsity) TFLOP/s per ComputePrecision the chip
// runs; 0 means the chip does not have it, and require_peak() refuses such a
// precision with an InputError naming the GPU and what it supports.
//
// Names match case-insensitively, ignoring '-', '_' and spaces ("RTX 5090",
// "rtx5090" and "RTX-5090" are one GPU), against each entry's name and aliases.
//
// Thread-safety: load_gpu_spec_file mutates the catalogue; call it at start-up
// before any lookup (the CLI does, while parsing). Lookups are then read-only.
// Entries live in stable storage: a GpuSpec pointer stays valid for the
// process (an override replaces the entry's values in place).
#pragma once

#include <array>
#include <string>
#include <vector>

namespace hetplan {

enum class ComputePrecision { kFp32 = 0, kTf32, kFp16, kBf16, kFp8, kInt8 };
inline constexpr int kNumComputePrecisions = 6;
const char* to_string(ComputePrecision p);
// "fp32", "tf32", "fp16", "bf16", "fp8", "int8"; throws InputError naming `where`.
ComputePrecision parse_compute_precision(const std::string& s, const std::string& where);

struct GpuSpec {
  std::string name;
  std::vector<std::string> aliases;
  std::array<double, kNumComputePrecisions> peak{};  // dense TFLOP/s (TOP/s for int8); 0: not supported
  double peak_tflops = 0;    // the 16-bit training peak: bf16, or fp16 where the chip has no bf16 (V100)
  double memory_gb = 0;      // GPU memory
  double memory_bw_gbs = 0;  // GPU memory bandwidth, GB/s
  double nvlink_gbs = 0;     // GPU-to-GPU link inside a node, per direction, GB/s (NVLink, Infinity Fabric or PCIe)
  double host_link_gbs = 0;  // PCIe to the host, per direction, GB/s (nominal)
  int sm_count = 0;          // SMs (NVIDIA) or compute units (AMD)
  std::string base;          // an emulated type's full GPU (a base restricted to sm_count SMs); empty otherwise
  std::string source_title, source_url;  // the datasheet
  // On-demand rental price, USD per GPU-hour (0: none in the catalogue), and where it comes from (a public
  // cloud's list price for an instance of these GPUs, divided by its GPU count, with the date read).
  // A clusterfile's price_per_gpu_hour overrides it (Cluster::price_per_gpu_hour).
  double price_per_gpu_hour = 0;
  std::string price_source;
  double peak_of(ComputePrecision p) const { return peak[static_cast<int>(p)]; }
  bool supports(ComputePrecision p) const { return peak_of(p) > 0; }
  std::string supported() const;  // "fp32, fp16"
};

// Every entry, the embedded ones (in file order) then those a --gpu-spec file added.
const std::vector<const GpuSpec*>& gpu_specs();
// nullptr if unknown.
const GpuSpec* find_gpu_spec(const std::string& name);
// The entry, or InputError "<where>: '<name>': unknown GPU; known: V100, A100-40GB, ...".
const GpuSpec& require_gpu_spec(const std::string& name, const std::string& where);
// Peak FLOP/s (not TFLOP/s) at `p`, or InputError
// "<where>: <GPU> has no fp8 (it supports fp32, fp16; <datasheet>)".
double require_peak(const GpuSpec& g, ComputePrecision p, const std::string& where);
// "V100, A100-40GB, ..." for messages and help.
std::string gpu_names();
// The embedded catalogue's text (sim/data/gpus.json).
const char* embedded_gpu_catalogue_json();
// Adds or overrides entries from a JSON file ({"gpus": [...]} or one entry; the
// form of sim/data/gpus.json). Throws InputError naming the file and key.
void load_gpu_spec_file(const std::string& path);

// Reads `path` as load_gpu_spec_file does, into a fresh copy of the embedded catalogue, leaving the
// shared catalogue unchanged; returns the number of entries. Throws InputError as load_gpu_spec_file.
// For tests and fuzzing.
std::size_t check_gpu_spec_file(const std::string& path);
// The entry whose name or alias occurs in a device description such as
// "NVIDIA H100 80GB HBM3" or "AMD Instinct MI210" (the longest match), nullptr if none.
const GpuSpec* match_device_description(const std::string& description);

}  // namespace hetplan
