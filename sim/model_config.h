// ModelConfig: the GPT shape a plan trains, in Metis's layer numbering.
//
// Layer 0 is the embedding, layers 1..L-2 are transformer blocks and layer
// L-1 is the final norm with the LM head. "Layers" thus means two things:
// transformer blocks (ModelShape::num_layers, Hugging Face's num_hidden_layers)
// and Metis layers (ModelConfig::num_layers, profiles, layer partitions);
// metis_layers_from_blocks and blocks_from_metis_layers are the one conversion.
#pragma once

#include <string>

#include "base/limits.h"

namespace hetplan {

// The largest model shapes hetplan accepts (kMaxModelLayers and the rest) are in base/limits.h.

// Metis layers of a model of `blocks` transformer blocks: the embedding, the blocks, the head.
constexpr int metis_layers_from_blocks(int blocks) { return blocks + 2; }
// Transformer blocks of a model of `metis_layers` Metis layers. REQUIRES: metis_layers >= 2.
constexpr int blocks_from_metis_layers(int metis_layers) { return metis_layers - 2; }
inline constexpr int kMaxModelBlocks = blocks_from_metis_layers(kMaxModelLayers);

struct ModelConfig {
  std::string name = "GPT";
  std::string size = "1.5B";
  int num_layers = 10;
  int hidden_size = 4096;
  int sequence_length = 1024;
  int vocab_size = 51200;
  int attention_heads = 32;
};

}  // namespace hetplan
