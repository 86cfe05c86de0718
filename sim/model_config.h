// ModelConfig: the GPT shape a plan trains, in Metis's layer numbering.
//
// Layer 0 is the embedding, layers 1..L-2 are transformer blocks and layer
// L-1 is the final norm with the LM head.
#pragma once

#include <string>

#include "sim/limits.h"

namespace hetplan {

// The largest model shapes hetplan accepts (kMaxModelLayers and the rest) are in sim/limits.h.

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
