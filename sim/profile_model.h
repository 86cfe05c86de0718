// The "model" object of a profile file: the shape a profile was made for,
// written by every maker of profiles (hetplan profile, gen-profiles
// --analytic, gen-profiles --from) in one form, so that search and simulate
// can refuse shape flags that disagree with it (ModelProfile's fields,
// sim/profile.h) and a transfer can rebuild the shape.
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "base/json_util.h"
#include "sim/model_shape.h"

namespace hetplan {

// Metis's keys (model_name, num_layers, hidden_size, num_heads, sequence_length, vocab_size, parameters) and
// hetplan's (family, num_kv_heads, head_dim, ffn_hidden_size, tied_embeddings, parameter_count), parameters in
// bytes at `bytes_per_parameter`.
ordered_json profile_model_record(const ModelShape& s, long long seq, int bytes_per_parameter);

// The shape a profile's "model" object records (a GPT-2 shape where it names no family, as Metis's files);
// its sequence length in *seq. Throws InputError naming `path` and the key.
ModelShape shape_from_profile_record(const ordered_json& model, const std::string& path, long long* seq);

}  // namespace hetplan
