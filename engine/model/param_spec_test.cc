#include "engine/model/param_spec.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "engine/json.h"
#include "engine/testing/golden_files.h"

namespace ferry {
namespace {

struct Golden {
  ModelConfig config;
  nlohmann::json info;
};

Golden Load(const char* model, const char* config_dir) {
  Result<ModelConfig> c = LoadHfConfig(testing::GoldenPath(config_dir, "config.json"));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  nlohmann::json info = testing::GoldenJson(model);
  EXPECT_FALSE(info.is_discarded()) << model;
  return {c.ok() ? *c : ModelConfig{}, info};
}

std::map<std::string, const ParamSpec*> ByName(const std::vector<LayerSpec>& layers) {
  std::map<std::string, const ParamSpec*> m;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) m[p.name] = &p;
  }
  return m;
}

// Every parameter transformers lists (name, shape, decay) is in ferry's specs and vice versa,
// tied aliases aside; the counts equal transformers' num_parameters().
void ExpectMatchesGolden(const char* model) {
  Golden g = Load(model, model);
  std::vector<LayerSpec> layers = BuildLayerSpecs(g.config, LoraConfig{});
  ASSERT_EQ(layers.size(), size_t(g.config.num_layers) + 2);
  EXPECT_EQ(layers.front().kind, LayerKind::kEmbedding);
  EXPECT_EQ(layers.back().kind, LayerKind::kHead);
  auto specs = ByName(layers);
  size_t owners = 0;
  for (auto& [name, p] : specs) owners += p->tied_to.empty();
  ASSERT_EQ(owners, g.info["parameters"].size()) << model;
  for (const auto& gp : g.info["parameters"]) {
    const std::string name = gp["name"];
    auto it = specs.find(name);
    ASSERT_NE(it, specs.end()) << model << ": ferry has no " << name;
    EXPECT_EQ(it->second->shape, gp["shape"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(it->second->decays, gp["decay"].get<bool>()) << name;
    EXPECT_TRUE(it->second->trainable) << name;
    EXPECT_TRUE(it->second->tied_to.empty()) << name;
  }
  for (const auto& pair : g.info["tied"]) {  // [alias, owner]
    auto it = specs.find(pair[0].get<std::string>());
    ASSERT_NE(it, specs.end()) << pair.dump();
    EXPECT_EQ(it->second->tied_to, pair[1].get<std::string>());
  }
  EXPECT_EQ(CountParameters(layers), g.info["num_parameters"].get<int64_t>()) << model;
  EXPECT_EQ(CountTrainableParameters(layers), g.info["num_trainable"].get<int64_t>()) << model;
}

TEST(ParamSpecTest, LlamaMatchesTransformers) { ExpectMatchesGolden("llama"); }
TEST(ParamSpecTest, Qwen3MatchesTransformers) { ExpectMatchesGolden("qwen3"); }
TEST(ParamSpecTest, Gpt2MatchesTransformers) { ExpectMatchesGolden("gpt2"); }

TEST(ParamSpecTest, Gpt2Conv1DIsTransposed) {
  Golden g = Load("gpt2", "gpt2");
  auto layers = BuildLayerSpecs(g.config, LoraConfig{});
  auto specs = ByName(layers);
  const ParamSpec* c_attn = specs.at("transformer.h.0.attn.c_attn.weight");
  EXPECT_TRUE(c_attn->transposed);
  EXPECT_EQ(c_attn->shape, (std::vector<int64_t>{48, 144}));  // (in, out) as Conv1D stores it
}

TEST(ParamSpecTest, LoraMatchesPeft) {
  Golden g = Load("llama_lora", "llama");
  const nlohmann::json& l = g.info["lora"];
  LoraConfig lora{.rank = l["r"], .alpha = l["alpha"], .targets = kLoraAll};
  auto layers = BuildLayerSpecs(g.config, lora);
  auto specs = ByName(layers);
  size_t lora_params = 0;
  for (auto& [name, p] : specs) {
    if (p->lora) {
      ++lora_params;
      EXPECT_TRUE(p->trainable);
      EXPECT_TRUE(p->decays);
    } else {
      EXPECT_FALSE(p->trainable) << name << " must be frozen under LoRA";
    }
  }
  EXPECT_EQ(lora_params, g.info["parameters"].size());
  for (const auto& gp : g.info["parameters"]) {
    auto it = specs.find(gp["name"].get<std::string>());
    ASSERT_NE(it, specs.end()) << gp["name"];
    EXPECT_EQ(it->second->shape, gp["shape"].get<std::vector<int64_t>>()) << gp["name"];
  }
  EXPECT_EQ(CountTrainableParameters(layers), g.info["num_trainable"].get<int64_t>());
  EXPECT_EQ(CountParameters(layers), g.info["num_parameters"].get<int64_t>());
}

// Hand-computed for the golden Llama: C = 64, q_dim 64, kv_dim 32, I = 64, H = 4, head_dim 16,
// V = 97, B = 2, T = 11 (N = 22 tokens).
TEST(ParamSpecTest, LlamaBlockCostByHand) {
  Golden g = Load("llama", "llama");
  auto layers = BuildLayerSpecs(g.config, LoraConfig{});
  const BatchShape shape{2, 11};
  // sum of in*out over q, k, v, o, gate, up, down = 4096 + 2048 + 2048 + 4096 + 3 * 4096 = 24576
  const double linear = 2.0 * 22 * 24576;  // 1,081,344
  // causal pairs = B * H * T(T+1)/2 = 2 * 4 * 66 = 528; forward 4 * head_dim per pair
  const double attention = 4.0 * 16 * 528;  // 33,792
  LayerCost block = ComputeLayerCost(g.config, LoraConfig{}, layers[1], shape);
  EXPECT_DOUBLE_EQ(block.forward_flops, linear + attention);
  EXPECT_DOUBLE_EQ(block.backward_flops, 2 * linear + 2 * attention);
  EXPECT_EQ(block.input_bytes, 22u * 64 * 4);
  EXPECT_EQ(block.output_bytes, 22u * 64 * 4);
  // Activations per token: xn1 64, q 64, k 32, v 32, attention out 64, x1 64, xn2 64, gate/up/h
  // 3 * 64 = 576; fp32 stats per token: 2 rstd + 4 lse = 6.
  EXPECT_EQ(block.saved_bytes, 22u * (576 + 6) * 4);
  // bf16 activations halve the activation part only.
  EXPECT_EQ(ComputeLayerCost(g.config, LoraConfig{}, layers[1], shape, DType::kBF16).saved_bytes,
            22u * (576 * 2 + 6 * 4));

  LayerCost head = ComputeLayerCost(g.config, LoraConfig{}, layers.back(), shape);
  EXPECT_DOUBLE_EQ(head.forward_flops, 2.0 * 22 * 64 * 97);
  EXPECT_DOUBLE_EQ(head.backward_flops, 2 * 2.0 * 22 * 64 * 97);
  LayerCost emb = ComputeLayerCost(g.config, LoraConfig{}, layers.front(), shape);
  EXPECT_EQ(emb.forward_flops, 0);

  // LoRA r = 4 on all seven: sum of (in + out) = 128 + 96 + 96 + 128 + 3 * 128 = 832.
  LoraConfig lora{.rank = 4, .alpha = 8};
  auto lora_layers = BuildLayerSpecs(g.config, lora);
  const double low_rank = 2.0 * 22 * 4 * 832;  // 146,432
  LayerCost lb = ComputeLayerCost(g.config, lora, lora_layers[1], shape);
  EXPECT_DOUBLE_EQ(lb.forward_flops, linear + low_rank + attention);
  // Frozen base: input gradient only (no weight-gradient GEMM); adapters: dA, dB and dX.
  EXPECT_DOUBLE_EQ(lb.backward_flops, linear + 2 * low_rank + 2 * attention);
  EXPECT_EQ(lb.saved_bytes, block.saved_bytes + 22u * 7 * 4 * 4);  // x A^T per adapter
  LayerCost lh = ComputeLayerCost(g.config, lora, lora_layers.back(), shape);
  EXPECT_DOUBLE_EQ(lh.backward_flops, 2.0 * 22 * 64 * 97);  // frozen head: dX only
}

// Every preset in configs/models/ parses, and its parameter count equals the count in that
// folder's README (which equals what each model's card or loader reports).
TEST(ParamSpecTest, PresetParameterCounts) {
  const std::pair<const char*, int64_t> presets[] = {
      {"gpt2", 124439808},
      {"gpt2-medium", 354823168},
      {"gpt2-large", 774030080},
      {"gpt2-xl", 1557611200},
      {"llama-3.2-1b", 1235814400},
      {"llama-3.2-3b", 3212749824},
      {"llama-3.1-8b", 8030261248},
      {"llama-3.1-70b", 70553706496},
      {"qwen3-0.6b", 596049920},
      {"qwen3-1.7b", 1720574976},
      {"qwen3-8b", 8190735360},
      {"qwen3-32b", 32762123264},
      {"mistral-7b-v0.1", 7241732096},
      {"smollm2-135m", 134515008},
  };
  for (auto [name, count] : presets) {
    Result<ModelConfig> c =
        LoadHfConfig(testing::SourceDir() + "/configs/models/" + name + ".json");
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
    EXPECT_EQ(CountParameters(BuildLayerSpecs(*c, LoraConfig{})), count) << name;
  }
}

TEST(ParamSpecTest, Gpt2LoraSharesFusedQkv) {
  Golden g = Load("gpt2", "gpt2");
  LoraConfig lora{.rank = 2, .alpha = 4, .targets = kLoraQ};
  auto layers = BuildLayerSpecs(g.config, lora);
  auto specs = ByName(layers);
  const ParamSpec* a = specs.at("base_model.model.transformer.h.1.attn.c_attn.lora_A.weight");
  const ParamSpec* b = specs.at("base_model.model.transformer.h.1.attn.c_attn.lora_B.weight");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 48}));
  EXPECT_EQ(b->shape, (std::vector<int64_t>{144, 2}));
  EXPECT_EQ(specs.count("base_model.model.transformer.h.1.mlp.c_fc.lora_A.weight"), 0u);
}

}  // namespace
}  // namespace ferry
