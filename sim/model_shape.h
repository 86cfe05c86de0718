// ModelShape: the exact shape of a decoder-only transformer of the GPT-2 or
// Llama families, enough to count every parameter and every FLOP.
//
// It promises that parameter_count() equals the count PyTorch reports for the
// Hugging Face model (shared tensors counted once), and it splits that count
// in Metis's layer numbering: layer 0 is the embedding, layers 1..L are the
// transformer blocks and layer L+1 is the final norm with the LM head.
// Shapes come from flags (shape_from_flags), from a Metis ModelConfig, or
// from a Hugging Face config.json (InputError names the file and the missing
// key); a plan's shape is its ModelConfig's or a config.json that matches it
// (shape_of_plan). It is the one FLOP count: the analytic profiles, whatif,
// inference, the simulators' MFU and replay's MFU all ask it.
#pragma once

#include <string>
#include <vector>

#include "sim/model_config.h"

namespace hetplan {

// Forward + backward FLOPs per forward FLOP (the backward computes input and weight gradients: 2x).
inline constexpr double kTrainingFlopsPerForwardFlop = 3.0;
// Attention FLOPs per token per context token per (head x head_dim): 2 for Q K^T, 2 for the weighted V.
inline constexpr double kAttentionFlopsPerContextDim = 2.0 * 2.0;

enum class MlpKind { kGelu, kSwiGlu };        // GPT-2: fc -> GELU -> proj; Llama: down(silu(gate) * up)
enum class NormKind { kLayerNorm, kRmsNorm };  // LayerNorm has a bias, RMSNorm does not

// The projections LoRA may adapt, as bits of a mask.
enum LinearTarget : unsigned {
  kTargetQ = 1u << 0,
  kTargetK = 1u << 1,
  kTargetV = 1u << 2,
  kTargetO = 1u << 3,
  kTargetGate = 1u << 4,  // SwiGLU only; for GELU MLPs it means the fc (up) projection
  kTargetUp = 1u << 5,
  kTargetDown = 1u << 6,
  kTargetAll = 0x7f,
};

// One linear projection of a transformer block: y = x W (+ b), W is in x out.
struct LinearShape {
  LinearTarget target;
  long long in = 0, out = 0;
  bool bias = false;
  long long params() const { return in * out + (bias ? out : 0); }
};

// A block's linear layers, at most 7, held inline (the cost path builds no vectors).
struct BlockLinears {
  LinearShape items[7];
  int count = 0;
  void push_back(const LinearShape& l) { items[count++] = l; }
  const LinearShape* begin() const { return items; }
  const LinearShape* end() const { return items + count; }
  int size() const { return count; }
};

struct ModelShape {
  std::string name = "GPT";
  long long vocab_size = 50257;
  long long hidden_size = 1600;
  int num_layers = 48;  // transformer blocks (Metis's num_layers: metis_num_layers())
  int num_heads = 25;
  int num_kv_heads = 25;  // < num_heads: grouped-query attention
  long long head_dim = 64;
  long long ffn_hidden_size = 6400;
  long long max_positions = 1024;
  MlpKind mlp = MlpKind::kGelu;
  NormKind norm = NormKind::kLayerNorm;
  bool tied_embeddings = true;
  bool learned_positions = true;  // GPT-2's wpe; Llama uses RoPE (no parameters)
  bool attention_bias = true;     // q, k, v, o biases
  bool mlp_bias = true;
  bool dropout = true;  // GPT-2 trains with dropout (masks are stored); Llama's configs set it to 0
  // Numerics only (no parameters, no FLOPs): what the LibTorch model needs to
  // compute the same function as the Hugging Face one.
  double norm_eps = 1e-5;       // GPT-2's layer_norm_epsilon; Llama's rms_norm_eps
  double rope_theta = 10000.0;  // RoPE base (Llama); rope_scaling is not modelled

  // --- parameter counts (exact) ---
  long long norm_params() const { return norm == NormKind::kLayerNorm ? 2 * hidden_size : hidden_size; }
  BlockLinears block_linears() const;
  long long block_params() const;
  // The part of a block that tensor parallelism splits (the linear layers;
  // Megatron keeps the row-parallel biases whole, a few hidden_size values
  // we split as well); the rest (the two norms) is replicated.
  long long block_sharded_params() const;
  long long block_replicated_params() const { return 2 * norm_params(); }
  // The weights of a block's linear layers, biases excluded (what weight quantisation packs).
  long long block_linear_weights() const;
  long long embedding_params() const;  // token (+ learned position) embeddings
  long long head_params() const;       // final norm + LM head (0 for the head when tied)
  long long parameter_count() const;
  // Parameters per Metis layer: [embedding, block x L, head]. Sums to parameter_count().
  std::vector<long long> metis_layer_params() const;
  int metis_num_layers() const { return metis_layers_from_blocks(num_layers); }
  // The largest single module (DeepSpeed's "largest layer params"): the
  // embedding table, or the head when untied, or the biggest projection.
  long long largest_module_params() const;

  // --- FLOPs (a multiply-add is 2 FLOPs) ---
  // Forward FLOPs of one token through a block's linear layers.
  double linear_forward_flops_per_token() const;
  // Forward FLOPs of one token's attention over `context` tokens: the scores
  // Q K^T and the weighted sum of V, each 2 x context x heads x head_dim.
  double attention_forward_flops_per_token(double context) const {
    return kAttentionFlopsPerContextDim * context * static_cast<double>(num_heads) * head_dim;
  }
  // Forward FLOPs of one token of a sequence of length `seq` through one
  // block: its linear layers and the attention over the whole sequence (no
  // causal-mask discount, as Narayanan et al. 2021 and MFU reports count).
  double block_forward_flops_per_token(long long seq) const;
  double head_forward_flops_per_token() const { return 2.0 * hidden_size * vocab_size; }
  // Forward FLOPs of one token through the LoRA adapters of rank `rank` on the `targets` projections.
  double lora_forward_flops_per_token(int rank, unsigned targets) const;
  // Model FLOPs of forward + backward (kTrainingFlopsPerForwardFlop x forward) for `tokens` tokens.
  double training_flops(double tokens, long long seq) const;

  // Checks the shape is usable; `where` names the source for messages.
  void validate(const std::string& where) const;

  // The Metis-level config of this shape at a sequence length.
  ModelConfig to_model_config(int sequence_length) const;
};

// Whether tensor parallelism of degree `tp` splits the model's attention heads as Megatron-LM does: the
// heads a multiple of tp, and the key/value heads (num_query_groups) a multiple or a divisor of it. The
// one home of the rule: the search's allowed tp (planner/search_space.cc) and the exporters
// (planner/export_plan.cc) both ask it. REQUIRES: tp >= 1.
bool tp_splits_heads(const ModelShape& m, int tp);
// Why tp does not split the heads, one clause naming the counts and Megatron's requirement; "" when it does.
std::string heads_split_problem(const ModelShape& m, int tp);

// GPT-2 shape with its usual defaults (ffn = 4 h, learned positions, tied).
ModelShape gpt2_shape(long long vocab, long long hidden, int layers, int heads, long long max_positions);
// Llama shape: SwiGLU, RMSNorm, RoPE, no biases.
ModelShape llama_shape(long long vocab, long long hidden, int layers, int heads, int kv_heads, long long ffn,
                       bool tied, long long max_positions);
// The GPT shape Metis's plans describe: num_layers counts the embedding and
// the head, ffn = 4 h, learned positions over the sequence length, tied.
ModelShape shape_from_model_config(const ModelConfig& m);

// Reads a Hugging Face config.json (model_type gpt2, llama or mistral).
ModelShape read_hf_config(const std::string& path);

// A model's shape as command-line flags give it (whatif, profile; the flags: cli/model_flags.h): a Hugging Face
// config.json, or a family and its sizes. The defaults are each command's.
struct ModelFlags {
  std::string hf_config;          // set: the config's shape; `blocks` (when blocks_given) and the tie flags override it
  std::string family = "llama";   // without hf_config: gpt2 or llama
  long long vocab_size = 32000, hidden_size = 4096;
  long long ffn_hidden_size = 0;  // 0: the family's (gpt2: 4 x hidden; llama: 11008, Llama-2-7B's)
  int blocks = 32;                // transformer blocks
  bool blocks_given = false;      // the layer flag was given (overrides hf_config's)
  int heads = 32, kv_heads = 0;   // kv_heads 0: heads (gpt2 always)
  long long max_positions = 0;    // gpt2's learned positions: at least the sequence length
  bool tie = false, untie = false;  // override the family's (or the config's) embedding tying
};
// The one way from flags to a shape; `seq` is the sequence length trained or profiled. Validates the shape
// (InputError naming the config file, or "model flags").
ModelShape shape_from_flags(const ModelFlags& f, long long seq);

// A plan's model: its ModelConfig's GPT shape, or the `hf_config` (when not empty), whose blocks and hidden
// size must be the ModelConfig's. `source` names the ModelConfig in messages ("the plan P.json",
// "--num_layers and --hidden_size"). A config.json's shape is validated; the ModelConfig's is the caller's to.
ModelShape shape_of_plan(const ModelConfig& m, const std::string& hf_config, const std::string& source);

}  // namespace hetplan
