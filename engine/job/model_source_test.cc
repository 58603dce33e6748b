// ResolveModelSource: what each kind of --model / --adapter resolves to, and the refusals. Files
// are stand-ins (empty safetensors): resolution reads config.json and job.json only; loading is
// tested end to end in tests/model_folder_cli_test.cc.
#include "engine/job/model_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/json.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

class ModelSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/ferry_model_source_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A folder with a config.json of the tiny preset and the files named in `files` (empty).
  std::string Folder(const std::string& name, std::initializer_list<const char*> files) {
    const std::string d = dir_ + "/" + name;
    fs::create_directories(d);
    std::ofstream(d + "/config.json") << ToHfConfigJson(TinyLlamaPreset()).dump();
    for (const char* f : files) std::ofstream(d + "/" + f) << "{}";
    return d;
  }

  std::string dir_;
};

TEST_F(ModelSourceTest, TinyFoldersPresetsAndConfigFiles) {
  Result<ModelSource> tiny = ResolveModelSource("tiny", "", ModelUse::kInference);
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  EXPECT_TRUE(tiny->tiny);
  EXPECT_EQ(tiny->config.vocab_size, kTinyVocabSize);

  const std::string hf = Folder("hf", {"model.safetensors", "tokenizer.json"});
  Result<ModelSource> s = ResolveModelSource(hf, "", ModelUse::kInference);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->weights_dir, hf);
  EXPECT_EQ(s->tokenizer_dir, hf);
  EXPECT_TRUE(s->adapter_dir.empty());

  // Planning takes a preset name and a config.json path too.
  fs::create_directories(dir_ + "/presets");
  fs::copy_file(hf + "/config.json", dir_ + "/presets/mine.json");
  for (const std::string& name : {std::string("mine"), hf + "/config.json", hf}) {
    Result<ModelSource> p = ResolveModelSource(name, "", ModelUse::kConfigOnly, dir_ + "/presets");
    ASSERT_TRUE(p.ok()) << name << ": " << p.status().ToString();
    EXPECT_EQ(p->config.hidden_size, TinyLlamaPreset().hidden_size) << name;
  }
  Result<ModelSource> none = ResolveModelSource("nope", "", ModelUse::kConfigOnly, dir_);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(dir_ + "/nope.json"), std::string::npos);
  // Only planning reads presets.
  EXPECT_FALSE(ResolveModelSource("mine", "", ModelUse::kTrain, dir_ + "/presets").ok());
}

TEST_F(ModelSourceTest, LoraRunFolderFindsItsBase) {
  const std::string base = Folder("base", {"model.safetensors"});
  const std::string run = Folder("run", {"adapter_config.json", "tokenizer.json"});
  // "model" as given at training time (relative to a folder we are not in), "model_path" absolute.
  std::ofstream(run + "/job.json")
      << nlohmann::json{{"model", "relative/base"}, {"model_path", base}}.dump();
  Result<ModelSource> s = ResolveModelSource(run, "", ModelUse::kInference);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->weights_dir, base);
  EXPECT_EQ(s->adapter_dir, run);
  EXPECT_EQ(s->tokenizer_dir, run);
  EXPECT_EQ(s->config_path, base + "/config.json");

  // --adapter replaces the run's own adapter; a folder without one is refused.
  const std::string other = Folder("other", {"adapter_config.json"});
  Result<ModelSource> a = ResolveModelSource(run, other, ModelUse::kInference);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->adapter_dir, other);
  EXPECT_EQ(ResolveModelSource(base, dir_, ModelUse::kInference).status().code(),
            StatusCode::kNotFound);

  // Training refuses a LoRA run folder (naming --resume) and --adapter; tiny takes no adapter.
  Result<ModelSource> t = ResolveModelSource(run, "", ModelUse::kTrain);
  EXPECT_NE(t.status().message().find("--resume"), std::string::npos) << t.status().ToString();
  EXPECT_FALSE(ResolveModelSource(base, other, ModelUse::kTrain).ok());
  EXPECT_FALSE(ResolveModelSource("tiny", other, ModelUse::kInference).ok());

  // The base gone: the error names the run's way out.
  fs::remove_all(base);
  Result<ModelSource> gone = ResolveModelSource(run, "", ModelUse::kInference);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("--adapter " + run), std::string::npos)
      << gone.status().ToString();
  EXPECT_EQ(gone.status().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace ferry
