// `ferry train --model DIR` on a Hugging Face model folder that ferry wrote: the run starts from
// the folder's weights, and its output is again a folder that ferry (and transformers, see
// scripts/interop_check.py) loads, with the tokenizer files copied.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/json.h"
#include "engine/model/model_folder.h"
#include "engine/testing/tiny_models.h"
#include "tests/cli_testing.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::Ferry;

class TrainModelFolderTest : public ferry::testing::CliTest {
 protected:
  // By default a tiny Qwen2 (q/k/v biases, tied embeddings) with a vocabulary the built-in byte
  // dataset fits; bf16 files.
  void WriteSource(const std::string& dir,
                   const std::string& config =
                       R"({"model_type": "qwen2", "vocab_size": 260, "hidden_size": 16,
                           "intermediate_size": 24, "num_hidden_layers": 2,
                           "num_attention_heads": 2, "num_key_value_heads": 1,
                           "max_position_embeddings": 64, "tie_word_embeddings": true,
                           "torch_dtype": "bfloat16"})",
                   uint64_t seed = 9) {
    ferry::Result<ferry::ModelConfig> c = ferry::ParseHfConfig(config);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const std::vector<ferry::LayerSpec> layers = ferry::BuildLayerSpecs(*c, {});
    ASSERT_TRUE(ferry::WriteModelFolder(dir, *c, layers, ferry::testing::TinyWeights(layers, seed),
                                        {.dtype = ferry::DType::kBF16, .max_shard_bytes = 0})
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
  {  // Fields ferry does not read, which the run's config.json keeps (token ids among them).
    std::ifstream in(dir_ + "/src/config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["eos_token_id"] = 257;
    config["initializer_range"] = 0.01;
    std::ofstream(dir_ + "/src/config.json") << config.dump(2);
  }
  CommandResult r = Ferry("train --model " + dir_ + "/src --steps 2 --batch-size 2 --seq-len 16 " +
                          "--out " + dir_ + "/run");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/run/tokenizer.json"));
  ferry::Result<ferry::LoadedModel> m = ferry::LoadModelFolder(dir_ + "/run");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config.model_type, "qwen2");
  EXPECT_EQ(m->config.weights_dtype, ferry::DType::kF32);
  std::ifstream in(dir_ + "/run/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config.value("eos_token_id", 0), 257) << config.dump();
  EXPECT_EQ(config.value("initializer_range", 0.0), 0.01) << config.dump();
  EXPECT_EQ(config.value("torch_dtype", ""), "float32") << config.dump();
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

// A tiny Llama in bf16 files whose LoRA base streams from them when host RAM is short.
constexpr const char* kStreamedLlama = R"({"model_type": "llama", "vocab_size": 260,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";

// `ferry plan` on a model folder counts the drive's blocks a streamed LoRA base takes where the
// folder's files hold its tensors; from the config alone (a folder without weights) it counts the
// most they can take: more, for the same stages and tiers; so does a folder whose weights cannot be
// read (a shard not downloaded yet), saying why.
TEST_F(TrainModelFolderTest, PlanCountsTheBlocksWhereTheFolderHoldsTheBase) {
  const std::string src = dir_ + "/src", config_only = dir_ + "/config_only";
  ASSERT_NO_FATAL_FAILURE(WriteSource(src, kStreamedLlama, 5));
  std::filesystem::create_directories(config_only);
  std::filesystem::create_directories(dir_ + "/nvme");
  std::filesystem::copy_file(src + "/config.json", config_only + "/config.json");
  auto plan = [&](const std::string& model, const std::string& flags) {
    const std::string out = dir_ + "/plan.json";
    std::filesystem::remove(out);
    Ferry("plan --model " + model + flags, "", out);  // no plan (empty) when nothing fits
    std::ifstream in(out);
    return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false)
        .value("plan", nlohmann::json::object());
  };
  std::string job;
  nlohmann::json from_files, from_config;
  for (const char* host : {"1100KiB", "1000KiB", "900KiB", "800KiB"}) {  // short of the base in RAM
    job = " --lora-rank 4 --hardware 1x-rtx4090-pcie4 --seq-len 32 --batch-size 2 --json " +
          std::string("--host-memory ") + host + " --nvme-dir " + dir_ + "/nvme";
    from_files = plan(src, job);
    if (from_files.value("tiers", nlohmann::json::object()).value("frozen_weights", "") == "nvme")
      break;
  }
  from_config = plan(config_only, job);
  ASSERT_TRUE(from_files.contains("tiers") && from_config.contains("tiers")) << job;
  EXPECT_EQ(from_files.at("tiers"), from_config.at("tiers"));
  EXPECT_EQ(from_files.at("tiers").at("frozen_weights"), "nvme") << from_files.dump();
  EXPECT_EQ(from_files.at("forward_stages"), from_config.at("forward_stages"));
  EXPECT_FALSE(from_files.at("frozen_base_reads_at_most").get<bool>());
  EXPECT_TRUE(from_config.at("frozen_base_reads_at_most").get<bool>());
  const double exact = from_files.at("predicted").at("nvme_read_bytes_per_step").get<double>();
  const double most = from_config.at("predicted").at("nvme_read_bytes_per_step").get<double>();
  EXPECT_GT(exact, 0);
  EXPECT_LT(exact, most);
  // Weights that cannot be read (a shard not downloaded yet, a damaged file) still plan, at the
  // most, saying why; `ferry train` refuses them.
  std::ofstream(src + "/model.safetensors", std::ios::trunc) << "not safetensors";
  const nlohmann::json unread = plan(src, job);
  ASSERT_TRUE(unread.contains("predicted")) << unread.dump();
  EXPECT_EQ(unread.at("predicted").at("nvme_read_bytes_per_step").get<double>(), most);
  EXPECT_TRUE(unread.at("frozen_base_reads_at_most").get<bool>());
  CommandResult text = Ferry("plan --model " + src + job.substr(0, job.find(" --json")) +
                             job.substr(job.find(" --json") + 7));
  EXPECT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("model.safetensors"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("counted at the most they can take"), std::string::npos)
      << text.output;
}

// --lora-rank over --devices 2 with host RAM short and --nvme-dir: the plan streams the frozen
// base each step, from the model folder's files (bf16, widened to the CPU devices' f32 as it is
// packed: no copy of it in RAM or on the drive) or, for QLoRA, from a copy of its NF4 codes
// converted once into --nvme-dir (which keeps nothing of it after the run); the start says which,
// the losses are the RAM run's bit for bit, and the report's NVMe reads per step (the blocks the
// drive read of the last step's base) are the plan's.
TEST_F(TrainModelFolderTest, AStreamedLoraBaseEqualsItHeldInRam) {
  const std::string src = dir_ + "/src";
  ASSERT_NO_FATAL_FAILURE(WriteSource(src, kStreamedLlama, 5));
  std::filesystem::create_directories(dir_ + "/nvme");
  struct Case {
    const char* flags;
    const char* says;
    std::vector<int> kib;  // host budgets to try: the base does not fit as mirrors, the rest does
  };
  for (const Case& k : {Case{"", "the frozen base streamed from the model's files", {1500, 1400}},
                        Case{"--quantize nf4 ",
                             "the frozen base streamed from a copy converted on NVMe",
                             {1300, 1200, 1100, 1000, 960, 940, 900, 800}}}) {
    const std::string job = "train --model " + src + " --lora-rank 4 " + k.flags +
                            "--devices 2 --threads 1 --batch-size 2 --seq-len 32 --steps 3 ";
    CommandResult ram = Ferry(job + "--force --out " + dir_ + "/ram");
    ASSERT_EQ(ram.code, 0) << ram.output;
    CommandResult r;
    bool streamed = false;
    for (int kib : k.kib) {
      r = Ferry(job + "--host-memory " + std::to_string(kib) + "KiB --nvme-dir " + dir_ +
                "/nvme --force --out " + dir_ + "/nv");
      streamed = r.code == 0 && r.output.find(k.says) != std::string::npos;
      if (streamed) break;
    }
    ASSERT_TRUE(streamed) << r.output;
    EXPECT_EQ(r.output.find("frozen base converted") != std::string::npos, *k.flags != 0)
        << r.output;
    EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/nvme")) << k.flags;
    auto losses = [](const std::string& run) {
      std::ifstream in(run + "/metrics.jsonl");
      std::vector<double> out;
      for (std::string line; std::getline(in, line);) {
        out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
      }
      return out;
    };
    EXPECT_EQ(losses(dir_ + "/nv").size(), 3u) << k.flags;
    EXPECT_EQ(losses(dir_ + "/nv"), losses(dir_ + "/ram")) << k.flags;
    // "NVMe/step  X read, Y written    planned X read, Y written"
    const size_t at = r.output.find("  NVMe/step ");
    ASSERT_NE(at, std::string::npos) << r.output;
    const std::string row = r.output.substr(at, r.output.find('\n', at) - at);
    const size_t planned = row.find("planned ");
    ASSERT_NE(planned, std::string::npos) << row;
    // The base is read in whole blocks of the drive, where the plan found its tensors in the
    // model's files (all of the base, or with NF4 the norms and the head) and the copy.
    std::string measured = row.substr(12, planned - 12);
    measured.erase(measured.find_last_not_of(' ') + 1);
    measured.erase(0, measured.find_first_not_of(' '));
    EXPECT_EQ(measured, row.substr(planned + 8)) << row;
    EXPECT_EQ(measured.find("0 B read"), std::string::npos) << row;
  }
}

// The built-in `tiny` (a seeded base, held in fp32) with host RAM short over bf16 CPU devices:
// its base is converted once into --nvme-dir and streamed from there; the run writes the adapter
// and the seeded base (model.safetensors, seeded again rather than read back rounded) of the RAM
// run byte for byte, and leaves nothing in --nvme-dir.
TEST_F(TrainModelFolderTest, ASeededBaseStreamedFromItsCopyWritesTheRamRunsFiles) {
  const std::string job =
      "train --model tiny --lora-rank 4 --devices 2 --threads 1 --dtype bf16 --batch-size 2 "
      "--seq-len 32 --steps 2 --force ";
  CommandResult ram = Ferry(job + "--out " + dir_ + "/ram");
  ASSERT_EQ(ram.code, 0) << ram.output;
  std::filesystem::create_directories(dir_ + "/nvme");
  CommandResult r;
  bool streamed = false;
  for (const char* budget : {"6MiB", "5MiB"}) {
    r = Ferry(job + "--host-memory " + budget + " --nvme-dir " + dir_ + "/nvme --out " + dir_ +
              "/nv");
    streamed =
        r.code == 0 && r.output.find("streamed from a copy converted on NVMe") != std::string::npos;
    if (streamed) break;
  }
  ASSERT_TRUE(streamed) << r.output;
  EXPECT_NE(r.output.find("the frozen base converted to bf16 on NVMe"), std::string::npos)
      << r.output;
  for (const char* file : {"adapter_model.safetensors", "model.safetensors"}) {
    std::ifstream a(dir_ + "/ram/" + file, std::ios::binary),
        b(dir_ + "/nv/" + file, std::ios::binary);
    const std::string want((std::istreambuf_iterator<char>(a)), {}),
        got((std::istreambuf_iterator<char>(b)), {});
    EXPECT_FALSE(want.empty()) << file;
    EXPECT_TRUE(got == want) << file << " differs from the RAM run's";
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/nvme"));
}

}  // namespace
