#include "engine/job/job_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/json.h"
#include "engine/testing/golden_files.h"

namespace ferry {
namespace {

// Expects `job` to be refused with a message that names `option`.
void ExpectRefused(const JobSpec& job, const std::string& option) {
  Status s = ValidateJobSpec(job, TinyLlamaPreset());
  ASSERT_FALSE(s.ok()) << option;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(option), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "errors are one line";
}

TEST(JobSpecTest, DefaultsAreValid) {
  JobSpec job;
  Result<ModelConfig> m = ResolveModel(job);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(ValidateJobSpec(job, *m).ok());
}

TEST(JobSpecTest, RefusesImpossibleSizes) {
  auto with = [](auto edit) {
    JobSpec j;
    edit(j);
    return j;
  };
  ExpectRefused(with([](JobSpec& j) { j.steps = 0; }), "--steps");
  ExpectRefused(with([](JobSpec& j) { j.batch_size = 0; }), "--batch-size");
  ExpectRefused(with([](JobSpec& j) { j.batch_size = 10, j.micro_batches = 4; }),
                "--micro-batches");
  ExpectRefused(with([](JobSpec& j) { j.seq_len = 4096; }), "--seq-len");
  ExpectRefused(with([](JobSpec& j) { j.lr = -1; }), "--lr");
  ExpectRefused(with([](JobSpec& j) { j.warmup_steps = -1; }), "--warmup-steps");
  ExpectRefused(with([](JobSpec& j) { j.weight_decay = -0.1; }), "--weight-decay");
  ExpectRefused(with([](JobSpec& j) { j.grad_clip = -1; }), "--grad-clip");
  ExpectRefused(with([](JobSpec& j) { j.beta2 = 1.0; }), "--beta1 and --beta2");
  ExpectRefused(with([](JobSpec& j) { j.lora.rank = -2; }), "--lora-rank");
  ExpectRefused(with([](JobSpec& j) { j.lora.rslora = true; }), "--lora-rslora scales");
  ExpectRefused(with([](JobSpec& j) { j.val_fraction = 0.1; }), "--data FILE");
  ExpectRefused(with([](JobSpec& j) { j.data = "x.jsonl", j.val_fraction = 1; }), "--val-fraction");
  ExpectRefused(with([](JobSpec& j) { j.data = "x.jsonl", j.eval_every = 5; }), "--eval-every");
  ExpectRefused(with([](JobSpec& j) { j.data = "x.jsonl", j.chat_template = "jinja"; }),
                "--chat-template");
  ExpectRefused(with([](JobSpec& j) { j.data = "x.jsonl", j.long_examples = "drop"; }),
                "--long-examples");
  ExpectRefused(with([](JobSpec& j) { j.devices = 0; }), "--devices");
  ExpectRefused(with([](JobSpec& j) { j.data = "x.jsonl", j.epochs = -1; }), "--epochs");
  ExpectRefused(with([](JobSpec& j) { j.data = "x.jsonl", j.epochs = std::nan(""); }), "--epochs");
  ExpectRefused(with([](JobSpec& j) { j.epochs = 2; }), "--epochs needs a --data file");
  ExpectRefused(with([](JobSpec& j) { j.data = "x.jsonl", j.epochs = 1e30; }), "--epochs");
  EXPECT_TRUE(ValidateJobSpec(with([](JobSpec& j) { j.data = "x.jsonl", j.epochs = 0.5; }),
                              TinyLlamaPreset())
                  .ok());
  // Budgets are a plan's, and every device count runs one (one device included).
  EXPECT_TRUE(
      ValidateJobSpec(with([](JobSpec& j) { j.nvme_dir = "/nvme"; }), TinyLlamaPreset()).ok());
  EXPECT_TRUE(
      ValidateJobSpec(with([](JobSpec& j) { j.host_memory = "1GiB"; }), TinyLlamaPreset()).ok());
  // Validation on several devices is accepted (it runs forward only through the executor).
  EXPECT_TRUE(ValidateJobSpec(
                  with([](JobSpec& j) { j.data = "x.jsonl", j.val_fraction = 0.1, j.devices = 2; }),
                  TinyLlamaPreset())
                  .ok());
  EXPECT_FALSE(ResolveModel(with([](JobSpec& j) { j.model = "/nonexistent"; })).ok());
}

TEST(JobSpecTest, RunFolderMustBeWritable) {
  const std::string base = ::testing::TempDir() + "/ferry_job_" + std::to_string(::getpid());
  EXPECT_TRUE(PrepareRunFolder(base + "/a/b").ok());
  EXPECT_TRUE(std::filesystem::is_directory(base + "/a/b"));
  // A regular file where the folder should be (works even as root, unlike permissions).
  { std::ofstream(base + "/file") << "x"; }
  Status s = PrepareRunFolder(base + "/file");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--out"), std::string::npos) << s.message();
  EXPECT_FALSE(PrepareRunFolder(base + "/file/sub").ok());

  JobSpec job;
  job.out = base + "/a/b";
  job.lora = {.rank = 8, .alpha = 16, .targets = kLoraQ | kLoraV};
  ASSERT_TRUE(WriteJobJson(job, TinyLlamaPreset()).ok());
  nlohmann::json j =
      nlohmann::json::parse(testing::ReadTextFile(job.out + "/job.json"), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["steps"], job.steps);
  EXPECT_EQ(j["lora_rank"], 8);
  EXPECT_EQ(j["lora_targets"], "q,v");
  EXPECT_EQ(j["model_config"]["hidden_size"], TinyLlamaPreset().hidden_size);
  std::filesystem::remove_all(base);
}

// A job with every option away from its default.
JobSpec EveryOptionSet() {
  JobSpec job;
  job.model = "some/base";
  job.data = "train.jsonl";
  job.val_data = "val.jsonl";
  job.val_fraction = 0.25;
  job.eval_every = 7;
  job.eval_batches = 3;
  job.chat_template = "llama3";
  job.long_examples = "truncate";
  job.skip_bad_lines = true;
  job.train_on_prompt = true;
  job.steps = 77;
  job.batch_size = 24;
  job.micro_batches = 3;
  job.seq_len = 64;
  job.lr = 0.0123;
  job.warmup_steps = 5;
  job.min_lr_ratio = 0.25;
  job.lr_schedule = LrDecay::kLinear;
  job.epochs = 1.5;
  job.weight_decay = 0.01;
  job.beta1 = 0.8;
  job.beta2 = 0.99;
  job.adam_eps = 1e-6;
  job.grad_clip = 0.5;
  job.stale_updates = true;
  job.seed = 99;
  job.lora = {.rank = 4,
              .alpha = 8,
              .targets = kLoraQ | kLoraV,
              .quantize = BaseQuant::kNf4,
              .double_quant = false,
              .rslora = true};
  job.threads = 2;
  job.devices = 3;
  job.device_kind = "cuda";
  job.gpus = {1, 0, 1};
  job.dtype = "bf16";
  job.loss_scale = 1024;
  job.loss_scale_growth_interval = 50;
  job.host_memory = "2GiB";
  job.gpu_memory = "4GiB";
  job.nvme_dir = "/mnt/nvme";
  job.out = "somewhere";
  job.save_every = 5;
  job.keep_checkpoints = 2;
  job.checkpoint_compress = true;
  return job;
}

// --resume reads job.json back: every option survives the round trip; a wrong type names the key.
TEST(JobSpecTest, JsonRoundTrip) {
  const JobSpec job = EveryOptionSet();
  const nlohmann::json j = JobSpecToJson(job, TinyLlamaPreset());
  // The job really sets every key away from the default (bar the two constants), so the round
  // trip below covers each of them.
  const nlohmann::json defaults = JobSpecToJson(JobSpec{}, TinyLlamaPreset());
  for (const auto& [key, value] : j.items()) {
    if (key == "schedule" || key == "model_config") continue;
    EXPECT_FALSE(defaults.contains(key) && defaults[key] == value) << key << " is the default";
  }
  Result<JobSpec> back = JobSpecFromJson(j, "job.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == job) << JobSpecToJson(*back, TinyLlamaPreset()).dump(2);
  EXPECT_EQ(JobSpecToJson(*back, TinyLlamaPreset()), j);

  // A job.json from before --lr-schedule existed resumes with the cosine it ran.
  nlohmann::json older = j;
  older.erase("lr_schedule");
  Result<JobSpec> old_job = JobSpecFromJson(older, "job.json");
  ASSERT_TRUE(old_job.ok()) << old_job.status().ToString();
  EXPECT_EQ(old_job->lr_schedule, LrDecay::kCosine);

  nlohmann::json bad = j;
  bad["seq_len"] = "long";
  Result<JobSpec> r = JobSpecFromJson(bad, "job.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("seq_len"), std::string::npos) << r.status().message();
  // Named values (lora_targets, quantize, lr_schedule) are parsed, and a bad one names its key.
  for (const auto& [key, value] :
       {std::pair{"lora_targets", "q,x"}, {"quantize", "nf5"}, {"lr_schedule", "step"}}) {
    nlohmann::json named = j;
    named[key] = value;
    Result<JobSpec> n = JobSpecFromJson(named, "job.json");
    ASSERT_FALSE(n.ok()) << key;
    EXPECT_NE(n.status().message().find(std::string("job.json: ") + key), std::string::npos)
        << n.status().message();
  }
}

// No key is saved but not restored: JobSpecFromJson knows every key JobSpecToJson writes, and
// reports one it does not know.
TEST(JobSpecTest, EveryKeyWrittenIsRead) {
  nlohmann::json j = JobSpecToJson(EveryOptionSet(), TinyLlamaPreset());
  ASSERT_TRUE(j.contains("model_path"));
  std::vector<std::string> unknown = {"stale"};
  ASSERT_TRUE(JobSpecFromJson(j, "job.json", &unknown).ok());
  EXPECT_TRUE(unknown.empty()) << "written but not read: " << unknown.front();

  j["no_such_option"] = 1;
  ASSERT_TRUE(JobSpecFromJson(j, "job.json", &unknown).ok()) << "unknown keys are ignored";
  EXPECT_EQ(unknown, std::vector<std::string>{"no_such_option"});
}

}  // namespace
}  // namespace ferry
