#include "cli/model_flags.h"

#include "base/json_util.h"
#include "sim/model_config.h"

namespace hetplan::cli {

void add_model_shape_flags(CLI::App* s, ModelFlags& f) {
  s->add_option("--hf-config", f.hf_config,
                "Hugging Face config.json (gpt2, llama, mistral) for the model; the layer flag, when given, "
                "overrides its layer count");
  s->add_option("--family", f.family, "Without --hf-config: gpt2 or llama")->capture_default_str();
  s->add_option("--vocab-size", f.vocab_size, "Vocabulary size")->capture_default_str();
  s->add_option("--hidden-size", f.hidden_size, "Hidden size")->capture_default_str();
  s->add_option("--heads", f.heads, "Attention heads")->capture_default_str();
  s->add_option("--kv-heads", f.kv_heads, "Key/value heads (GQA, llama; default: --heads)");
  s->add_option("--ffn-size", f.ffn_hidden_size, "MLP hidden size (default: 4h for gpt2, 11008 for llama)");
  s->add_flag("--tie-embeddings,--tied-embeddings", f.tie,
              "Tie the LM head to the token embedding (gpt2's default)");
  s->add_flag("--untie-embeddings", f.untie, "Give the LM head its own weight (llama's default)");
}

namespace {

void check_flag(long long v, double lo, double hi, const char* flag) {
  check_integer(static_cast<double>(v), rules::int_in(lo, hi), flag);
}

}  // namespace

void check_model_shape_flags(const ModelFlags& f) {
  check_flag(f.vocab_size, 1, static_cast<double>(kMaxVocabSize), "--vocab-size");
  check_flag(f.hidden_size, 1, static_cast<double>(kMaxHiddenSize), "--hidden-size");
  check_flag(f.ffn_hidden_size, 0, static_cast<double>(kMaxFfnSize), "--ffn-size");
  check_flag(f.heads, 1, kMaxAttentionHeads, "--heads");
  check_flag(f.kv_heads, 0, kMaxAttentionHeads, "--kv-heads");
}

}  // namespace hetplan::cli
