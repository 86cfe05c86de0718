// ModelConfig: the GPT shape a plan trains, in Metis's layer numbering.
//
// Layer 0 is the embedding, layers 1..L-2 are transformer blocks and layer
// L-1 is the final norm with the LM head. "Layers" thus means two things:
// transformer blocks (ModelShape::num_layers, Hugging Face's num_hidden_layers)
// and Metis layers (ModelConfig::num_layers, profiles, layer partitions);
// metis_layers_from_blocks and blocks_from_metis_layers are the one conversion.
#pragma once

#include <string>

namespace hetplan {

// The largest model shapes hetplan accepts from a file or flag (readers
// refuse larger values with the key and the limit). They keep every
// parameter and FLOP count inside 64-bit integers and doubles: the largest
// real models are far below (Llama-3.1-405B: 126 blocks, hidden 16384,
// vocab 128256, 128 heads).
inline constexpr int kMaxModelLayers = 4096;           // Metis layers: blocks + embedding + head

// Metis layers of a model of `blocks` transformer blocks: the embedding, the blocks, the head.
constexpr int metis_layers_from_blocks(int blocks) { return blocks + 2; }
// Transformer blocks of a model of `metis_layers` Metis layers. REQUIRES: metis_layers >= 2.
constexpr int blocks_from_metis_layers(int metis_layers) { return metis_layers - 2; }
inline constexpr int kMaxModelBlocks = blocks_from_metis_layers(kMaxModelLayers);
inline constexpr long long kMaxHiddenSize = 1 << 20;
inline constexpr long long kMaxFfnSize = 1 << 22;
inline constexpr long long kMaxVocabSize = 1 << 24;
inline constexpr long long kMaxSequenceLength = 1 << 24;  // also max positions
inline constexpr int kMaxAttentionHeads = 1 << 16;
inline constexpr int kMaxGlobalBatch = 1 << 24;           // sequences per iteration

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
