// Model folders: write (single file, sharded, bf16), read back, logits bit for bit, for every
// supported architecture at a tiny size; PEFT's own adapter output loads; bad folders give errors
// naming the problem.
#include "engine/model/model_folder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <span>

#include "engine/json.h"
#include "engine/model/master_weights.h"
#include "engine/model/weights_io.h"
#include "engine/testing/golden_files.h"
#include "engine/testing/tiny_models.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testing::kTinyModels;
using testing::TinyLogits;
using testing::TinyTokens;
using testing::TinyWeights;

// A fresh folder named after the running test and `tag`, removed at the end of the scope.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = ::testing::TempDir() + "/ferry_folder_" + std::to_string(::getpid()) + "_" +
            test->name() + "_" + tag;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Every storage-owning parameter of `m` in fp32 by name, whatever holds it (an inference load
// serves the base from the files: those are read from there).
std::map<std::string, std::vector<float>> Fp32Values(const LoadedModel& m) {
  std::map<std::string, std::vector<float>> out;
  std::vector<float> read;
  for (const ParamSpec* p : StorageParams(m.layers)) {
    Result<std::span<const float>> v = ParameterValues(*p, m.weights, read);
    EXPECT_TRUE(v.ok()) << p->name << ": " << v.status().ToString();
    if (v.ok()) out[p->name].assign(v->begin(), v->end());
  }
  return out;
}

struct Case {
  const char* name;
  ModelFolderWriteOptions options;
};

TEST(ModelFolderTest, RoundTripsEveryArchitectureBitForBit) {
  for (const auto& [name, text] : kTinyModels) {
    Result<ModelConfig> c = ParseHfConfig(text);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
    const std::vector<LayerSpec> layers = BuildLayerSpecs(*c, LoraConfig{});
    const HostTensors w = TinyWeights(layers, 42);
    Result<std::vector<float>> want = TinyLogits(*c, LoraConfig{}, w, TinyTokens());
    ASSERT_TRUE(want.ok()) << name << ": " << want.status().ToString();
    for (const Case& k : {Case{"single", {}}, Case{"sharded", {.max_shard_bytes = 4096}}}) {
      TempDir src(std::string(name) + "_src"), dir(std::string(name) + "_" + k.name);
      WriteText(src.path() + "/tokenizer.json", "{\"model\": {}}");
      ModelFolderWriteOptions options = k.options;
      options.tokenizer_from = src.path();
      ASSERT_TRUE(WriteModelFolder(dir.path(), *c, layers, w, options).ok()) << name;
      EXPECT_TRUE(fs::exists(dir.path() + "/tokenizer.json")) << name;
      const bool sharded = k.options.max_shard_bytes > 0;
      EXPECT_EQ(fs::exists(dir.path() + "/model.safetensors.index.json"), sharded) << name;
      EXPECT_EQ(fs::exists(dir.path() + "/model.safetensors"), !sharded) << name;
      Result<LoadedModel> m = LoadModelFolder(dir.path());
      ASSERT_TRUE(m.ok()) << name << " " << k.name << ": " << m.status().ToString();
      EXPECT_EQ(m->config.sliding_window, c->sliding_window) << name;
      EXPECT_EQ(m->config.rope_scaling.kind, c->rope_scaling.kind) << name;
      // For inference the whole base is served from the files: nothing read into fp32.
      EXPECT_TRUE(m->weights.tensors.empty()) << name << " " << k.name;
      EXPECT_EQ(m->weights.files.size(), w.tensors.size()) << name << " " << k.name;
      EXPECT_EQ(Fp32Values(*m), w.tensors) << name << " " << k.name;
      Result<std::vector<float>> got = TinyLogits(m->config, m->lora, m->weights, TinyTokens());
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, *want) << name << " " << k.name << ": logits differ after the round trip";
    }
  }
}

TEST(ModelFolderTest, ShardsHoldEveryTensorOnceAndBf16RoundsToNearest) {
  Result<ModelConfig> c = ParseHfConfig(kTinyModels[0].config_json);
  ASSERT_TRUE(c.ok());
  const std::vector<LayerSpec> layers = BuildLayerSpecs(*c, LoraConfig{});
  const HostTensors w = TinyWeights(layers, 7);
  TempDir dir("1");
  ASSERT_TRUE(
      WriteModelFolder(dir.path(), *c, layers, w, {.dtype = DType::kBF16, .max_shard_bytes = 2048})
          .ok());
  json index = json::parse(testing::ReadTextFile(dir.path() + "/model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : index["weight_map"].items()) shards.insert(shard);
  EXPECT_GT(shards.size(), 2u);
  EXPECT_EQ(index["weight_map"].size(), w.tensors.size());
  json config = json::parse(testing::ReadTextFile(dir.path() + "/config.json"));
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  Result<LoadedModel> m = LoadModelFolder(dir.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::map<std::string, std::vector<float>> loaded = Fp32Values(*m);
  for (const auto& [name, values] : w.tensors) {
    const std::vector<float>& got = loaded.at(name);
    for (size_t i = 0; i < values.size(); ++i) {
      // bf16 keeps 8 significant bits: for |v| in [2^e, 2^(e+1)) an ulp is 2^(e-7), so round to
      // nearest is within half of it, 2^(e-8) <= |v| 2^-8.
      ASSERT_NEAR(got[i], values[i], std::abs(values[i]) * 0x1p-8f) << name << "[" << i << "]";
    }
  }
}

// Where a folder's tensors lie (what `ferry train` and `ferry plan` count a streamed base's reads
// by): every tensor of every shard at its offset and size in its own file; none for a folder with
// a config alone; the error naming a shard the index lists and the folder lacks.
TEST(ModelFolderTest, TensorLayoutIsWhereEachShardHoldsItsTensors) {
  Result<ModelConfig> c = ParseHfConfig(kTinyModels[0].config_json);
  ASSERT_TRUE(c.ok());
  const std::vector<LayerSpec> layers = BuildLayerSpecs(*c, LoraConfig{});
  TempDir dir("layout");
  ASSERT_TRUE(WriteModelFolder(dir.path(), *c, layers, TinyWeights(layers, 7),
                               {.dtype = DType::kBF16, .max_shard_bytes = 2048})
                  .ok());
  Result<std::shared_ptr<const TensorFileLayout>> layout = FolderTensorLayout(dir.path(), *c);
  ASSERT_TRUE(layout.ok() && *layout != nullptr) << layout.status().ToString();
  json index = json::parse(testing::ReadTextFile(dir.path() + "/model.safetensors.index.json"));
  EXPECT_EQ((*layout)->size(), index["weight_map"].size());
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    Result<SafetensorsFile> f = SafetensorsFile::Open(dir.path() + "/" + shard.get<std::string>());
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const SafetensorsTensorInfo* info = f->Find(tensor);
    ASSERT_NE(info, nullptr) << tensor;
    ASSERT_TRUE((*layout)->contains(tensor)) << tensor;
    EXPECT_EQ((*layout)->at(tensor).offset, info->offset) << tensor;
    EXPECT_EQ((*layout)->at(tensor).bytes, info->bytes) << tensor;
  }
  TempDir config_only("config_only");
  WriteText(config_only.path() + "/config.json", kTinyModels[0].config_json);
  Result<std::shared_ptr<const TensorFileLayout>> none = FolderTensorLayout(config_only.path(), *c);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(*none, nullptr);
  const std::string shard = index["weight_map"].begin()->get<std::string>();
  std::filesystem::remove(dir.path() + "/" + shard);
  Result<std::shared_ptr<const TensorFileLayout>> missing = FolderTensorLayout(dir.path(), *c);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(shard), std::string::npos)
      << missing.status().ToString();
}

// PEFT's own adapter output (the llama_lora golden, written by peft.save_pretrained) loads onto
// its base with the rank, alpha and targets PEFT recorded and the exact A/B values.
TEST(ModelFolderTest, LoadsPeftAdapterOntoItsBase) {
  const std::string base = testing::GoldenPath("llama", "");
  const std::string adapter = testing::GoldenPath("llama_lora", "");
  Result<LoadedModel> m = LoadModelFolder(base, adapter);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->lora.rank, 4);
  EXPECT_EQ(m->lora.alpha, 8.0);
  EXPECT_EQ(m->lora.targets, uint32_t(kLoraAll));
  Result<SafetensorsFile> file =
      SafetensorsFile::Open(testing::GoldenPath("llama_lora", "adapter_model.safetensors"));
  ASSERT_TRUE(file.ok());
  int lora = 0;
  for (const SafetensorsTensorInfo& t : file->tensors()) {
    EXPECT_EQ(m->weights.tensors.at(t.name), *file->ReadFloats(t.name)) << t.name;
    ++lora;
  }
  EXPECT_EQ(lora, 2 * 7 * 2);  // A and B, 7 projections, 2 blocks
}

// Writes a valid tiny llama folder into `dir` (single file, or shards when `sharded`).
void WriteTinyFolder(const std::string& dir, bool sharded) {
  Result<ModelConfig> c = ParseHfConfig(kTinyModels[0].config_json);
  ASSERT_TRUE(c.ok());
  const std::vector<LayerSpec> layers = BuildLayerSpecs(*c, LoraConfig{});
  ASSERT_TRUE(WriteModelFolder(dir, *c, layers, TinyWeights(layers, 3),
                               {.max_shard_bytes = sharded ? size_t(4096) : 0})
                  .ok());
}

void ExpectLoadError(const std::string& dir, const std::vector<std::string>& needles) {
  Result<LoadedModel> m = LoadModelFolder(dir);
  ASSERT_FALSE(m.ok()) << dir;
  for (const std::string& n : needles) {
    EXPECT_NE(m.status().message().find(n), std::string::npos)
        << "'" << n << "' not in: " << m.status().ToString();
  }
}

TEST(ModelFolderTest, BadFoldersAreErrorsNamingTheProblem) {
  {
    TempDir dir("2");
    ExpectLoadError(dir.path(), {"config.json"});
  }
  {
    TempDir dir("3");
    WriteTinyFolder(dir.path(), false);
    WriteText(dir.path() + "/config.json",
              R"({"model_type": "falcon", "architectures": ["FalconForCausalLM"]})");
    ExpectLoadError(dir.path(), {"falcon", "FalconForCausalLM"});
  }
  {
    TempDir dir("4");
    WriteTinyFolder(dir.path(), false);
    fs::remove(dir.path() + "/model.safetensors");
    ExpectLoadError(dir.path(), {"model.safetensors"});
  }
  {  // missing shard
    TempDir dir("5");
    WriteTinyFolder(dir.path(), true);
    json index = json::parse(testing::ReadTextFile(dir.path() + "/model.safetensors.index.json"));
    const std::string shard = index["weight_map"]["model.norm.weight"];
    fs::remove(dir.path() + "/" + shard);
    ExpectLoadError(dir.path(), {shard, "missing"});
  }
  {  // a tensor listed for the wrong shard
    TempDir dir("6");
    WriteTinyFolder(dir.path(), true);
    const std::string path = dir.path() + "/model.safetensors.index.json";
    json index = json::parse(testing::ReadTextFile(path));
    const std::string first = index["weight_map"]["model.embed_tokens.weight"];
    ASSERT_NE(index["weight_map"]["model.norm.weight"], first);
    index["weight_map"]["model.norm.weight"] = first;
    WriteText(path, index.dump());
    ExpectLoadError(dir.path(), {"model.norm.weight", first});
  }
  {  // wrong shape: the config says a wider MLP than the weights have
    TempDir dir("7");
    WriteTinyFolder(dir.path(), false);
    json config = json::parse(testing::ReadTextFile(dir.path() + "/config.json"));
    config["intermediate_size"] = 32;
    WriteText(dir.path() + "/config.json", config.dump());
    ExpectLoadError(dir.path(), {"mlp.gate_proj.weight", "model.safetensors", "[24, 16]"});
  }
  {  // a tensor the config does not describe (one layer fewer in config.json)
    TempDir dir("8");
    WriteTinyFolder(dir.path(), false);
    json config = json::parse(testing::ReadTextFile(dir.path() + "/config.json"));
    config["num_hidden_layers"] = 1;
    WriteText(dir.path() + "/config.json", config.dump());
    ExpectLoadError(dir.path(), {"model.layers.1.", "not a parameter"});
  }
  {  // overlapping offsets inside a shard: the safetensors header check names the tensor
    TempDir dir("9");
    WriteTinyFolder(dir.path(), false);
    const std::string path = dir.path() + "/model.safetensors";
    std::string bytes = testing::ReadTextFile(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    json header = json::parse(bytes.substr(8, n));
    header["model.norm.weight"]["data_offsets"] = header["lm_head.weight"]["data_offsets"];
    header["model.norm.weight"]["data_offsets"][1] =
        header["model.norm.weight"]["data_offsets"][0].get<int64_t>() + 64;
    std::string h = header.dump();
    ASSERT_LE(h.size(), n);
    h.resize(n, ' ');
    WriteText(path, bytes.substr(0, 8) + h + bytes.substr(8 + n));
    ExpectLoadError(dir.path(), {"overlap"});
  }
  {  // offsets past the end of the file
    TempDir dir("10");
    WriteTinyFolder(dir.path(), false);
    const std::string path = dir.path() + "/model.safetensors";
    std::string bytes = testing::ReadTextFile(path);
    WriteText(path, bytes.substr(0, bytes.size() - 8));
    ExpectLoadError(dir.path(), {"model.safetensors"});
  }
}

TEST(ModelFolderTest, ToleratesKnownExtrasOnly) {
  Result<ModelConfig> c = ParseHfConfig(kTinyModels[3].config_json);  // qwen2, tied
  ASSERT_TRUE(c.ok());
  const std::vector<LayerSpec> layers = BuildLayerSpecs(*c, LoraConfig{});
  HostTensors w = TinyWeights(layers, 5);
  TempDir dir("11");
  SafetensorsWriter writer;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (p.tied_to.empty()) AddParameter(writer, p, w.tensors.at(p.name));
    }
  }
  const std::vector<float> inv_freq(4, 1.0f);
  writer.Add("model.layers.0.self_attn.rotary_emb.inv_freq", {4}, inv_freq);
  writer.Add("lm_head.weight", {40, 16}, w.tensors.at("model.embed_tokens.weight"));
  ASSERT_TRUE(writer.Write(dir.path() + "/model.safetensors").ok());
  WriteText(dir.path() + "/config.json", kTinyModels[3].config_json);
  Result<LoadedModel> m = LoadModelFolder(dir.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(Fp32Values(*m), w.tensors);
}

// The hub's gpt2 checkpoint was saved from GPT2Model: names without "transformer.", plus the
// causal-mask buffers h.N.attn.bias.
TEST(ModelFolderTest, ReadsGpt2SavedWithoutItsPrefix) {
  Result<ModelConfig> c = ParseHfConfig(kTinyModels[5].config_json);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->family, ModelFamily::kGpt2);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(*c, LoraConfig{});
  HostTensors w = TinyWeights(layers, 6);
  TempDir dir("gpt2");
  SafetensorsWriter writer;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (!p.tied_to.empty()) continue;
      ParamSpec bare = p;
      bare.name = p.name.substr(std::string("transformer.").size());
      AddParameter(writer, bare, w.tensors.at(p.name));
    }
  }
  const std::vector<float> mask(16 * 16, 1.0f);
  writer.Add("h.0.attn.bias", {1, 1, 16, 16}, mask);
  ASSERT_TRUE(writer.Write(dir.path() + "/model.safetensors").ok());
  WriteText(dir.path() + "/config.json", kTinyModels[5].config_json);
  Result<LoadedModel> m = LoadModelFolder(dir.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(Fp32Values(*m), w.tensors);
  // The layout has each parameter under the name it has (as loaded), at its bare tensor's place.
  Result<std::shared_ptr<const TensorFileLayout>> layout = FolderTensorLayout(dir.path(), *c);
  ASSERT_TRUE(layout.ok() && *layout != nullptr) << layout.status().ToString();
  Result<SafetensorsFile> f = SafetensorsFile::Open(dir.path() + "/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (const std::string& name :
       {std::string("transformer.wte.weight"), std::string("transformer.h.0.attn.c_attn.weight")}) {
    const SafetensorsTensorInfo* info = f->Find(name.substr(std::string("transformer.").size()));
    ASSERT_NE(info, nullptr) << name;
    ASSERT_TRUE((*layout)->contains(name)) << name;
    EXPECT_EQ((*layout)->at(name).offset, info->offset) << name;
  }
}

TEST(ModelFolderTest, AdapterConfigErrorsNameTheField) {
  Result<ModelConfig> c = ParseHfConfig(kTinyModels[0].config_json);
  ASSERT_TRUE(c.ok());
  struct Bad {
    const char* json;
    const char* field;
  };
  for (const Bad& b : {
           Bad{R"({"peft_type": "IA3"})", "peft_type"},
           Bad{R"({"peft_type": "LORA", "r": 0, "lora_alpha": 8, "target_modules": ["q_proj"]})",
               "'r'"},
           Bad{R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"],
                   "use_dora": true})",
               "use_dora"},
           Bad{R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"],
                   "use_rslora": "yes"})",
               "use_rslora"},
           Bad{R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["lm_head"]})",
               "lm_head"},
       }) {
    Result<LoraConfig> l = ParsePeftAdapterConfig(b.json, *c);
    ASSERT_FALSE(l.ok()) << b.json;
    EXPECT_NE(l.status().message().find(b.field), std::string::npos) << l.status().ToString();
  }
  Result<LoraConfig> ok = ParsePeftAdapterConfig(
      R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj"],
          "rank_pattern": {}, "modules_to_save": null})",
      *c);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->targets, uint32_t(kLoraQ | kLoraV));
  EXPECT_FALSE(ok->rslora);
  EXPECT_EQ(ok->scaling(), 2.0);
  // rsLoRA, as PEFT scales it: lora_alpha / sqrt(r); ferry's own adapter_config.json says so.
  Result<LoraConfig> rs = ParsePeftAdapterConfig(
      R"({"peft_type": "LORA", "r": 16, "lora_alpha": 8, "target_modules": ["q_proj"],
          "use_rslora": true})",
      *c);
  ASSERT_TRUE(rs.ok()) << rs.status().ToString();
  EXPECT_TRUE(rs->rslora);
  EXPECT_EQ(rs->scaling(), 2.0);
  for (const bool rslora : {false, true}) {
    const LoraConfig lora{.rank = 16, .alpha = 8, .targets = kLoraQ, .rslora = rslora};
    Result<LoraConfig> back = ParsePeftAdapterConfig(PeftAdapterConfig(*c, lora).dump(), *c);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, lora);
  }
}

}  // namespace
}  // namespace ferry
