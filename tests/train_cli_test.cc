// `ferry train` as a user runs it: option parsing, job files, one-line errors, exit codes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/json.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "tests/cli_testing.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::Ferry;
using ferry::testing::kQuickTrain;

class TrainCliTest : public ferry::testing::CliTest {};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int Lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST_F(TrainCliTest, HelpDocumentsEveryOption) {
  CommandResult r = Ferry("train --help");
  EXPECT_EQ(r.code, 0);
  for (const char* opt : {"--steps", "--lr", "--batch-size", "--seq-len", "--lora-rank",
                          "--lora-alpha", "--seed", "--out", "--config", "--micro-batches",
                          "--warmup-steps", "--weight-decay", "--grad-clip", "--dtype"}) {
    EXPECT_NE(r.output.find(opt), std::string::npos) << opt;
  }
}

TEST_F(TrainCliTest, BadInputIsOneLineAndNonZero) {
  for (const std::string args :
       {"train --bogus", "train --steps abc", "train --steps 0", "train --seq-len 100000",
        "train --batch-size 10 --micro-batches 3", "train --lora-targets q,zz",
        "train --out /dev/null/sub", "train --dtype f8", "train --dtype f16 --loss-scale 3",
        "train --loss-scale-growth-interval 0"}) {
    CommandResult r = Ferry(args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.output;
    EXPECT_EQ(Lines(r.output), 1) << args << ": " << r.output;
  }
}

// A loss scale given to a dtype that needs none is said to be unused (f16 takes it without a
// word).
TEST_F(TrainCliTest, LossScaleOutsideF16IsSaidToBeUnused) {
  const std::string note = "--loss-scale and --loss-scale-growth-interval apply to --dtype f16";
  CommandResult f32 = Ferry("train --steps 1 --loss-scale 1024 --out " + dir_ + "/a" + kQuickTrain);
  ASSERT_EQ(f32.code, 0) << f32.output;
  EXPECT_NE(f32.output.find(note + "; this run is f32"), std::string::npos) << f32.output;
  CommandResult f16 =
      Ferry("train --steps 1 --dtype f16 --loss-scale 1024 --out " + dir_ + "/b" + kQuickTrain);
  ASSERT_EQ(f16.code, 0) << f16.output;
  EXPECT_EQ(f16.output.find(note), std::string::npos) << f16.output;
}

TEST_F(TrainCliTest, JobFileSetsKeysAndFlagsWin) {
  {
    std::ofstream f(dir_ + "/job.toml");
    f << "steps = 7\nlr = 0.01\nlora-rank = 4\nwarmup-steps = 2\n";
  }
  CommandResult r = Ferry("train --config " + dir_ + "/job.toml --steps 9 --batch-size 2 " +
                          "--seq-len 16 --out " + dir_ + "/run");
  EXPECT_EQ(r.code, 0) << r.output;
  // LoRA from the job file: the adapter in PEFT's format beside the (seeded)
  // base.
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/run/adapter_model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/run/adapter_config.json"));
  EXPECT_EQ(Lines(ReadFile(dir_ + "/run/metrics.jsonl")), 9);
  const std::string job = ReadFile(dir_ + "/run/job.json");
  EXPECT_NE(job.find("\"steps\": 9"), std::string::npos) << job;
  EXPECT_NE(job.find("\"lr\": 0.01"), std::string::npos) << job;
  EXPECT_NE(job.find("\"lora_rank\": 4"), std::string::npos) << job;

  {
    std::ofstream f(dir_ + "/bad.toml");
    f << "stepz = 7\n";
  }
  r = Ferry("train --config " + dir_ + "/bad.toml --out " + dir_ + "/run2");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("stepz"), std::string::npos) << r.output;
}

// One field of every line of a run's metrics.jsonl ("loss", "lr"), step by step.
std::vector<double> Metric(const std::string& run, const char* key) {
  std::ifstream metrics(run + "/metrics.jsonl");
  std::vector<double> values;
  for (std::string line; std::getline(metrics, line);) {
    values.push_back(nlohmann::json::parse(line)[key].get<double>());
  }
  return values;
}

// The losses of a run.
std::vector<double> Losses(const std::string& run) { return Metric(run, "loss"); }

// --lr-schedule: the rates a run records follow the decay it names (linear down to 0 is
// transformers' get_linear_schedule_with_warmup after the warm-up, (T - k) / (T - w)); a job file
// sets it too; job.json keeps it and --resume refuses another; an unknown one is one line.
TEST_F(TrainCliTest, LrScheduleShapesTheRates) {
  const int64_t steps = 5, warmup = 2;  // kQuickTrain's warm-up
  const double lr = 0.01;
  const std::string linear = dir_ + "/linear";
  CommandResult r = Ferry("train --steps 5 --lr 0.01 --min-lr-ratio 0 --lr-schedule linear --out " +
                          linear + kQuickTrain);
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<double> rates = Metric(linear, "lr");
  ASSERT_EQ(rates.size(), size_t(steps));
  for (int64_t k = 0; k < steps; ++k) {
    const double want = k < warmup ? lr * double(k + 1) / double(warmup)
                                   : lr * double(steps - k) / double(steps - warmup);
    EXPECT_NEAR(rates[size_t(k)], want, 1e-12) << "linear, step " << k;
  }
  EXPECT_EQ(nlohmann::json::parse(ReadFile(linear + "/job.json"))["lr_schedule"], "linear");
  r = Ferry("train --lr-schedule cosine --resume " + linear);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--lr-schedule"), std::string::npos) << r.output;

  {
    std::ofstream f(dir_ + "/constant.toml");
    f << "lr-schedule = \"constant\"\nlr = 0.01\nsteps = 4\n";
  }
  const std::string constant = dir_ + "/constant";
  r = Ferry("train --config " + dir_ + "/constant.toml --out " + constant + kQuickTrain);
  ASSERT_EQ(r.code, 0) << r.output;
  rates = Metric(constant, "lr");
  ASSERT_EQ(rates.size(), 4u);
  for (size_t k = 0; k < rates.size(); ++k) {
    EXPECT_NEAR(rates[k], k < size_t(warmup) ? lr * double(k + 1) / double(warmup) : lr, 1e-12)
        << "constant, step " << k;
  }

  r = Ferry("train --lr-schedule exponential --out " + dir_ + "/bad");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(Lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("cosine, linear, constant"), std::string::npos) << r.output;
}

// --dtype bf16 trains (bf16 weights and activations on the device, fp32 master weights): its
// losses follow the f32 run's within bf16 rounding, the first step's (same weights, same batch)
// closely; job.json records the dtype, and --resume keeps it.
TEST_F(TrainCliTest, Bf16TrainsBesideF32AndResumesInBf16) {
  const std::string job = "train --steps 6 --batch-size 4 --seq-len 64 --save-every 3 ";
  ASSERT_EQ(Ferry(job + "--out " + dir_ + "/f32").code, 0);
  CommandResult r = Ferry(job + "--dtype bf16 --out " + dir_ + "/bf16");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(", bf16 -> "), std::string::npos) << r.output;
  const std::vector<double> f32 = Losses(dir_ + "/f32"), bf16 = Losses(dir_ + "/bf16");
  ASSERT_EQ(f32.size(), 6u);
  ASSERT_EQ(bf16.size(), 6u);
  EXPECT_NE(f32, bf16);  // a different dtype really ran
  // The first loss is a mean of ln-sum-exps from one forward: 8 u relative (u = 2^-8), as the
  // goldens check (engine/model/model_runner_bf16_test.cc); later ones drift apart with the
  // updates, still within a few percent over six steps.
  EXPECT_NEAR(bf16[0], f32[0], 8 * 0x1p-8 * f32[0]);
  for (size_t i = 1; i < 6; ++i) EXPECT_NEAR(bf16[i], f32[i], 0.05 * f32[i]) << "step " << i + 1;
  EXPECT_LT(bf16[5], bf16[0]);
  const nlohmann::json saved = nlohmann::json::parse(ReadFile(dir_ + "/bf16/job.json"));
  EXPECT_EQ(saved["dtype"], "bf16");
  // Killed at step 6's checkpoint, then resumed from step 3's (the run folder's own job, so in
  // bf16): the uninterrupted run's losses, bit for bit.
  const std::string killed = dir_ + "/killed";
  r = Ferry(job + "--dtype bf16 --out " + killed, "FERRY_TEST_CHECKPOINT_KILL=6:optimizer");
  EXPECT_NE(r.code, 0);
  r = Ferry("train --resume " + killed);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(Losses(killed), bf16);
  // A resumed run keeps its dtype: asking for another is refused, naming the option.
  r = Ferry("train --dtype f32 --resume " + killed);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--dtype"), std::string::npos) << r.output;
}

// The default job cut to three updates of four sequences (quick under the
// sanitizers): the run folder a user gets.
TEST_F(TrainCliTest, DefaultJobWritesRunFolder) {
  const std::string out = dir_ + "/run";
  CommandResult r = Ferry("train --steps 3 --batch-size 4 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 3/3"), std::string::npos) << r.output;
  std::ifstream metrics(out + "/metrics.jsonl");
  std::vector<double> losses;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    EXPECT_EQ(j["step"], losses.size() + 1);
    for (const char* key : {"lr", "grad_norm", "tokens_per_s", "elapsed_s"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << line;
    }
    losses.push_back(j["loss"].get<double>());
    EXPECT_TRUE(std::isfinite(losses.back())) << line;
  }
  ASSERT_EQ(losses.size(), 3u);
  // Fresh weights predict ~uniformly over 260 tokens (loss ~ln 260 = 5.56);
  // three warm-up updates already lower it.
  EXPECT_LT(losses[2], losses[0]);
  ferry::Result<ferry::SafetensorsFile> weights =
      ferry::SafetensorsFile::Open(out + "/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  ferry::Result<std::vector<float>> embed = weights->ReadFloats("model.embed_tokens.weight");
  ASSERT_TRUE(embed.ok());
  EXPECT_EQ(embed->size(), size_t(ferry::kTinyVocabSize * ferry::TinyLlamaPreset().hidden_size));
  ferry::Result<ferry::ModelConfig> config = ferry::LoadHfConfig(out + "/config.json");
  EXPECT_TRUE(config.ok());
  EXPECT_TRUE(std::filesystem::exists(out + "/job.json"));
}

// "1.25 MiB" (FormatByteSize) in bytes; -1 when `text` holds no size at `at`.
double ParseSize(const std::string& text, size_t at) {
  char unit[8] = {};
  double v = 0;
  if (std::sscanf(text.c_str() + at, "%lf %7s", &v, unit) != 2) return -1;
  const std::string u = unit;
  return u == "B"     ? v
         : u == "KiB" ? v * 1024
         : u == "MiB" ? v * 1048576
         : u == "GiB" ? v * 1073741824
                      : -1;
}

// The host row's measured part (the rest of the peak RSS, beyond the start, the set-up's threads
// and libraries, the arenas and the pages of code) is what the run's own buffers took: it equals
// the plan's pinned + pageable host total, a dataset file's packed rows (data.rows, 2 MiB here,
// loaded before the set-up is measured) included. Before the set-up was split out, the rest held
// 4.3 MiB of thread stacks and libraries' state beyond the plan. (Not under a sanitizer, whose
// allocator keeps freed memory and redzones.)
TEST_F(TrainCliTest, HostPeakBeyondTheSetUpEqualsThePlan) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator adds to every heap byte the plan counts";
#endif
  const std::string data = dir_ + "/text.txt";
  {
    std::ofstream f(data);
    uint32_t x = 1;
    const char* words[] = {"the", "ferry", "crosses", "a", "river", "at", "dawn", "with", "cars"};
    for (int line = 0; line < 4000; ++line) {
      for (int w = 0; w < 20; ++w) {
        x = x * 1664525u + 1013904223u;
        f << words[(x >> 16) % 9] << (w + 1 < 20 ? " " : "\n");
      }
    }
  }
  // Two threads, as on the two cores this was measured on: each thread's stack and heap beyond
  // those of the set-up, and a GEMM library's buffers first filled in the first step, count in
  // the rest.
  CommandResult r = Ferry("train --steps 3 --threads 2 --data " + data + " --out " + dir_ + "/run");
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t row = r.output.find("host peak  ");
  ASSERT_NE(row, std::string::npos) << r.output;
  const size_t planned = r.output.find("planned ", row);
  ASSERT_NE(planned, std::string::npos) << r.output;
  const double measured = ParseSize(r.output, row + 11), plan = ParseSize(r.output, planned + 8);
  ASSERT_GT(measured, 0) << r.output;
  ASSERT_GT(plan, 2 << 20) << r.output;
  // What the heap's bookkeeping adds (0.2 MiB measured) and a margin; the rows alone are 2 MiB.
  EXPECT_NEAR(measured, plan, 0.02 * plan + (512 << 10)) << r.output;
}

}  // namespace
