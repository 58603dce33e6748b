#include "engine/model/model_config.h"

#include <gtest/gtest.h>

#include <numbers>
#include <set>
#include <string>

#include "engine/json.h"
#include "engine/model/lora_config.h"
#include "engine/testing/golden_files.h"

namespace ferry {
namespace {

Result<ModelConfig> Golden(const char* model) {
  return LoadHfConfig(testing::GoldenPath(model, "config.json"));
}

// Expects `json_text` to be refused with a message containing `needle`.
void ExpectRefused(const std::string& json_text, const std::string& needle) {
  Result<ModelConfig> c = ParseHfConfig(json_text);
  ASSERT_FALSE(c.ok()) << json_text;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
}

constexpr char kLlama[] = R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
  "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4)";

TEST(ModelConfigTest, ParsesGoldenLlama) {
  Result<ModelConfig> c = Golden("llama");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->family, ModelFamily::kLlama);
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->vocab_size, 97);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->norm, NormKind::kRmsNorm);
  EXPECT_DOUBLE_EQ(c->norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);  // from transformers 5's rope_parameters
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
}

TEST(ModelConfigTest, ParsesGoldenQwen3) {
  Result<ModelConfig> c = Golden("qwen3");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->hidden_size, 48);
  EXPECT_EQ(c->q_dim(), 64);  // head_dim 16 x 4 heads: wider than the hidden size
  EXPECT_EQ(c->kv_dim(), 32);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c->norm_eps, 1e-6);
}

TEST(ModelConfigTest, ParsesGoldenGpt2) {
  Result<ModelConfig> c = Golden("gpt2");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->family, ModelFamily::kGpt2);
  EXPECT_EQ(c->norm, NormKind::kLayerNorm);
  EXPECT_EQ(c->activation, Activation::kGeluTanh);
  EXPECT_TRUE(c->learned_positions);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->intermediate_size, 128);
  EXPECT_EQ(c->max_position_embeddings, 16);
  EXPECT_EQ(c->head_dim, 12);
  EXPECT_EQ(c->num_kv_heads, 4);
}

TEST(ModelConfigTest, LegacyFieldsAndDefaults) {
  Result<ModelConfig> c = ParseHfConfig(std::string(kLlama) + R"(, "rope_theta": 500000.0,
      "rope_scaling": null, "attention_bias": true})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_kv_heads, 4);  // defaults to the query heads
  EXPECT_EQ(c->head_dim, 16);     // hidden / heads
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e5);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);  // Llama's attention_bias covers o_proj too

  Result<ModelConfig> q2 = ParseHfConfig(R"({"model_type": "qwen2", "vocab_size": 10,
      "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1})");
  ASSERT_TRUE(q2.ok()) << q2.status().ToString();
  EXPECT_TRUE(q2->qkv_bias);  // Qwen2: always q/k/v biases
  EXPECT_FALSE(q2->o_bias);   // and none on o_proj
}

// The family table lists each model type once; each parses into its family, whose written
// config.json reads back as the same family, and an unknown type's error lists them all.
TEST(ModelConfigTest, EveryModelTypeOfTheTableParsesIntoItsFamily) {
  EXPECT_EQ(ModelTypesList(ModelFamilies()), "llama, mistral, qwen2, qwen3 and gpt2");
  EXPECT_EQ(ModelTypesList({ModelFamily::kLlama}), "llama, mistral, qwen2 and qwen3");
  EXPECT_EQ(ModelTypesList({ModelFamily::kGpt2}), "gpt2");
  EXPECT_EQ(ModelTypesList({}), "");
  std::set<std::string_view> seen;
  for (ModelFamily f : ModelFamilies()) {
    for (std::string_view type : ModelTypesOf(f)) {
      EXPECT_TRUE(seen.insert(type).second) << type << " listed twice";
      const std::string text =
          f == ModelFamily::kGpt2
              ? R"({"model_type": ")" + std::string(type) + R"(", "vocab_size": 10, "n_embd": 8,
                   "n_layer": 1, "n_head": 2, "n_positions": 16})"
              : R"({"model_type": ")" + std::string(type) + R"(", "vocab_size": 10,
                   "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                   "num_attention_heads": 2})";
      Result<ModelConfig> c = ParseHfConfig(text);
      ASSERT_TRUE(c.ok()) << type << ": " << c.status().ToString();
      EXPECT_EQ(c->family, f) << type;
      EXPECT_EQ(c->model_type, type);
      Result<ModelConfig> again = ParseHfConfig(ToHfConfigJson(*c).dump());
      ASSERT_TRUE(again.ok()) << type << ": " << again.status().ToString();
      EXPECT_EQ(again->family, f) << type;
    }
  }
  ExpectRefused(R"({"model_type": "bert"})",
                "model_type 'bert' is not supported; ferry runs llama, mistral, qwen2, qwen3 and "
                "gpt2");
}

TEST(ModelConfigTest, RefusesWhatItCannotRun) {
  ExpectRefused("{not json", "well-formed");
  ExpectRefused(R"({"model_type": "bert", "architectures": ["BertModel"]})", "BertModel");
  ExpectRefused(R"({"vocab_size": 3})", "model_type");
  ExpectRefused(R"({"model_type": "llama", "hidden_size": 64})", "vocab_size");
  ExpectRefused(std::string(kLlama) + R"(, "hidden_size": "64"})", "hidden_size");
  ExpectRefused(std::string(kLlama) + R"(, "num_key_value_heads": 3})", "num_key_value_heads");
  ExpectRefused(std::string(kLlama) + R"(, "hidden_act": "gelu"})", "hidden_act");
  ExpectRefused(std::string(kLlama) + R"(, "rope_scaling": {"rope_type": "llama3"}})",
                "original_max_position_embeddings");
  ExpectRefused(std::string(kLlama) + R"(, "rope_parameters": {"rope_type": "yarn"}})",
                "rope_parameters");
  ExpectRefused(std::string(kLlama) + R"(, "rms_norm_eps": 0})", "epsilon");
  ExpectRefused(std::string(kLlama) + R"(, "head_dim": 15})", "even");
  ExpectRefused(R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": 10, "n_layer": 1,
      "n_head": 3, "n_positions": 8})",
                "n_head");
  ExpectRefused(R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": 12, "n_layer": 1,
      "n_head": 3, "n_positions": 8, "activation_function": "relu"})",
                "activation_function");
  ExpectRefused(std::string(kLlama) + R"(, "torch_dtype": "int8"})", "torch_dtype");
}

// Found by reading ParseGpt2 while writing tests/fuzz: the default n_inner = 4 * n_embd overflowed
// int64 for a huge n_embd (UB: the ASan+UBSan build stops on it). Now an error names the size.
TEST(ModelConfigTest, RefusesHugeSizesWithoutOverflow) {
  for (const char* n_embd : {"4611686018427387904", "-4611686018427387904", "9223372036854775807",
                             "-9223372036854775808"}) {
    const std::string text = std::string(R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": )") +
                             n_embd + R"(, "n_layer": 1, "n_head": 1, "n_positions": 8})";
    Result<ModelConfig> c = ParseHfConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  }
  ExpectRefused(R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": 4611686018427387904,
      "n_layer": 1, "n_head": 4, "n_positions": 8})",
                "exceeds");
}

TEST(ModelConfigTest, SlidingWindowAndLlama3ScalingAreTrainable) {
  Result<ModelConfig> m = ParseHfConfig(R"({"model_type": "mistral", "vocab_size": 10,
      "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
      "max_position_embeddings": 4096, "sliding_window": 1024})");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->sliding_window, 1024);
  EXPECT_TRUE(CheckTrainable(*m).ok());

  Result<ModelConfig> l = ParseHfConfig(std::string(kLlama) + R"(, "rope_scaling": {
      "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_DOUBLE_EQ(l->rope_scaling.factor, 8.0);
  EXPECT_EQ(l->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(CheckTrainable(*l).ok());
  Result<ModelConfig> back = ParseHfConfig(ToHfConfigJson(*l).dump());
  ASSERT_TRUE(back.ok());
  EXPECT_DOUBLE_EQ(back->rope_scaling.high_freq_factor, 4.0);

  for (const char* model : {"llama", "qwen3", "gpt2"}) {
    Result<ModelConfig> g = Golden(model);
    ASSERT_TRUE(g.ok());
    EXPECT_TRUE(CheckTrainable(*g).ok()) << model;
    EXPECT_EQ(g->weights_dtype, DType::kF32) << model;
  }
  EXPECT_TRUE(CheckTrainable(TinyLlamaPreset()).ok());
}

// Llama 3.1's table (theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192): the
// high frequencies (wavelength < 8192 / 4) are kept bit for bit, the low ones (wavelength > 8192)
// are divided by 8 exactly (fp32 division by a power of two), the band between is interpolated
// between the two. The exact interpolated values are checked against transformers by the
// llama3_rope golden (hf_golden_test.cc).
TEST(ModelConfigTest, Llama3RopeScalingTable) {
  Result<ModelConfig> l = ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10,
      "hidden_size": 256, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ModelConfig plain = *l;
  plain.rope_scaling = {};
  const std::vector<float> scaled = RopeInvFreq(*l), base = RopeInvFreq(plain);
  ASSERT_EQ(scaled.size(), 64u);
  int kept = 0, divided = 0, smoothed = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / base[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], base[i]) << i;
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_EQ(scaled[i], base[i] / 8.0f) << i;
      ++divided;
    } else {
      EXPECT_LT(scaled[i], base[i]) << i;
      EXPECT_GT(scaled[i], base[i] / 8.0f) << i;
      ++smoothed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

// The table transformers computed (recorded by scripts/make_goldens.py): bit for bit, since ferry
// repeats its fp32 operations in the same order (llama3_rope: kept, smoothed and divided
// frequencies; the others: plain RoPE with head_dim 128 and 16).
TEST(ModelConfigTest, RopeInvFreqMatchesTransformers) {
  for (const char* model : {"llama3_rope", "mistral_window", "qwen2"}) {
    Result<ModelConfig> c = Golden(model);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const nlohmann::json info = testing::GoldenJson(model);
    ASSERT_TRUE(info.contains("rope_inv_freq")) << model;
    const std::vector<float> want = info["rope_inv_freq"].get<std::vector<float>>();
    EXPECT_EQ(RopeInvFreq(*c), want) << model;
  }
}

// transformers windows Qwen2/3 blocks i >= max_window_layers only; ferry windows all or none.
TEST(ModelConfigTest, Qwen2SlidingWindowCoversAllBlocksOrNone) {
  const std::string base = R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
      "max_position_embeddings": 64, "use_sliding_window": true, "sliding_window": 16, )";
  Result<ModelConfig> all = ParseHfConfig(base + R"("max_window_layers": 0})");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->sliding_window, 16);
  Result<ModelConfig> back = ParseHfConfig(ToHfConfigJson(*all).dump());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->sliding_window, 16);
  Result<ModelConfig> none = ParseHfConfig(base + R"("max_window_layers": 2})");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->sliding_window, 0);
  Result<ModelConfig> some = ParseHfConfig(base + R"("max_window_layers": 1})");
  ASSERT_FALSE(some.ok());
  EXPECT_NE(some.status().message().find("max_window_layers"), std::string::npos);
  Result<ModelConfig> mixed = ParseHfConfig(
      base + R"("max_window_layers": 0, "layer_types": ["full_attention", "sliding_attention"]})");
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("layer_types"), std::string::npos);
}

TEST(ModelConfigTest, HfJsonRoundTrips) {
  for (const char* model : {"llama", "qwen3", "gpt2"}) {
    Result<ModelConfig> c = Golden(model);
    ASSERT_TRUE(c.ok()) << model;
    Result<ModelConfig> back = ParseHfConfig(ToHfConfigJson(*c).dump());
    ASSERT_TRUE(back.ok()) << model << ": " << back.status().ToString();
    EXPECT_EQ(ToHfConfigJson(*back), ToHfConfigJson(*c)) << model;
    EXPECT_EQ(back->qk_norm, c->qk_norm);
    EXPECT_EQ(back->head_dim, c->head_dim);
  }
}

TEST(ModelConfigTest, TinyPresetIsValid) {
  ModelConfig c = TinyLlamaPreset();
  EXPECT_TRUE(ValidateModelConfig(c).ok());
  EXPECT_GT(c.vocab_size, kByteVocabBytes);  // room for the special tokens
}

TEST(LoraConfigTest, ParsesTargets) {
  Result<uint32_t> t = ParseLoraTargets("q, v_proj,down");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, uint32_t(kLoraQ | kLoraV | kLoraDown));
  EXPECT_EQ(LoraTargetsToString(*t), "q,v,down");
  EXPECT_EQ(LoraTargetsToString(*ParseLoraTargets("all")), "all");
  Result<uint32_t> bad = ParseLoraTargets("q,qq");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'qq'"), std::string::npos);
  EXPECT_FALSE(ValidateLoraConfig({.rank = -1}).ok());
  EXPECT_FALSE(ValidateLoraConfig({.rank = 4, .alpha = 0}).ok());
  EXPECT_FALSE(ValidateLoraConfig({.rank = 4, .alpha = 8, .targets = 0}).ok());
  EXPECT_TRUE(ValidateLoraConfig({.rank = 0, .alpha = 0}).ok());  // off: alpha unused
}

}  // namespace
}  // namespace ferry
