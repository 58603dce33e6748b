#include "engine/model/master_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/json.h"
#include "engine/testing/golden_model.h"

namespace ferry {
namespace {

class MasterWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/ferry_master_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(MasterWeightsTest, InitIsSeededAndSkipsTiedAliases) {
  Result<ModelConfig> golden = LoadHfConfig(testing::GoldenPath("llama", "config.json"));
  ASSERT_TRUE(golden.ok());
  ModelConfig c = *golden;  // small: initialization is quick
  c.tie_word_embeddings = true;
  const std::vector<LayerSpec> layers = BuildLayerSpecs(c, {});
  const HostTensors a = InitMasterWeights(layers, 5), b = InitMasterWeights(layers, 5);
  const HostTensors other = InitMasterWeights(layers, 6);
  EXPECT_EQ(a.tensors, b.tensors);
  EXPECT_NE(a.tensors.at("model.embed_tokens.weight"),
            other.tensors.at("model.embed_tokens.weight"));
  EXPECT_EQ(a.tensors.count("lm_head.weight"), 0u);  // tied to the embedding
  EXPECT_EQ(a.tensors.size(), StorageParams(layers).size());
}

// Saving then loading is the identity in fp32, for GPT-2 too (Conv1D weights transposed on the way
// out and back in).
TEST_F(MasterWeightsTest, SaveLoadRoundTripsGpt2) {
  Result<testing::GoldenModel> g = testing::GoldenModel::Load("gpt2");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::vector<LayerSpec> layers = BuildLayerSpecs(g->config, {});
  HostTensors w = InitMasterWeights(layers, 1);
  ASSERT_TRUE(LoadMasterWeights(g->weights, layers, ParamSelection::kAll, w).ok());
  const std::string path = dir_ + "/m.safetensors";
  ASSERT_TRUE(SaveMasterWeights(path, layers, ParamSelection::kAll, w).ok());
  Result<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());
  HostTensors back = InitMasterWeights(layers, 2);
  ASSERT_TRUE(LoadMasterWeights(*f, layers, ParamSelection::kAll, back).ok());
  EXPECT_EQ(back.tensors, w.tensors);
  // The file holds the checkpoint's names and layout: byte-equal values to the golden's own.
  for (const ParamSpec* p : StorageParams(layers)) {
    Result<std::vector<float>> ours = f->ReadFloats(p->name),
                               theirs = g->weights.ReadFloats(p->name);
    ASSERT_TRUE(ours.ok() && theirs.ok()) << p->name;
    EXPECT_EQ(*ours, *theirs) << p->name;
  }
}

TEST_F(MasterWeightsTest, LoraRunFolderIsPeftShaped) {
  const ModelConfig c = TinyLlamaPreset();
  const LoraConfig lora{.rank = 4, .alpha = 8, .targets = kLoraQ | kLoraV};
  const std::vector<LayerSpec> layers = BuildLayerSpecs(c, lora);
  const HostTensors w = InitMasterWeights(layers, 3);
  ASSERT_TRUE(WriteFinalWeights(dir_, c, lora, layers, w, /*with_base=*/true).ok());
  Result<SafetensorsFile> adapter = SafetensorsFile::Open(dir_ + "/adapter_model.safetensors");
  ASSERT_TRUE(adapter.ok());
  EXPECT_NE(adapter->Find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
            nullptr);
  EXPECT_EQ(adapter->Find("base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"),
            nullptr);
  EXPECT_EQ(adapter->Find("model.embed_tokens.weight"), nullptr);
  Result<SafetensorsFile> base = SafetensorsFile::Open(dir_ + "/model.safetensors");
  ASSERT_TRUE(base.ok());
  EXPECT_NE(base->Find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(base->Find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), nullptr);
  std::ifstream in(dir_ + "/adapter_config.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 8.0);
  EXPECT_EQ(j["target_modules"], nlohmann::json({"q_proj", "v_proj"}));
  Result<ModelConfig> back = LoadHfConfig(dir_ + "/config.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->hidden_size, c.hidden_size);
}

// The weights are written as they are converted, one tensor at a time: one missing midway is a
// NotFound naming it, and the file already at the path stays as it was, with no temporary left.
TEST_F(MasterWeightsTest, AWeightMissingMidwayLeavesTheOldFile) {
  const ModelConfig c = TinyLlamaPreset();
  const std::vector<LayerSpec> layers = BuildLayerSpecs(c, {});
  HostTensors w = InitMasterWeights(layers, 3);
  const std::string path = dir_ + "/model.safetensors";
  ASSERT_TRUE(SaveMasterWeights(path, layers, ParamSelection::kAll, w, DType::kBF16).ok());
  Result<std::string> before = ReadWholeFile(path);
  ASSERT_TRUE(before.ok());
  const std::string missing = "model.layers.1.mlp.up_proj.weight";
  ASSERT_EQ(w.tensors.erase(missing), 1u);
  const Status s = SaveMasterWeights(path, layers, ParamSelection::kAll, w);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find(missing), std::string::npos) << s.ToString();
  EXPECT_EQ(*ReadWholeFile(path), *before);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  // What was written reads back as the weights rounded to bf16.
  Result<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  Result<std::vector<float>> back = f->ReadFloats(name);
  ASSERT_TRUE(back.ok());
  const std::vector<float>& master = w.tensors.at(name);
  ASSERT_EQ(back->size(), master.size());
  for (size_t i = 0; i < master.size(); ++i) {
    ASSERT_EQ((*back)[i], BF16ToFloat(FloatToBF16(master[i]))) << i;
  }
}

TEST_F(MasterWeightsTest, MissingTensorNamesIt) {
  Result<testing::GoldenModel> g = testing::GoldenModel::Load("llama");
  ASSERT_TRUE(g.ok());
  ModelConfig c = g->config;
  c.num_layers += 1;  // block 2 is not in the file
  const std::vector<LayerSpec> layers = BuildLayerSpecs(c, {});
  HostTensors w = InitMasterWeights(layers, 1);
  Status s = LoadMasterWeights(g->weights, layers, ParamSelection::kAll, w);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("model.layers.2."), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ferry
