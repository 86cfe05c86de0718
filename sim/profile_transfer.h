// Profile transfer (`hetplan gen-profiles --from`): a measured profile set
// moved to other GPU types, for the same model and the same tp/bs grid.
//
// Each layer's time is re-priced by the layer time model
// (sim/layer_time_model.h): the kernel classes `hetplan profile` recorded
// (execution_time.kernel_classes) each scaled by the two GPUs' rates, the
// GEMMs one by one at their sizes. Rates come from probe files
// (gpu_probe.<TYPE>.json: `hetplan gpu-probe --out`) when both the source's
// and the target's are found (in the --from folder or --probes folders),
// else from the catalogue for both. A profile without kernel classes (older
// files, Metis's) is split into classes by the analytic model on the source
// GPU, each class then holding its share of the measured time.
// Derived from the layers: each layer's forward (its layer's ratio), the
// gradient accumulation and the optimizer step (memory-bound: the bandwidth
// ratio), the whole forward+backward and its sustained pace (the ratio of
// the layers' sums), the tp group's all-reduce bandwidth (the links').
// Memory carries over exactly (activations do not depend on the GPU; the
// framework constant is kept as measured). Each file says it was derived, from
// what and with which rates (profiler.transfer).
//
// Thread-safety: reads and writes files; no shared state.
#pragma once

#include <string>
#include <vector>

#include "sim/layer_time_model.h"

namespace hetplan {

struct TransferOptions {
  std::string from_dir, out_dir;
  std::string from_type;                 // empty: the folder's only device type
  std::vector<std::string> types;        // targets: catalogue GPUs or emulated "BASE-<N>sm"
  std::vector<std::string> probe_dirs;   // more folders to find gpu_probe.<TYPE>.json in
  RateDefaults defaults;
};

// Writes DeviceType.<T>_tp<X>_bs<Y>.json for each target T and each source
// file; returns the names written. Throws InputError naming the folder, file
// or key.
std::vector<std::string> transfer_profiles(const TransferOptions& options);

}  // namespace hetplan
