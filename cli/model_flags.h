// The model-shape flags of the commands that build a model from flags
// (whatif, profile): --hf-config, --family, --vocab-size, --hidden-size,
// --heads, --kv-heads, --ffn-size, --tie-embeddings (alias
// --tied-embeddings) and --untie-embeddings. One definition of their names,
// help and range checks; the shape itself is built by shape_from_flags
// (sim/model_shape.h). The layer flag stays each command's own (whatif's
// --layers counts transformer blocks, profile's --num-layers Metis layers),
// and so do the defaults: a command sets them in ModelFlags before calling.
// Lifetime: the options hold a reference to the ModelFlags, which must
// outlive the parse (the commands keep it in a shared_ptr'd args struct).
#pragma once

#include <CLI/CLI.hpp>

#include "sim/model_shape.h"

namespace hetplan::cli {

void add_model_shape_flags(CLI::App* s, ModelFlags& f);

// Range checks of the flags above (InputError naming the flag). The layer count is the caller's to check.
void check_model_shape_flags(const ModelFlags& f);

}  // namespace hetplan::cli
