// ModelShape: exact parameter counts of published models, from their
// Hugging Face config.json files (tests/data/hf, the architecture keys of
// each model card's config), and the Metis layer split.
#include <catch2/catch.hpp>
#include <numeric>

#include "base/input_error.h"
#include "sim/model_shape.h"

using namespace hetplan;

namespace {

std::string hf(const std::string& name) { return std::string(HETPLAN_SOURCE_DIR) + "/tests/data/hf/" + name; }

}  // namespace

// Published counts. Each is the total that PyTorch reports for the Hugging
// Face model (sum of p.numel() over model.parameters(), tied tensors once),
// which the model pages show as the safetensors parameter count:
//   openai-community/gpt2-xl            1,557,611,200 (Radford et al. 2019, Table 2, rounds this model to "1542M")
//   meta-llama/Llama-2-7b-hf            6,738,415,616
//   meta-llama/Llama-3.2-3B             3,212,749,824 (tied embeddings)
//   meta-llama/Llama-3.1-8B             8,030,261,248
//   meta-llama/Llama-3.1-70B           70,553,706,496
TEST_CASE("parameter counts equal the published counts", "[shape]") {
  CHECK(read_hf_config(hf("gpt2-xl.json")).parameter_count() == 1'557'611'200LL);
  CHECK(read_hf_config(hf("llama-2-7b.json")).parameter_count() == 6'738'415'616LL);
  CHECK(read_hf_config(hf("llama-3.2-3b.json")).parameter_count() == 3'212'749'824LL);
  CHECK(read_hf_config(hf("llama-3.1-8b.json")).parameter_count() == 8'030'261'248LL);
  CHECK(read_hf_config(hf("llama-3.1-70b.json")).parameter_count() == 70'553'706'496LL);
}

TEST_CASE("shapes read from config.json", "[shape]") {
  const ModelShape g = read_hf_config(hf("gpt2-xl.json"));
  CHECK(g.mlp == MlpKind::kGelu);
  CHECK(g.norm == NormKind::kLayerNorm);
  CHECK(g.tied_embeddings);
  CHECK(g.learned_positions);
  CHECK(g.ffn_hidden_size == 6400);  // n_inner absent: 4 * n_embd
  CHECK(g.dropout);
  // GPT-2 block: 12 h^2 + 13 h (qkv 3h^2+3h, proj h^2+h, fc 4h^2+4h, proj 4h^2+h, 2 LayerNorms 4h).
  CHECK(g.block_params() == 12LL * 1600 * 1600 + 13 * 1600);

  const ModelShape l3 = read_hf_config(hf("llama-3.1-8b.json"));
  CHECK(l3.mlp == MlpKind::kSwiGlu);
  CHECK(l3.norm == NormKind::kRmsNorm);
  CHECK_FALSE(l3.tied_embeddings);
  CHECK(l3.num_kv_heads == 8);
  CHECK(l3.head_dim == 128);
  CHECK_FALSE(l3.dropout);
  // Llama block: q, o h^2 each; k, v h * (kv * head_dim) each; gate, up, down h * f each; 2 RMSNorms h each.
  CHECK(l3.block_params() == 2LL * 4096 * 4096 + 2LL * 4096 * 1024 + 3LL * 4096 * 14336 + 2 * 4096);
}

TEST_CASE("metis layer numbering splits the parameters", "[shape]") {
  const ModelShape s = read_hf_config(hf("llama-2-7b.json"));
  const auto layers = s.metis_layer_params();
  REQUIRE(layers.size() == 34u);
  REQUIRE(s.metis_num_layers() == 34);
  CHECK(layers.front() == 32000LL * 4096);          // embed_tokens
  CHECK(layers[1] == 202'383'360LL);                // one decoder layer
  CHECK(layers.back() == 4096 + 32000LL * 4096);    // final RMSNorm + untied lm_head
  CHECK(std::accumulate(layers.begin(), layers.end(), 0LL) == s.parameter_count());
  // Tied: the head holds only the final norm.
  const ModelShape t = read_hf_config(hf("llama-3.2-3b.json"));
  CHECK(t.metis_layer_params().back() == 3072);
}

TEST_CASE("shape from a Metis model config", "[shape]") {
  ModelConfig m;
  m.num_layers = 50;  // 48 blocks + embedding + head
  m.hidden_size = 1600;
  m.sequence_length = 1024;
  m.vocab_size = 50257;
  m.attention_heads = 25;
  CHECK(shape_from_model_config(m).parameter_count() == 1'557'611'200LL);
  CHECK(shape_from_model_config(m).to_model_config(1024).num_layers == 50);
}

TEST_CASE("training FLOPs follow 6 N D for the linear part", "[shape]") {
  // Kaplan et al. 2020 (Scaling Laws, Sec. 2.1): C_forward = 2N + 2 n_layer n_ctx d_attn per token;
  // backward is twice the forward. N excludes embeddings.
  const ModelShape s = read_hf_config(hf("gpt2-xl.json"));
  const double n_nonembed = 48.0 * 12 * 1600 * 1600;  // the h^2 weights of the blocks
  const double per_token_fwd = 2 * n_nonembed + 2.0 * 48 * 1024 * 1600 * 2 + 2.0 * 1600 * 50257;
  CHECK(s.training_flops(1, 1024) == Approx(3 * per_token_fwd).epsilon(1e-12));
}

TEST_CASE("config.json errors name the file and key", "[shape][errors]") {
  try {
    read_hf_config(hf("broken-llama.json"));
    FAIL("expected InputError");
  } catch (const InputError& e) {
    const std::string m = e.what();
    CHECK(m.find("broken-llama.json") != std::string::npos);
    CHECK(m.find("num_attention_heads") != std::string::npos);
  }
  CHECK_THROWS_AS(read_hf_config(hf("does-not-exist.json")), InputError);
}

TEST_CASE("one conversion between transformer blocks and Metis layers", "[shape]") {
  STATIC_REQUIRE(metis_layers_from_blocks(48) == 50);
  STATIC_REQUIRE(blocks_from_metis_layers(10) == 8);
  STATIC_REQUIRE(kMaxModelBlocks == kMaxModelLayers - 2);
  const ModelShape s = read_hf_config(hf("llama-2-7b.json"));
  CHECK(s.metis_num_layers() == metis_layers_from_blocks(s.num_layers));
  CHECK(blocks_from_metis_layers(s.to_model_config(4096).num_layers) == s.num_layers);
}

TEST_CASE("one FLOP count: a block is its linear layers plus its attention", "[shape]") {
  const ModelShape g = read_hf_config(hf("gpt2-xl.json"));
  const double h = 1600;
  CHECK(g.linear_forward_flops_per_token() == 24 * h * h);  // GPT-2: 24 h^2 per token
  CHECK(g.attention_forward_flops_per_token(1024) == 4 * 1024 * h);
  CHECK(g.attention_forward_flops_per_token(1024) == 1024 * g.attention_forward_flops_per_token(1));
  CHECK(g.block_forward_flops_per_token(1024) ==
        g.linear_forward_flops_per_token() + g.attention_forward_flops_per_token(1024));
  CHECK(g.block_linear_weights() == 12LL * 1600 * 1600);  // the biases are not weights
  const ModelShape l = read_hf_config(hf("llama-3.1-8b.json"));
  // LoRA on q and v: rank x (in + out) per projection, 2 FLOPs per multiply-add.
  CHECK(l.lora_forward_flops_per_token(16, kTargetQ | kTargetV) == 2.0 * 16 * (4096 + 4096) + 2.0 * 16 * (4096 + 1024));
  CHECK(l.lora_forward_flops_per_token(16, 0) == 0);
  CHECK(l.training_flops(1, 8192) ==
        kTrainingFlopsPerForwardFlop * (32 * l.block_forward_flops_per_token(8192) + l.head_forward_flops_per_token()));
}

TEST_CASE("one way from flags to a shape", "[shape]") {
  ModelFlags f;  // llama, 32 blocks of 4096, 32 heads: Llama-2-7B but for the vocabulary's default
  const ModelShape l = shape_from_flags(f, 2048);
  CHECK(l.mlp == MlpKind::kSwiGlu);
  CHECK(l.ffn_hidden_size == 11008);
  CHECK_FALSE(l.tied_embeddings);
  CHECK(l.parameter_count() == read_hf_config(hf("llama-2-7b.json")).parameter_count());
  f.tie = true;
  CHECK(shape_from_flags(f, 2048).tied_embeddings);
  f.untie = true;
  CHECK_THROWS_AS(shape_from_flags(f, 2048), InputError);
  ModelFlags g;
  g.family = "gpt2";
  g.vocab_size = 50257, g.hidden_size = 1600, g.blocks = 48, g.heads = 25, g.max_positions = 1024;
  const ModelShape gpt = shape_from_flags(g, 512);
  CHECK(gpt.parameter_count() == 1'557'611'200LL);  // positions: at least the sequence, here max_positions
  CHECK(shape_from_flags(g, 2048).max_positions == 2048);
  g.family = "bert";
  CHECK_THROWS_AS(shape_from_flags(g, 512), InputError);
  // A config.json, its layer count overridden only when the layer flag was given.
  ModelFlags c;
  c.hf_config = hf("llama-3.2-3b.json");
  c.blocks = 2;
  CHECK(shape_from_flags(c, 512).num_layers == 28);
  c.blocks_given = true;
  CHECK(shape_from_flags(c, 512).num_layers == 2);
}

TEST_CASE("a plan's shape: its model config, or a config.json that matches it", "[shape]") {
  ModelConfig m;
  m.num_layers = 34;
  m.hidden_size = 4096;
  CHECK(shape_of_plan(m, "", "the plan p.json").num_layers == 32);
  CHECK(shape_of_plan(m, hf("llama-2-7b.json"), "the plan p.json").ffn_hidden_size == 11008);
  m.num_layers = 10;
  try {
    shape_of_plan(m, hf("llama-2-7b.json"), "the plan p.json");
    FAIL("expected InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("llama-2-7b.json: the model has 32 blocks and hidden size 4096, but the plan "
                                     "p.json has 8 blocks (10 layers with the embedding and the head) of hidden size "
                                     "4096") != std::string::npos);
  }
}
