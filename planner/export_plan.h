// Export: a plan handed to the framework that will train it.
//
// - Megatron-LM: the command-line arguments of pretrain_gpt.py for a plan
//   whose stages all run the same (dp, tp) (Megatron's rank grid is uniform;
//   the GPU types may differ, with an uneven layer split); anything else is an
//   InputError naming the stage and what differs, pointing to `--to torchrun`.
//   With them: CUDA_DEVICE_MAX_CONNECTIONS=1 where tp > 1 without FSDP,
//   --ckpt-format fsdp_dtensor with Megatron-FSDP (ZeRO-3), --fp16 with
//   dynamic loss scaling where a GPU lacks bf16, Llama-3.1's rope scaling,
//   and a torchrun launcher line.
// - DeepSpeed: a ds_config.json (batch keys, bf16 or fp16 where a GPU lacks
//   bf16, zero_optimization with the plan's offload devices,
//   activation_checkpointing, and the pipeline section for pipelined plans).
// - torchrun: for any plan, one launch script per node (hostfile line) of the
//   plan, each starting `hetplan replay` under torchrun with that node's
//   ranks; every path in it is relative to the script's folder.
//
// Every flag and key name comes from the framework's own parser, at the
// commit recorded below (megatron_flag_sources(), deepspeed_key_sources(),
// torchrun_flag_sources()); tests/test_export.cc checks that the exporter
// emits names from those lists only.
//
// Pure functions of their inputs; thread-safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/json_util.h"
#include "sim/model_shape.h"
#include "sim/parallel_layout.h"
#include "sim/plan_file.h"

namespace hetplan {

// What Megatron-LM and DeepSpeed need of a plan's grid, as predicates the search asks on its hot path
// (`search --uniform`; no strings, no allocation). export_megatron and export_deepspeed refuse a plan
// exactly where one of these is false (require_uniform, micro_batch_per_replica, the pipeline's ZeRO
// rule in export_plan.cc call them), so the search and the exporters agree by construction.
// Every stage runs stage 0's (dp, tp): their rank grids are uniform (GPU types and layer counts may differ).
inline bool exporter_grid_matches(Strategy stage0, Strategy stage) { return stage == stage0; }
// A micro-batch of `micro_batch` sequences splits evenly over dp (micro-batch size x dp x micro-batches = gbs).
inline bool exporter_micro_batch_splits(int micro_batch, int dp) { return dp > 0 && micro_batch % dp == 0; }
// DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only.
inline bool deepspeed_pipeline_zero_ok(int num_stages, int zero_stage) { return num_stages <= 1 || zero_stage <= 1; }

// Which exporters take `plan` as is, by running each (export_megatron, export_deepspeed, export_torchrun on
// `placement`) and keeping those that do not refuse it: a subset of {"megatron", "deepspeed", "torchrun"}, in
// that order. `refusals`, if given, receives each refusing exporter's one-line reason.
// REQUIRES: `placement` is the plan's (its cluster and node sequence).
std::vector<std::string> accepting_exporters(const PlanFile& plan, const ModelShape& shape,
                                             const ParallelLayout& placement,
                                             std::vector<std::pair<std::string, std::string>>* refusals = nullptr);

// Where a flag or key name was read: repository, commit and file.
struct NameSource {
  std::string name;  // "--bf16", "zero_optimization.stage", "--nproc-per-node"
  std::string repo, commit, file;
};
inline constexpr const char* kMegatronRepo = "NVIDIA/Megatron-LM";
inline constexpr const char* kMegatronCommit = "d98e8a64ddf34856e74b24714e3bedb2f5a39553";
inline constexpr const char* kDeepSpeedRepo = "deepspeedai/DeepSpeed";
inline constexpr const char* kDeepSpeedCommit = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641";
const std::vector<NameSource>& megatron_flag_sources();
const std::vector<NameSource>& deepspeed_key_sources();
const std::vector<NameSource>& torchrun_flag_sources();

// Megatron-LM arguments: flag and value ("" for a switch), in a fixed order.
struct MegatronArgs {
  std::vector<std::pair<std::string, std::string>> args;
  std::vector<std::string> notes;  // what the user must still decide (tokenizer, data)
  int world_size = 0;              // GPUs: pp * dp * tp
  std::vector<std::pair<std::string, std::string>> env;  // exported before the launch (CUDA_DEVICE_MAX_CONNECTIONS)
  std::string launcher;  // the torchrun line that starts pretrain_gpt.py with "${MEGATRON_ARGS[@]}"
};

// `placement`, if given, names each stage's GPU type (else the plan's node
// sequence must list one type). `where` prefixes errors (the plan's path).
// Throws InputError for a plan Megatron-LM cannot run as is.
MegatronArgs export_megatron(const PlanFile& plan, const ModelShape& shape, const ParallelLayout* placement,
                             const std::string& where);
// A bash script: the env exports, MEGATRON_ARGS=( ... ) (one flag per line, values quoted where the shell needs
// it) and the launcher line.
std::string megatron_args_text(const MegatronArgs& m, const std::string& header);

struct DeepSpeedConfig {
  ordered_json config;  // ds_config.json
  std::vector<std::string> notes;
};
DeepSpeedConfig export_deepspeed(const PlanFile& plan, const ModelShape& shape, const ParallelLayout* placement,
                                 const std::string& where);

// The plan's ranks node by node, a node being a hostfile line (two lines with one address are two nodes), nodes
// in the order of their lowest rank: what torchrun's --node-rank counts, and what replay's HETPLAN_NODE names.
inline std::vector<std::vector<int>> ranks_by_node(const ParallelLayout& placement) {
  std::vector<int> node_index;  // RankLayout node -> position in the result, -1 before its first rank
  std::vector<std::vector<int>> out;
  for (int r = 0; r < placement.num_ranks(); ++r) {
    const int n = placement.ranks().node_of(r);
    if (n >= static_cast<int>(node_index.size())) node_index.resize(n + 1, -1);
    if (node_index[n] < 0) {
      node_index[n] = static_cast<int>(out.size());
      out.emplace_back();
    }
    out[node_index[n]].push_back(r);
  }
  return out;
}

// One node's launch script.
struct HostLaunch {
  std::string host;      // the hostfile line's ip
  int node_rank = 0;     // nodes (hostfile lines) in order of their lowest rank (ranks_by_node)
  std::vector<int> ranks;  // plan ranks on the node, in rank order
  std::string file_name;   // "launch_<node_rank>_<host>.sh", the host through safe_file_name (base/file_access.h)
  std::string script;
};
struct TorchrunOptions {
  std::string plan_file = "plan.json";  // names inside the output folder, next to the scripts
  std::string hostfile = "hostfile", clusterfile = "clusterfile.json";
  std::string profile_dir;   // relative to the output folder, or empty (then replay splits micro-batches evenly)
  std::string rdzv_endpoint;  // host:port (--master); default: the host of node 0, port 29500
  std::string replay_args;    // appended to every `hetplan replay` (verbatim shell words)
};
// REQUIRES: `placement` is the plan's (its cluster and node sequence).
// Throws InputError when a tp group would span hosts.
std::vector<HostLaunch> export_torchrun(const PlanFile& plan, const ParallelLayout& placement,
                                        const TorchrunOptions& options, const std::string& where);

}  // namespace hetplan
