// `ferry generate` as a user runs it: from run folders that `ferry train` writes (full fine-tuning
// and LoRA), greedy and sampled, and its errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/cli_testing.h"

namespace {

using ferry::testing::CliTest;
using ferry::testing::CommandResult;
using ferry::testing::Ferry;

class GenerateCliTest : public CliTest {
 protected:
  // Trains the tiny model for two small steps into dir_/name; returns the run folder.
  std::string Train(const std::string& name, const std::string& extra = "") {
    const std::string out = dir_ + "/" + name;
    CommandResult r =
        Ferry("train --steps 2 --batch-size 2 --seq-len 64 --threads 2 --out " + out + " " + extra);
    EXPECT_EQ(r.code, 0) << r.output;
    return out;
  }
  // The generated text: the output less the log lines (on stderr, merged by Ferry).
  static CommandResult Stdout(const std::string& args) {
    return ferry::testing::GeneratedText(Ferry(args));
  }
};

TEST_F(GenerateCliTest, GreedyFromARunFolderIsDeterministic) {
  const std::string run = Train("full");
  const std::string args =
      "generate --model " + run + " --prompt 'The ' --max-tokens 12 --threads 2";
  CommandResult a = Stdout(args + " --temperature 0");
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_FALSE(a.output.empty());
  EXPECT_EQ(Stdout(args + " --temperature 0").output, a.output);
  // Top-k 1 is greedy by another road (the sampler's candidate set of one).
  EXPECT_EQ(Stdout(args + " --temperature 1 --top-k 1 --seed 9").output, a.output);
  // The speed line is on stderr.
  CommandResult both = Ferry(args + " --temperature 0");
  EXPECT_NE(both.output.find("tokens/s"), std::string::npos) << both.output;
}

TEST_F(GenerateCliTest, LoraRunFolderAndSeeds) {
  const std::string run = Train("lora", "--lora-rank 4");
  ASSERT_TRUE(std::filesystem::exists(run + "/adapter_config.json"));
  const std::string args =
      "generate --model " + run + " --prompt 'Once' --max-tokens 16 --temperature 1 --threads 2";
  CommandResult a = Stdout(args + " --seed 5");
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_EQ(Stdout(args + " --seed 5").output, a.output);
  // The adapter given explicitly is the same adapter.
  EXPECT_EQ(Stdout(args + " --seed 5 --adapter " + run).output, a.output);
}

// Streamed over two CPU devices (the planner's stages round robin, each device keeping its blocks'
// KV cache), the text is one device's, greedy and sampled; the log names the devices.
TEST_F(GenerateCliTest, TwoDevicesGenerateOneDevicesText) {
  const std::string run = Train("full");
  for (const char* sampling : {"--temperature 0", "--temperature 1 --seed 3"}) {
    const std::string args =
        "generate --model " + run + " --prompt 'The ' --max-tokens 12 --threads 2 " + sampling;
    CommandResult one = Stdout(args);
    ASSERT_EQ(one.code, 0) << one.output;
    ASSERT_FALSE(one.output.empty());
    EXPECT_EQ(Stdout(args + " --devices 2").output, one.output) << sampling;
  }
  CommandResult log = Ferry("generate --model " + run +
                            " --prompt 'The ' --max-tokens 4 --threads 2 --devices cpu,cpu");
  ASSERT_EQ(log.code, 0) << log.output;
  ferry::testing::ExpectWords(log, {"2 CPU devices", "KV cache of"});
}

TEST_F(GenerateCliTest, BadInputIsOneLineAndNonZero) {
  for (const char* args :
       {"generate --prompt x --top-p 0", "generate --prompt x --temperature -1",
        "generate --model /nonexistent --prompt x", "generate --prompt x --adapter /nonexistent",
        "generate --prompt x --devices cuda"}) {
    CommandResult r = Ferry(args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("ferry generate: ", 0), 0u) << args << ": " << r.output;
  }
  // GPUs are refused for what generation cannot do there yet, never with advice about an
  // option generate does not have (--dtype), and whether or not this machine has a GPU.
  CommandResult r = Ferry("generate --prompt x --devices cuda");
  ferry::testing::ExpectWords(r, {"generation runs on CPU devices", "--devices cpu"});
  EXPECT_EQ(r.output.find("--dtype"), std::string::npos) << r.output;
}

}  // namespace
