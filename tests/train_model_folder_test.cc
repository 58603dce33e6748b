// `ferry train --model DIR` on a Hugging Face model folder that ferry wrote: the run starts from
// the folder's weights, and its output is again a folder that ferry (and transformers, see
// scripts/interop_check.py) loads, with the tokenizer files copied.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/model/model_folder.h"
#include "engine/testing/tiny_models.h"
#include "tests/cli_testing.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::Ferry;

class TrainModelFolderTest : public ferry::testing::CliTest {
 protected:
  // A tiny Qwen2 (q/k/v biases, tied embeddings) with a vocabulary the built-in byte dataset fits.
  void WriteSource(const std::string& dir) {
    ferry::Result<ferry::ModelConfig> c = ferry::ParseHfConfig(
        R"({"model_type": "qwen2", "vocab_size": 260, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 64,
            "tie_word_embeddings": true, "torch_dtype": "bfloat16"})");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const std::vector<ferry::LayerSpec> layers = ferry::BuildLayerSpecs(*c, {});
    ASSERT_TRUE(ferry::WriteModelFolder(
                    dir, *c, layers, ferry::testing::TinyWeights(layers, 9),
                    {.dtype = ferry::DType::kBF16, .max_shard_bytes = 0, .tokenizer_from = ""})
                    .ok());
    std::ofstream(dir + "/tokenizer.json") << "{}";
  }
};

TEST_F(TrainModelFolderTest, LoraTrainsOnTheFolderAndWritesALoadableAdapter) {
  WriteSource(dir_ + "/src");
  CommandResult r = Ferry("train --model " + dir_ + "/src --steps 2 --batch-size 2 --seq-len 16 " +
                          "--lora-rank 2 --out " + dir_ + "/run");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/run/tokenizer.json"));
  // The frozen base is not copied: the adapter loads onto the source folder.
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/run/model.safetensors"));
  ferry::Result<ferry::LoadedModel> m = ferry::LoadModelFolder(dir_ + "/src", dir_ + "/run");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->lora.rank, 2);
}

TEST_F(TrainModelFolderTest, FullFineTuningWritesALoadableModelFolder) {
  WriteSource(dir_ + "/src");
  CommandResult r = Ferry("train --model " + dir_ + "/src --steps 2 --batch-size 2 --seq-len 16 " +
                          "--out " + dir_ + "/run");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/run/tokenizer.json"));
  ferry::Result<ferry::LoadedModel> m = ferry::LoadModelFolder(dir_ + "/run");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config.model_type, "qwen2");
  EXPECT_EQ(m->config.weights_dtype, ferry::DType::kF32);
}

TEST_F(TrainModelFolderTest, BadFoldersAreOneLineErrors) {
  std::filesystem::create_directories(dir_ + "/empty");
  for (const std::string& model : {dir_ + "/empty", dir_ + "/nowhere"}) {
    CommandResult r = Ferry("train --model " + model + " --out " + dir_ + "/run");
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find(model), std::string::npos) << r.output;
  }
  WriteSource(dir_ + "/src");
  std::filesystem::remove(dir_ + "/src/model.safetensors");
  CommandResult r =
      Ferry("train --model " + dir_ + "/src --seq-len 16 --batch-size 2 --out " + dir_ + "/run");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("model.safetensors"), std::string::npos) << r.output;
}

}  // namespace
