#include "sim/profile_model.h"

#include "base/input_error.h"

namespace hetplan {

ordered_json profile_model_record(const ModelShape& s, long long seq, int bytes_per_parameter) {
  ordered_json model;
  model["model_name"] = s.name;
  model["num_layers"] = s.metis_num_layers();
  model["hidden_size"] = s.hidden_size;
  model["num_heads"] = s.num_heads;
  model["sequence_length"] = seq;
  model["vocab_size"] = s.vocab_size;
  model["family"] = s.mlp == MlpKind::kSwiGlu ? "llama" : "gpt2";
  model["num_kv_heads"] = s.num_kv_heads;
  model["head_dim"] = s.head_dim;
  model["ffn_hidden_size"] = s.ffn_hidden_size;
  model["tied_embeddings"] = s.tied_embeddings;
  model["parameter_count"] = s.parameter_count();
  ordered_json per_layer = ordered_json::array();
  long long total = 0;
  for (long long n : s.metis_layer_params()) {
    per_layer.push_back(n * bytes_per_parameter);
    total += n * bytes_per_parameter;
  }
  model["parameters"] = {{"total_parameters_bytes", total}, {"parameters_per_layer_bytes", per_layer}};
  return model;
}

ModelShape shape_from_profile_record(const ordered_json& model, const std::string& path, long long* seq) {
  auto get = [&](const char* key, long long fallback) -> long long {
    if (!model.is_object() || !model.contains(key) || model[key].is_null()) {
      if (fallback >= 0) return fallback;
      throw InputError(path + ": key 'model." + std::string(key) + "' is missing (the shape the profile was made for)");
    }
    if (!model[key].is_number_integer() || model[key].get<long long>() < 1)
      throw InputError(path + ": key 'model." + std::string(key) + "' must be a positive integer");
    return model[key].get<long long>();
  };
  const long long layers = get("num_layers", -1), hidden = get("hidden_size", -1), heads = get("num_heads", -1);
  const long long vocab = get("vocab_size", -1), s = get("sequence_length", -1);
  if (layers < 3) throw InputError(path + ": key 'model.num_layers' must be at least 3 (embedding, blocks, head)");
  const std::string family = model.contains("family") && model["family"].is_string() ? model["family"].get<std::string>() : "gpt2";
  ModelShape shape;
  const int blocks = static_cast<int>(layers - 2);
  if (family == "llama") {
    const long long kv = get("num_kv_heads", heads);
    const bool tied = model.contains("tied_embeddings") && model["tied_embeddings"].is_boolean()
                          ? model["tied_embeddings"].get<bool>()
                          : false;
    shape = llama_shape(vocab, hidden, blocks, static_cast<int>(heads), static_cast<int>(kv),
                        get("ffn_hidden_size", -1), tied, s);
  } else if (family == "gpt2") {
    shape = gpt2_shape(vocab, hidden, blocks, static_cast<int>(heads), s);
    shape.ffn_hidden_size = get("ffn_hidden_size", 4 * hidden);
  } else {
    throw InputError(path + ": key 'model.family': expected gpt2 or llama, got '" + excerpt(family) + "'");
  }
  if (model.contains("head_dim") && model["head_dim"].is_number_integer()) shape.head_dim = model["head_dim"].get<long long>();
  if (model.contains("model_name") && model["model_name"].is_string()) shape.name = model["model_name"].get<std::string>();
  shape.validate(path);
  if (seq) *seq = s;
  return shape;
}

}  // namespace hetplan
