// ProfileSet: per-layer forward+backward times and memory of one model, for
// each device type, tensor-parallel degree (tp) and micro-batch size (bs).
//
// It is read once from a folder of Metis-format files named
// DeviceType.<TYPE>_tp<T>_bs<B>.json (TYPE: letters, digits and hyphens, as
// an emulated type's "H200-33sm") and then answers lookups from plain
// arrays. Slice sums are summed left to right, so that a sum over layers
// [s, e) is the same double Python's sum(list[s:e]) gives.
//
// What the loader accepts (InputError naming the file and key otherwise):
// at most kMaxProfileLayers layers; tp in 1..kMaxProfileTp and bs in
// 1..kMaxProfileBs in the file name; layer times and forward_backward_time_ms
// in (0, kMaxProfileMs]; memory, framework_mb, optimizer and batch-generator
// times in [0, kMaxProfileMs or kMaxProfileMb]; allreduce_busbw_gbs by the
// bandwidth rule of sim/network.h. layer_memory_total_mb has one entry per
// layer, or one fewer: Metis's own sample profiles list 9 memory entries for
// 10 layers, and Metis sums a stage's memory as the Python slice
// sum(memory[start:end]), which stops at the list's end, so the last layer
// counts 0 MB; SliceSums clips the same way. Shorter or longer lists are refused.
//
// REQUIRES: type indices passed to lookups come from type_index() (not -1); find() answers
// null for a (type, tp, bs) the set lacks.
// Thread-safety: a ProfileSet is immutable once loaded; any number of threads may call its
// const members at once. It owns its data: pointers it returns live as long as the set.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "sim/dp_overlap.h"
#include "sim/memory_model.h"
#include "base/input_error.h"
#include "base/limits.h"
#include "sim/model_config.h"

namespace hetplan {

class Cluster;

// kMaxProfileLayers, kMaxProfileTp, kMaxProfileBs, kMaxProfileMs, kMaxProfileMb: base/limits.h.

// Left-to-right sums of a list, for every slice [s, e). Lists of up to
// kTabulatedLayers values keep every slice's sum in a table (n^2 / 2
// doubles, 0.5 MB at 256) and answer in O(1); longer ones sum the slice on
// each call (O(e - s)), in the same order, so the double is the same.
class SliceSums {
 public:
  static constexpr int kTabulatedLayers = 256;

  SliceSums() = default;
  explicit SliceSums(const std::vector<double>& values);
  // Python's sum(values[s:e]) for 0 <= s, e (clipped to the list, empty if s >= e).
  double operator()(int s, int e) const {
    if (e > n_) e = n_;
    if (s >= e) return 0.0;
    if (table_.empty()) return sum_slice(s, e);
    return table_[static_cast<std::size_t>(s) * (n_ + 1) + e];
  }
  int size() const { return n_; }

 private:
  double sum_slice(int s, int e) const;

  int n_ = 0;
  std::vector<double> table_;   // when n_ <= kTabulatedLayers
  std::vector<double> values_;  // otherwise
};

struct LayerProfile {
  std::string path;
  int tp = 0, bs = 0;
  std::vector<double> layer_ms;   // execution_time.layer_compute_total_ms
  double forward_backward_ms = 0;  // execution_time.forward_backward_time_ms
  double fb_sync_ms = 0;           // forward_backward_ms - sum(layer_ms): time outside the layers
  std::vector<double> memory_mb;   // execution_memory.layer_memory_total_mb
  // execution_memory.framework_mb: memory a rank holds outside the tensors
  // (CUDA context, library workspaces), as `hetplan profile` measures it; -1 if absent.
  double framework_mb = -1;
  // execution_time.optimizer_time_ms of this file (this tp's shard of the
  // whole model); -1 if absent.
  double optimizer_ms = -1;
  // hetplan extensions, empty when a file lacks them (Metis's own files do):
  // execution_time.layer_forward_ms, the forward part of layer_ms, and
  // execution_time.layer_grad_accumulation_ms, the time to add a layer's new
  // gradients into the ones an earlier micro-batch left (every micro-batch
  // but an iteration's first pays it).
  std::vector<double> forward_ms, grad_accumulation_ms;
  // communication.allreduce_busbw_gbs: the bus bandwidth (GB/s) of the
  // gradient all-reduce over this file's tp group of GPUs; -1 if absent.
  // It is gross: the measured time includes every call's latency.
  double allreduce_busbw_gbs = -1;
  // The measurement behind it (`hetplan profile` writes them; older files
  // lack them): communication.gradient_allreduce_ms for gradient_bytes in
  // all_reduce_calls calls over `ranks` GPUs; -1, -1, 0, 0 when absent.
  double gradient_allreduce_ms = -1, gradient_bytes = -1;
  int all_reduce_calls = 0, allreduce_ranks = 0;
  bool has_allreduce_calls() const {
    return gradient_allreduce_ms > 0 && gradient_bytes > 0 && all_reduce_calls >= 1 && allreduce_ranks >= 2;
  }
  // The bus bandwidth (GB/s) net of the calls' latency: the one at which a
  // network charging ring_latency_s per all-reduce call (2 (n - 1) hop
  // latencies on a ring of n) takes the measured time for the measured calls,
  // 2 (n - 1) / n x bytes / (time - calls x ring_latency_s). The gross figure
  // where the file lacks the calls, or where their latency alone reaches the
  // measured time (no bandwidth reproduces it); -1 if no figure at all.
  double net_allreduce_busbw_gbs(double hop_latency_s) const;
  // execution_time.sustained_forward_backward_ms: the whole model's pace when
  // run back to back (power-limited clocks); -1 if absent.
  double sustained_fb_ms = -1;
  // How much slower a GPU that never idles runs than the burst timings say
  // (>= 1; 1 without a sustained measurement).
  double sustained_ratio() const {
    return sustained_fb_ms > 0 && forward_backward_ms > 0 ? std::max(1.0, sustained_fb_ms / forward_backward_ms) : 1.0;
  }
  // execution_memory.layer_activation_mb / layer_working_mb (hetplan's
  // extensions; empty when absent): per layer and micro-batch of this file's
  // bs, the MB its forward stores until its backward, and the most its
  // forward or backward holds beyond that at any one moment.
  std::vector<double> activation_mb, working_mb;
  // execution_memory.attention / recompute / state_bytes_per_parameter, as
  // the profiler ran the layers ("", none and 0 when absent).
  std::string attention;
  Recompute recompute = Recompute::kNone;
  double state_bytes_per_parameter = 0;
  bool has_activation_split() const { return !activation_mb.empty(); }
  double total_layer_ms = 0;       // sum(layer_ms)
  SliceSums time, memory, forward_time, accumulation_time, activation;
  bool has_forward() const { return !forward_ms.empty(); }
  bool has_grad_accumulation() const { return !grad_accumulation_ms.empty(); }
  // The start-up latency in the first transformer block's (layer 1's) profiled forward: how much it
  // exceeds the median forward of the model's other blocks, which are the same layer. `hetplan profile`'s
  // chained layer-by-layer pass starts on an idle GPU and the embedding's few kernels leave it waiting
  // for the host to launch the first block's (0.26-1.0 ms in every profile of logs/validate; its backward
  // shows none). Neither the whole-model pass (forward_backward_ms: a file's layers summed exceed it,
  // fb_sync < 0, where the latency is larger than the pass's accumulation) nor a pipeline's first stage
  // (replay's traces: its forward is the embedding's and its blocks' median) pays it. ProfileSet::add
  // takes it out of forward_ms[1] and layer_ms[1] before fb_sync is derived, so a stage holding the
  // whole model still costs forward_backward_ms. 0 where a file has no forward split, fewer than two
  // blocks, or no excess.
  double first_block_startup_ms = 0;
};

// The first block's start-up latency in p's forward_ms (LayerProfile::first_block_startup_ms).
double first_block_startup_ms(const LayerProfile& p);

// Model-level values. Metis takes them from one file; we take them from
// DeviceType.<first type by name>_tp1_bs1.json, so they never depend on the
// order a folder is listed in.
struct ModelProfile {
  std::string path;
  double optimizer_ms = 0;  // 2 x execution_time.optimizer_time_ms, as Metis counts it
  double batch_generator_ms = 0;
  std::vector<double> parameters_per_layer_bytes;
  std::vector<double> norm_layer_duration;  // that file's layer times, each over their sum
  // The model the profiles were measured for, as that file's "model" object records it (`hetplan profile`
  // writes these keys; Metis's files and older ones do not): 0 or "" where not recorded.
  long long hidden_size = 0, sequence_length = 0, vocab_size = 0, num_heads = 0, num_kv_heads = 0;
  long long ffn_hidden_size = 0;
  std::string family;
};

// A profile file's name split into its parts: "DeviceType." TYPE "_tp" DIGITS
// "_bs" DIGITS ".json", TYPE a letter or digit then letters, digits and
// hyphens (an emulated type: H200-33sm, sim/cluster.h). parse_profile_name
// returns false for any other name. (A hand-written match: compiling the
// equivalent std::regex cost more than reading a profile folder.)
struct ProfileName {
  std::string type, tp_digits, bs_digits;
};
bool parse_profile_name(const std::string& name, ProfileName& out);

// A (type, tp, bs) the set has no file for although it has files on both
// sides of it: a smaller and a larger bs at that (type, tp), or a smaller and
// a larger tp at that (type, bs). A search plans around it in silence unless
// told (ProfileSet::holes).
struct ProfileHole {
  int type = 0, tp = 0, bs = 0;
  bool operator==(const ProfileHole&) const = default;
};

class ProfileSet {
 public:
  // Reads every DeviceType.*_tp*_bs*.json in `dir`. `num_layers` > 0 checks
  // that every file has that many layer times. Throws InputError: of the
  // files in name order, the first one's error, whatever `threads` is.
  // `threads` > 1 reads files on that many threads at once (this one and
  // threads - 1 started here, at most one per 8 files); 0: one per core.
  static ProfileSet load(const std::string& dir, int num_layers = 0, int threads = 1);

  const std::string& dir() const { return dir_; }
  // The compute stretch beside overlapped collectives measured on these GPUs: the folder's
  // comm_overlap.json (kOverlapProbeFile, scripts/gpu_overlap_probe.sh), read by load(); else the
  // defaults (kCommComputeSlowdown). load() throws InputError for a file that is there but malformed.
  const OverlapSlowdowns& overlap_slowdowns() const { return overlap_slowdowns_; }
  bool overlap_measured() const { return overlap_measured_; }
  void set_overlap_slowdowns(const OverlapSlowdowns& s) {
    overlap_slowdowns_ = s;
    overlap_measured_ = true;
  }
  const std::vector<std::string>& device_types() const { return types_; }
  int type_index(const std::string& name) const;  // -1 if absent
  const ModelProfile& model() const { return model_; }
  int num_layers() const { return num_layers_; }
  const std::vector<LayerProfile>& entries() const { return entries_; }

  // The files that price a share of `bs` samples at (type, tp), as Metis
  // slices it: the share's own file, else one file per set bit of bs (its
  // power-of-two slices, each at most max_profiled_bs). Writes them to
  // out[0..31] and returns how many; returns -1 if a slice has no file, with
  // *missing_bs set to that slice. REQUIRES: bs >= 1. Allocates nothing.
  int share_files(int type, int tp, int bs, int max_profiled_bs, const LayerProfile* out[32],
                  int* missing_bs = nullptr) const {
    if (const LayerProfile* p = find(type, tp, bs)) {
      out[0] = p;
      return 1;
    }
    int n = 0;
    for (int bit = 30; bit >= 0; --bit) {
      const int slice = 1 << bit;
      if (!(bs & slice)) continue;
      const LayerProfile* p = slice <= max_profiled_bs ? find(type, tp, slice) : nullptr;
      if (!p) {
        if (missing_bs) *missing_bs = slice;
        return -1;
      }
      out[n++] = p;
    }
    return n;
  }

  // nullptr if there is no file for (type, tp, bs).
  const LayerProfile* find(int type, int tp, int bs) const {
    if (type < 0 || tp < 0 || bs < 0 || tp > max_tp_ || bs > max_bs_ || index_.empty()) return nullptr;
    const int ti = tp_slot_[tp], bi = bs_slot_[bs];
    if (ti < 0 || bi < 0) return nullptr;
    const int idx = index_[(static_cast<std::size_t>(type) * num_tps_ + ti) * num_bss_ + bi];
    return idx < 0 ? nullptr : &entries_[idx];
  }
  // The framework constant (MB) measured for a device type (its tp1_bs1
  // file), or -1 if its profiles do not record one.
  double framework_mb(int type) const {
    const LayerProfile* p = find(type, 1, 1);
    return p ? p->framework_mb : -1;
  }
  // The framework constant (MB) of a device type at tensor-parallel degree
  // `tp` (NCCL's buffers grow with the group; a tp above the largest profiled
  // reads that one): from the smallest-bs file of that tp that records one,
  // else framework_mb(type), else the largest tp below it that has one; -1 if
  // none does.
  double framework_mb(int type, int tp) const;
  // The largest tp and bs of any file (0 before finalize()).
  int max_tp() const { return max_tp_; }
  int max_bs() const { return max_bs_; }
  // The file whose measured activations (layer_activation_mb) describe a
  // micro-batch of `bs` on (type, tp), to be scaled by bs / its bs: the
  // largest measured bs <= `bs`, else the smallest up to 2 bs; nullptr if none.
  const LayerProfile* activation_profile(int type, int tp, int bs) const;

  // The gradient all-reduce bus bandwidth (GB/s) measured among GPUs of a
  // device type: from its files of the largest tp that record one; -1 if none.
  // With hop_latency_s > 0, net of the measurement's per-call latency
  // (LayerProfile::net_allreduce_busbw_gbs), for a network model that charges
  // that latency per hop itself; 0: the gross figure as measured.
  double allreduce_busbw_gbs(int type, double hop_latency_s = 0) const;

  // Every hole of the set (ProfileHole), by type, tp and bs. Explaining path:
  // allocates; O(types x tps x bss x (tps + bss)).
  std::vector<ProfileHole> holes() const;
  // "<path> (device V100, tp 1, bs 2)" for each hole, joined by ", ".
  std::string holes_message(const std::vector<ProfileHole>& holes) const;

  // The file name a (type, tp, bs) lookup expects, for error messages.
  std::string expected_path(int type, int tp, int bs) const;
  // "<path>: missing profile (device V100, tp 4, bs 2), needed for <why>; ..."
  std::string missing_message(int type, int tp, int bs, const std::string& why) const;

  // Adds one profile (used by the loader and by tests that build sets in
  // memory); lookups see it after finalize().
  void add(const std::string& type, LayerProfile p);
  // Chooses the model-level profile (first type by name, tp1_bs1). Throws if absent.
  void finalize(const std::string& model_path, double optimizer_time_ms, double batch_generator_ms,
                std::vector<double> parameters_per_layer_bytes);

 private:
  void rebuild_index();

  std::string dir_;
  OverlapSlowdowns overlap_slowdowns_;
  bool overlap_measured_ = false;
  std::vector<std::string> types_;
  std::vector<std::string> entry_types_;
  std::vector<LayerProfile> entries_;
  // index_[(type * num_tps_ + tp_slot_[tp]) * num_bss_ + bs_slot_[bs]]: the
  // entry, or -1; the slots number the tp and bs values that occur, so the
  // index grows with the files, not with the largest tp or bs.
  std::vector<int> index_, tp_slot_, bs_slot_;
  int max_tp_ = -1, max_bs_ = -1;
  std::size_t num_tps_ = 0, num_bss_ = 0;
  int num_layers_ = 0;
  ModelProfile model_;
};

// The error both searches give for a cluster device type without profiles:
// it names the clusterfile key and the types the profile folder has.
InputError unknown_device_type(const Cluster& cluster, const ProfileSet& profiles, const std::string& name);

}  // namespace hetplan
