// `ferry plan` as a user runs it: presets, job files shared with train, JSON,
// timelines, and the exit code when nothing fits.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli_testing.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::Ferry;

class PlanCliTest : public ferry::testing::CliTest {};

TEST_F(PlanCliTest, PresetOnAProfilePrintsThePlanAndMemoryTable) {
  CommandResult r = Ferry(
      "plan --model qwen3-0.6b --hardware 1x-rtx4090-pcie4 "
      "--seq-len 1024 --batch-size 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("qwen3-0.6b on 1x RTX 4090"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("weights.slot0"), std::string::npos);
  EXPECT_NE(r.output.find("optimizer.moments"), std::string::npos);
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos);
}

TEST_F(PlanCliTest, JsonFitsItsBudgets) {
  CommandResult r = Ferry(
      "plan --model qwen3-0.6b --hardware 2x-rtx4090-pcie4 "
      "--seq-len 512 --batch-size 6 "
      "--gpu-memory 20GiB --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_TRUE(j["feasible"].get<bool>());
  const nlohmann::json& p = j["plan"];
  EXPECT_EQ(p["budgets"]["gpu_bytes"].get<uint64_t>(), 20ull << 30);
  EXPECT_LE(p["memory"]["per_gpu"]["total_bytes"].get<uint64_t>(), 20ull << 30);
  EXPECT_EQ(p["micro_batches"].get<int>(),
            3);  // the smallest divisor of 6 that is >= GPUs + 1
  EXPECT_GT(p["predicted"]["tokens_per_s"].get<double>(), 0);
}

TEST_F(PlanCliTest, TrainJobFilePlansAsItIs) {
  std::ofstream(dir_ + "/job.toml") << "model = \"qwen3-0.6b\"\nbatch-size = 4\nseq-len = 256\n"
                                       "steps = 10\nlora-rank = 8\nout = \"run\"\nthreads = 2\n";
  CommandResult r = Ferry("plan --config " + dir_ + "/job.toml --hardware 1x-rtx3090-pcie4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("batch 4 x 256 tokens, LoRA rank 8"), std::string::npos) << r.output;
}

TEST_F(PlanCliTest, WritesTimelines) {
  CommandResult r = Ferry(
      "plan --model smollm2-135m --hardware 2x-rtx4090-pcie4 --seq-len 256 "
      "--batch-size 3 --svg " +
      dir_ + "/step.svg --trace " + dir_ + "/step.json");
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream svg(dir_ + "/step.svg");
  std::string head(4, '\0');
  svg.read(head.data(), 4);
  EXPECT_EQ(head, "<svg");
  std::ifstream trace(dir_ + "/step.json");
  const nlohmann::json t = nlohmann::json::parse(trace);
  EXPECT_FALSE(t.empty());
}

TEST_F(PlanCliTest, NothingFitsExitsThreeWithWhatWouldFit) {
  // 0.6 B parameters need about 9.6 GB of fp32 master, gradients and moments: 2
  // GiB is short, and without an NVMe directory nothing can move.
  CommandResult r = Ferry(
      "plan --model qwen3-0.6b --hardware 1x-rtx4090-pcie4 "
      "--seq-len 512 --batch-size 2 "
      "--host-memory 2GiB");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("Nothing fits. host memory is short"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fits with --lora-rank 16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fits with --host-memory"), std::string::npos) << r.output;
}

TEST_F(PlanCliTest, UnknownModelIsOneLine) {
  CommandResult r = Ferry("plan --model no-such-model");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--model 'no-such-model'"), std::string::npos) << r.output;
}

}  // namespace
