#include "sim/model_shape.h"

#include <algorithm>

#include "base/input_error.h"
#include "base/json_util.h"

namespace hetplan {

BlockLinears ModelShape::block_linears() const {
  const long long q = static_cast<long long>(num_heads) * head_dim;
  const long long kv = static_cast<long long>(num_kv_heads) * head_dim;
  BlockLinears l;
  l.push_back({kTargetQ, hidden_size, q, attention_bias});
  l.push_back({kTargetK, hidden_size, kv, attention_bias});
  l.push_back({kTargetV, hidden_size, kv, attention_bias});
  l.push_back({kTargetO, q, hidden_size, attention_bias});
  if (mlp == MlpKind::kSwiGlu) l.push_back({kTargetGate, hidden_size, ffn_hidden_size, mlp_bias});
  l.push_back({kTargetUp, hidden_size, ffn_hidden_size, mlp_bias});
  l.push_back({kTargetDown, ffn_hidden_size, hidden_size, mlp_bias});
  return l;
}

long long ModelShape::block_sharded_params() const {
  long long n = 0;
  for (const auto& l : block_linears()) n += l.params();
  return n;
}

long long ModelShape::block_linear_weights() const {
  long long n = 0;
  for (const auto& l : block_linears()) n += l.in * l.out;
  return n;
}

long long ModelShape::block_params() const { return block_sharded_params() + block_replicated_params(); }

long long ModelShape::embedding_params() const {
  return vocab_size * hidden_size + (learned_positions ? max_positions * hidden_size : 0);
}

long long ModelShape::head_params() const { return norm_params() + (tied_embeddings ? 0 : vocab_size * hidden_size); }

long long ModelShape::parameter_count() const {
  return embedding_params() + static_cast<long long>(num_layers) * block_params() + head_params();
}

std::vector<long long> ModelShape::metis_layer_params() const {
  std::vector<long long> out;
  out.reserve(metis_num_layers());
  out.push_back(embedding_params());
  for (int i = 0; i < num_layers; ++i) out.push_back(block_params());
  out.push_back(head_params());
  return out;
}

long long ModelShape::largest_module_params() const {
  long long m = vocab_size * hidden_size;
  for (const auto& l : block_linears()) m = std::max(m, l.params());
  return m;
}

double ModelShape::linear_forward_flops_per_token() const {
  double linear = 0;
  for (const auto& l : block_linears()) linear += 2.0 * static_cast<double>(l.in) * static_cast<double>(l.out);
  return linear;
}

double ModelShape::block_forward_flops_per_token(long long seq) const {
  return linear_forward_flops_per_token() + attention_forward_flops_per_token(static_cast<double>(seq));
}

double ModelShape::lora_forward_flops_per_token(int rank, unsigned targets) const {
  double lora = 0;
  for (const auto& l : block_linears())
    if (targets & l.target) lora += 2.0 * rank * (l.in + l.out);
  return lora;
}

double ModelShape::training_flops(double tokens, long long seq) const {
  const double fwd = num_layers * block_forward_flops_per_token(seq) + head_forward_flops_per_token();
  return kTrainingFlopsPerForwardFlop * fwd * tokens;
}

std::string heads_split_problem(const ModelShape& m, int tp) {
  if (m.num_heads % tp != 0)
    return "the model's " + std::to_string(m.num_heads) + " attention heads do not split over tp " +
           std::to_string(tp) + ": Megatron-LM's TransformerConfig needs num_attention_heads to be a multiple of tp";
  if (m.num_kv_heads % tp != 0 && tp % m.num_kv_heads != 0)
    return "the model's " + std::to_string(m.num_kv_heads) + " key/value heads are neither a multiple nor a divisor of tp " +
           std::to_string(tp) + ": Megatron-LM's TransformerConfig needs one or the other of num_query_groups";
  return "";
}

bool tp_splits_heads(const ModelShape& m, int tp) { return heads_split_problem(m, tp).empty(); }

void ModelShape::validate(const std::string& where) const {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw InputError(where + ": " + what);
  };
  auto in = [](long long v, long long max) { return v > 0 && v <= max; };
  auto range = [](long long max) { return " (expected 1 to " + std::to_string(max) + ")"; };
  need(in(vocab_size, kMaxVocabSize), "vocab size must be positive" + range(kMaxVocabSize));
  need(in(hidden_size, kMaxHiddenSize), "hidden size must be positive" + range(kMaxHiddenSize));
  need(in(num_layers, kMaxModelBlocks),
       "the number of transformer layers must be positive" + range(kMaxModelBlocks));
  need(in(num_heads, kMaxAttentionHeads), "the number of attention heads must be positive" + range(kMaxAttentionHeads));
  need(num_kv_heads > 0 && num_heads % num_kv_heads == 0,
       "the number of key/value heads must divide the number of attention heads (" + std::to_string(num_heads) +
           "), got " + std::to_string(num_kv_heads));
  need(in(head_dim, kMaxHiddenSize),
       "head dimension must be positive (attention heads at most the hidden size)" + range(kMaxHiddenSize));
  need(in(ffn_hidden_size, kMaxFfnSize), "ffn hidden size must be positive" + range(kMaxFfnSize));
  need(!learned_positions || in(max_positions, kMaxSequenceLength),
       "learned position embeddings need max positions > 0" + range(kMaxSequenceLength));
}

ModelConfig ModelShape::to_model_config(int sequence_length) const {
  ModelConfig m;
  m.name = name;
  m.num_layers = metis_num_layers();
  m.hidden_size = static_cast<int>(hidden_size);
  m.sequence_length = sequence_length;
  m.vocab_size = static_cast<int>(vocab_size);
  m.attention_heads = num_heads;
  return m;
}

ModelShape gpt2_shape(long long vocab, long long hidden, int layers, int heads, long long max_positions) {
  ModelShape s;
  s.name = "gpt2";
  s.vocab_size = vocab;
  s.hidden_size = hidden;
  s.num_layers = layers;
  s.num_heads = s.num_kv_heads = heads;
  s.head_dim = heads > 0 ? hidden / heads : 0;
  s.ffn_hidden_size = 4 * hidden;
  s.max_positions = max_positions;
  return s;
}

ModelShape llama_shape(long long vocab, long long hidden, int layers, int heads, int kv_heads, long long ffn,
                       bool tied, long long max_positions) {
  ModelShape s;
  s.name = "llama";
  s.vocab_size = vocab;
  s.hidden_size = hidden;
  s.num_layers = layers;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = heads > 0 ? hidden / heads : 0;
  s.ffn_hidden_size = ffn;
  s.max_positions = max_positions;
  s.mlp = MlpKind::kSwiGlu;
  s.norm = NormKind::kRmsNorm;
  s.tied_embeddings = tied;
  s.learned_positions = false;
  s.attention_bias = s.mlp_bias = false;
  s.dropout = false;
  s.norm_eps = 1e-6;
  return s;
}

ModelShape shape_from_model_config(const ModelConfig& m) {
  ModelShape s = gpt2_shape(m.vocab_size, m.hidden_size, blocks_from_metis_layers(m.num_layers), m.attention_heads,
                            m.sequence_length);
  s.name = m.name;
  return s;
}

namespace {

// The largest value each config.json count may take (sim/model_config.h).
long long max_of(const std::string& key) {
  if (key == "vocab_size") return kMaxVocabSize;
  if (key == "n_embd" || key == "hidden_size" || key == "head_dim") return kMaxHiddenSize;
  if (key == "n_layer" || key == "num_hidden_layers") return kMaxModelBlocks;
  if (key == "n_head" || key == "num_attention_heads" || key == "num_key_value_heads") return kMaxAttentionHeads;
  if (key == "n_inner" || key == "intermediate_size") return kMaxFfnSize;
  return kMaxSequenceLength;  // n_positions, max_position_embeddings
}

long long get_int(const ordered_json& j, const char* key, const std::string& path) {
  return require_integer(j, key, path, "", rules::int_in(1, static_cast<double>(max_of(key))));
}

long long get_int_or(const ordered_json& j, const char* key, const std::string& path, long long fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return get_int(j, key, path);
}

bool get_bool_or(const ordered_json& j, const char* key, const std::string& path, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) throw InputError(path + ": key '" + key + "' must be true or false");
  return j[key].get<bool>();
}

double get_number_or(const ordered_json& j, const char* key, const std::string& path, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return require_number(j, key, path, "");
}

}  // namespace

ModelShape read_hf_config(const std::string& path) {
  const ordered_json j = read_json_file(path);
  if (!j.is_object()) throw InputError(path + ": expected a JSON object (a Hugging Face config.json)");
  const ordered_json& type_v = require_key(j, "model_type", path, "");
  if (!type_v.is_string()) throw InputError(path + ": key 'model_type' must be a string (gpt2, llama or mistral)");
  const std::string type = type_v.get<std::string>();
  ModelShape s;
  if (type == "gpt2") {
    // transformers' GPT2Config: n_inner null means 4 * n_embd; embeddings tied by default.
    s = gpt2_shape(get_int(j, "vocab_size", path), get_int(j, "n_embd", path), static_cast<int>(get_int(j, "n_layer", path)),
                   static_cast<int>(get_int(j, "n_head", path)), get_int(j, "n_positions", path));
    s.ffn_hidden_size = get_int_or(j, "n_inner", path, 4 * s.hidden_size);
    s.tied_embeddings = get_bool_or(j, "tie_word_embeddings", path, true);
    s.dropout = get_number_or(j, "resid_pdrop", path, 0.1) > 0 || get_number_or(j, "attn_pdrop", path, 0.1) > 0;
    s.norm_eps = get_number_or(j, "layer_norm_epsilon", path, 1e-5);
  } else if (type == "llama" || type == "mistral") {
    // transformers' LlamaConfig: num_key_value_heads defaults to the heads,
    // head_dim to hidden / heads; embeddings untied by default.
    const int heads = static_cast<int>(get_int(j, "num_attention_heads", path));
    s = llama_shape(get_int(j, "vocab_size", path), get_int(j, "hidden_size", path),
                    static_cast<int>(get_int(j, "num_hidden_layers", path)), heads,
                    static_cast<int>(get_int_or(j, "num_key_value_heads", path, heads)),
                    get_int(j, "intermediate_size", path), get_bool_or(j, "tie_word_embeddings", path, false),
                    get_int(j, "max_position_embeddings", path));
    s.head_dim = get_int_or(j, "head_dim", path, s.hidden_size / heads);
    s.attention_bias = get_bool_or(j, "attention_bias", path, false);
    s.mlp_bias = get_bool_or(j, "mlp_bias", path, false);
    s.dropout = get_number_or(j, "attention_dropout", path, 0.0) > 0;
    s.norm_eps = get_number_or(j, "rms_norm_eps", path, 1e-6);
    s.rope_theta = get_number_or(j, "rope_theta", path, 10000.0);
    if (j.contains("hidden_act") && j["hidden_act"].is_string() && j["hidden_act"].get<std::string>() != "silu")
      throw InputError(path + ": key 'hidden_act' is '" + excerpt(j["hidden_act"].get<std::string>()) +
                       "': expected 'silu' for a " + type + " model");
  } else {
    throw InputError(path + ": key 'model_type' is '" + excerpt(type) + "': expected gpt2, llama or mistral");
  }
  if (j.contains("_name_or_path") && j["_name_or_path"].is_string() && !j["_name_or_path"].get<std::string>().empty())
    s.name = j["_name_or_path"].get<std::string>();
  else
    s.name = type;
  s.validate(path);
  return s;
}

ModelShape shape_from_flags(const ModelFlags& f, long long seq) {
  ModelShape s;
  const long long positions = std::max(f.max_positions, seq);
  if (!f.hf_config.empty()) {
    s = read_hf_config(f.hf_config);
    if (f.blocks_given) s.num_layers = f.blocks;
  } else if (f.family == "gpt2") {
    s = gpt2_shape(f.vocab_size, f.hidden_size, f.blocks, f.heads, positions);
    if (f.ffn_hidden_size > 0) s.ffn_hidden_size = f.ffn_hidden_size;
  } else if (f.family == "llama") {
    s = llama_shape(f.vocab_size, f.hidden_size, f.blocks, f.heads, f.kv_heads > 0 ? f.kv_heads : f.heads,
                    f.ffn_hidden_size > 0 ? f.ffn_hidden_size : 11008, false, positions);
  } else {
    throw InputError("--family: '" + excerpt(f.family) + "': expected gpt2 or llama");
  }
  if (f.tie && f.untie) throw InputError("--tie-embeddings and --untie-embeddings: give at most one");
  if (f.tie) s.tied_embeddings = true;
  if (f.untie) s.tied_embeddings = false;
  s.validate(f.hf_config.empty() ? "model flags" : f.hf_config);
  return s;
}

ModelShape shape_of_plan(const ModelConfig& m, const std::string& hf_config, const std::string& source) {
  if (hf_config.empty()) return shape_from_model_config(m);
  ModelShape s = read_hf_config(hf_config);
  if (s.metis_num_layers() != m.num_layers || s.hidden_size != m.hidden_size)
    throw InputError(hf_config + ": the model has " + std::to_string(s.num_layers) + " blocks and hidden size " +
                     std::to_string(s.hidden_size) + ", but " + source + " has " +
                     std::to_string(blocks_from_metis_layers(m.num_layers)) + " blocks (" +
                     std::to_string(m.num_layers) + " layers with the embedding and the head) of hidden size " +
                     std::to_string(m.hidden_size));
  return s;
}

}  // namespace hetplan
