// PlanFile: one plan as `hetplan search --json` writes each entry of "top"
// (and "best"): the plan itself, plus the model, the global batch size and
// the cluster and profile paths it was searched with, so that `simulate` and
// `replay` can take it with no editing.
//
// It carries the model's exact shape (sim/model_shape.h; the key
// model.architecture) and the training setup the search costed (precision,
// ZeRO, offload, recompute, schedule; the sequence length is model's), so
// `simulate`, `export`, `replay` and `report` rebuild the same model with no
// --hf-config. A plan file written before the architecture was recorded still
// reads: plan_shape() falls back to the GPT shape of its model keys and says so.
//
// Plain values and pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>

#include "base/json_util.h"
#include "sim/dp_overlap.h"
#include "sim/model_config.h"
#include "sim/model_shape.h"
#include "sim/plan.h"

namespace hetplan {

struct PlanFile {
  PlanResult plan;
  ModelConfig model;
  int gbs = 0;
  std::string hostfile, clusterfile, profile_dir;  // may be empty
  // The training setting `search --cost-model sim` costed the plan with
  // (--zero/--recompute auto); -1 and "" when the file records none.
  int zero_stage = -1;
  std::string recompute;
  // The pipeline schedule the default search costed the plan with ("gpipe",
  // "1f1b" or "interleaved"); "" when the file records none.
  std::string schedule;
  // Model chunks per pipeline stage (Megatron's vp; key "virtual_stages"): > 1 only with the interleaved
  // schedule, stage i's layers then split as chunk_layers (sim/schedule.h) says. 1 when absent.
  int virtual_stages = 1;
  // The model's exact shape; absent in a plan file from before it was recorded.
  std::optional<ModelShape> shape;
  // The Hugging Face config's rope_scaling object, verbatim (Llama-3.1's); null when the model has none.
  ordered_json rope_scaling;
  // The precision the plan was costed at ("bf16", "fp16", "fp32", "fp8"); "" when the file records none.
  std::string precision;
  // ZeRO-Offload of the optimizer state, and of the 16-bit weights too (ZeRO-3), as costed.
  bool offload_optimizer = false, offload_params = false;
  // The model-state accounting ("zero", "deepspeed", "megatron", "fsdp2"); "" when the file records none.
  std::string accounting;
  // DeepSpeed's buffers and PyTorch DDP's buckets were counted (sim/offload.h, sim/runtime_overheads.h).
  bool deepspeed_buffers = false, ddp_buckets = false;
  // With ddp_buckets: at which of the second step's peaks DDP's old buckets were counted ("none", "activations",
  // "gradients", "both"; sim/runtime_overheads.h); "" when the file records none (the activations').
  std::string ddp_old_buckets;
  // Gradients allocated during the backward (TrainingSetup::grads_in_backward).
  bool grads_in_backward = false;
  // TrainingSetup::fp32_residual and eager_fp32_loss (whatif's PyTorch rows).
  bool fp32_residual = false, eager_fp32_loss = false;
  // Sequence parallelism with tp, the context-parallel size (carved from each stage's dp: Megatron's
  // dp is the plan's dp / cp) and overlapped data-parallel communication, as costed (keys
  // sequence_parallel, context_parallel, overlap.{grad_reduce, param_gather, grad_bucket_params,
  // param_bucket_params}; absent: off, 1, off).
  bool sequence_parallel = false;
  int context_parallel = 1;
  CommOverlap overlap;
  bool overlap_recorded = false;  // the file has the key 'overlap' (the default search writes it)
};

// The model.architecture object: every ModelShape field, by ModelShape's names, plus rope_scaling when not null.
ordered_json shape_to_json(const ModelShape& s, const ordered_json& rope_scaling);
// Reads model.architecture; InputError naming `file` and the key.
ModelShape shape_from_json(const ordered_json& j, const std::string& file);
// The rope_scaling object of a Hugging Face config.json (null when absent or null).
ordered_json hf_rope_scaling(const std::string& hf_config);

// The plan's model: its recorded architecture, or `hf_config`'s (which must then equal the recorded one: else an
// InputError naming the key and both values), or, for a plan file without one, the GPT shape of its model keys
// (and `*warning` says so in one line; else it is left empty). `plan_path` names the plan in messages.
ModelShape plan_shape(const PlanFile& f, const std::string& hf_config, const std::string& plan_path,
                      std::string* warning);

ordered_json model_to_json(const ModelConfig& m);
ModelConfig model_from_json(const ordered_json& j, const std::string& file);

ordered_json plan_to_json(const PlanResult& p);
ordered_json plan_file_to_json(const PlanFile& f);

// Reads a plan entry, or a whole search result (then its "best"). Checks that
// the plan is consistent (stage counts, layer partition, dp * tp = group
// size). Throws InputError naming the file and key. A relative hostfile,
// clusterfile or profile_dir is taken next to the plan file where that path
// exists, else as written (relative to the working directory).
PlanFile read_plan_file(const std::string& path);
PlanFile plan_file_from_json(const ordered_json& j, const std::string& file);

}  // namespace hetplan
