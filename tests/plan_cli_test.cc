// `ferry plan` as a user runs it: presets, job files shared with train, JSON,
// timelines, and the exit code when nothing fits.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "engine/json.h"
#include "engine/testing/golden_files.h"
#include "tests/cli_testing.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::Ferry;

class PlanCliTest : public ferry::testing::CliTest {};

// Each example job in configs/jobs plans as its "# plan:" line says (the model a preset of the
// file's model folder) and fits; `ferry train` reads every key of it (it stops at the model
// folder, which is the user's to give).
TEST_F(PlanCliTest, ExampleJobFilesPlanAndParse) {
  const std::string jobs = ferry::testing::SourceDir() + "/configs/jobs";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(jobs)) {
    if (entry.path().extension() != ".toml") continue;
    ++files;
    const std::string path = entry.path().string();
    std::ifstream in(path);
    std::string line, plan;
    while (std::getline(in, line)) {
      if (line.rfind("# plan: ferry ", 0) == 0) plan = line.substr(std::strlen("# plan: ferry "));
    }
    ASSERT_FALSE(plan.empty()) << path << " has no \"# plan: ferry ...\" line";
    const std::string rel = "--config configs/jobs/" + entry.path().filename().string();
    const size_t at = plan.find(rel);
    ASSERT_NE(at, std::string::npos) << path << ": " << plan;
    plan.replace(at, rel.size(), "--config " + path);
    CommandResult r = Ferry(plan);
    EXPECT_EQ(r.code, 0) << path << ": " << r.output;
    EXPECT_NE(r.output.find("predicted: "), std::string::npos) << path << ": " << r.output;
    r = Ferry("train --config " + path + " --model " + dir_ + "/no-such-model");
    EXPECT_EQ(r.code, 1) << path << ": " << r.output;
    EXPECT_NE(r.output.find("no-such-model"), std::string::npos) << path << ": " << r.output;
  }
  EXPECT_GE(files, 4);
}

// The run's length at the predicted step: --steps' updates; --epochs' counted from the data the
// plan reads (the tiny model's tokenizer reads it), as ferry train counts them; not counted for
// a preset, which has no tokenizer.
TEST_F(PlanCliTest, RunLengthIsTheUpdatesAtThePredictedStep) {
  CommandResult r = Ferry("plan --model qwen3-0.6b --steps 500 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["run"]["updates"], 500);
  EXPECT_DOUBLE_EQ(j["run"]["seconds"].get<double>(),
                   500 * j["plan"]["predicted"]["step_s"].get<double>());
  r = Ferry("plan --model qwen3-0.6b --steps 500");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("run: 500 updates (--steps) in about "), std::string::npos) << r.output;

  const std::string data = dir_ + "/d.jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 30; ++i)
      f << R"({"text": "The ferry leaves at )" << i << R"( o'clock."})"
        << "\n";
  }
  const std::string job = " --data " + data + " --epochs 2 --batch-size 8 --seq-len 32";
  r = Ferry("plan --model tiny --hardware 1x-rtx4090-pcie4" + job);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string out = dir_ + "/run";
  CommandResult t = Ferry("train --threads 2 --out " + out + job);
  ASSERT_EQ(t.code, 0) << t.output;
  // The updates ferry train counts for the same job.
  const size_t at = t.output.find("training rows: ");
  ASSERT_NE(at, std::string::npos) << t.output;
  const long long updates = std::atoll(t.output.c_str() + at + std::strlen("training rows: "));
  EXPECT_NE(r.output.find("training rows: " + std::to_string(updates) + " updates in about "),
            std::string::npos)
      << r.output;
  r = Ferry("plan --model qwen3-0.6b" + job);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("run: --epochs 2: its updates are counted from the packed data"),
            std::string::npos)
      << r.output;

  // A job file's epochs give way to --steps on the command line (and its steps to --epochs);
  // both in one place are refused, by plan as by train.
  const std::string file = dir_ + "/epochs.toml";
  std::ofstream(file) << "epochs = 2\n";
  r = Ferry("plan --config " + file + " --model qwen3-0.6b --steps 7");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("run: 7 updates (--steps)"), std::string::npos) << r.output;
  std::ofstream(file) << "steps = 7\n";
  r = Ferry("plan --config " + file + job);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("run: --epochs 2 of "), std::string::npos) << r.output;
  std::ofstream(file) << "steps = 7\nepochs = 2\n";
  for (const std::string command : {"plan", "train"}) {
    r = Ferry(command + " --config " + file + " --data " + data);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("--steps and --epochs both set the run's length in the job file"),
              std::string::npos)
        << r.output;
  }
  r = Ferry("plan --model qwen3-0.6b --steps 5" + job);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--steps and --epochs both set the run's length; give one"),
            std::string::npos)
      << r.output;
}

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
  // A candidate: a divisor of 6 that is >= GPUs + 1 (3 and 6 predict within 0.1% of each other
  // here: the step is bound by the optimizer's downloads, not the bubble).
  const int m = p["micro_batches"].get<int>();
  EXPECT_TRUE(m == 3 || m == 6) << m;
  EXPECT_EQ(p["micro_batch_size"].get<int>() * m, 6);
  EXPECT_GT(p["predicted"]["tokens_per_s"].get<double>(), 0);
}

// --explain: the candidates weighed, the chosen plan first in the table; with --json every
// candidate, the chosen plan's among them.
TEST_F(PlanCliTest, ExplainListsTheCandidatesAndTheChosenPlanAmongThem) {
  const std::string job =
      "plan --model qwen3-0.6b --hardware 2x-rtx4090-pcie4 --seq-len 512 --batch-size 6 "
      "--gpu-memory 20GiB --explain";
  CommandResult text = Ferry(job);
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("Candidates weighed: "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("(chosen)"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("% step"), std::string::npos) << text.output;
  CommandResult json = Ferry(job + " --json");
  ASSERT_EQ(json.code, 0) << json.output;
  const nlohmann::json j = nlohmann::json::parse(json.output);
  const nlohmann::json& p = j["plan"];
  ASSERT_TRUE(j["candidates"].is_array());
  EXPECT_GT(j["candidates"].size(), 1u);
  int chosen = 0;
  for (const nlohmann::json& k : j["candidates"]) {
    if (!k["fits"].get<bool>()) continue;
    EXPECT_GE(k["step_s"].get<double>(), p["predicted"]["step_s"].get<double>());
    chosen += k["step_s"].get<double>() == p["predicted"]["step_s"].get<double>() &&
              k["micro_batches"] == p["micro_batches"] &&
              k["stages"].get<size_t>() == p["forward_stages"].size();
  }
  EXPECT_GE(chosen, 1);
  // Without --explain the JSON stays as it was.
  CommandResult plain =
      Ferry(job.substr(0, job.size() - std::string(" --explain").size()) + " --json");
  ASSERT_EQ(plain.code, 0) << plain.output;
  EXPECT_FALSE(nlohmann::json::parse(plain.output).contains("candidates"));
}

// Packed data's documents are counted from --data (as `ferry train` plans them): short examples
// share rows, so a micro-batch of 2 rows holds more than 2 documents; without --data, one each.
TEST_F(PlanCliTest, PackedDocumentsAreCountedFromTheData) {
  {
    std::ofstream data(dir_ + "/short.jsonl");
    for (int i = 0; i < 40; ++i) data << "{\"text\": \"note " << i << "\"}\n";
  }
  const std::string job =
      "plan --model tiny --hardware 1x-rtx4090-pcie4 --batch-size 4 --micro-batches 2 "
      "--seq-len 64 --dtype bf16 --json";
  CommandResult plain = Ferry(job);
  ASSERT_EQ(plain.code, 0) << plain.output;
  EXPECT_EQ(nlohmann::json::parse(plain.output)["plan"]["max_documents"].get<int>(), 0);
  CommandResult packed = Ferry(job + " --data " + dir_ + "/short.jsonl");
  ASSERT_EQ(packed.code, 0) << packed.output;
  const int docs = nlohmann::json::parse(packed.output)["plan"]["max_documents"].get<int>();
  EXPECT_GT(docs, 2);
  EXPECT_LE(docs, 2 * 64);
  CommandResult text = Ferry(
      "plan --model tiny --hardware 1x-rtx4090-pcie4 --batch-size 4 "
      "--micro-batches 2 --seq-len 64 --dtype bf16 --data " +
      dir_ + "/short.jsonl");
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("micro-batches: 2 of 2 sequence(s), up to " + std::to_string(docs) +
                             " packed documents"),
            std::string::npos)
      << text.output;
}

TEST_F(PlanCliTest, TrainJobFilePlansAsItIs) {
  std::ofstream(dir_ + "/job.toml") << "model = \"qwen3-0.6b\"\nbatch-size = 4\nseq-len = 256\n"
                                       "steps = 10\nlora-rank = 8\nout = \"run\"\nthreads = 2\n";
  CommandResult r = Ferry("plan --config " + dir_ + "/job.toml --hardware 1x-rtx3090-pcie4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("batch 4 x 256 tokens, LoRA rank 8"), std::string::npos) << r.output;
}

// fp16acc (fp16 GEMMs accumulating in fp16) is a price the planner knows, at the 4090's
// fp16-accumulate rate, so it predicts a shorter step than fp16; `ferry train` runs it on GPUs
// only and, on CPU devices, refuses it rather than training in another mode.
TEST_F(PlanCliTest, Fp16AccumulateIsPricedByPlanAndRefusedByTrainOnCpuDevices) {
  const std::string job =
      " --model qwen3-0.6b --hardware 2x-rtx4090-pcie4 --seq-len 1024 --batch-size 6 --json";
  CommandResult fp16 = Ferry("plan --dtype fp16" + job);
  CommandResult fp16acc = Ferry("plan --dtype fp16acc" + job);
  ASSERT_EQ(fp16.code, 0) << fp16.output;
  ASSERT_EQ(fp16acc.code, 0) << fp16acc.output;
  const nlohmann::json a = nlohmann::json::parse(fp16.output)["plan"];
  const nlohmann::json b = nlohmann::json::parse(fp16acc.output)["plan"];
  EXPECT_EQ(b["compute_dtype"].get<std::string>(), "fp16acc");
  EXPECT_GT(b["predicted"]["tokens_per_s"].get<double>(),
            a["predicted"]["tokens_per_s"].get<double>());

  CommandResult train =
      Ferry("train --dtype fp16acc --devices cpu --steps 1 --out " + dir_ + "/run");
  EXPECT_NE(train.code, 0) << train.output;
  EXPECT_NE(train.output.find("--dtype fp16acc (GEMMs accumulating in fp16) runs on GPUs only"),
            std::string::npos)
      << train.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/run"));
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
  // 0.6 B parameters need about 9.6 GB of fp32 master, gradients and moments: 1400 MiB
  // is short, and without an NVMe directory nothing can move. LoRA's base, packed from the model's
  // files into bf16 upload mirrors (1.63 GiB in all), is short too; QLoRA's NF4 base (1.23) fits.
  CommandResult r = Ferry(
      "plan --model qwen3-0.6b --hardware 1x-rtx4090-pcie4 "
      "--seq-len 512 --batch-size 2 "
      "--host-memory 1400MiB");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("Nothing fits. host memory is short"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fits with --lora-rank 16 --quantize nf4"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("fits with --host-memory"), std::string::npos) << r.output;
}

// A LoRA job over a model folder packs its frozen base from the model's files: no fp32 copy of
// it in the host's map. The built-in `tiny` base is made from the seed and held in fp32.
TEST_F(PlanCliTest, ALoraBaseFromTheModelsFilesHasNoFp32Copy) {
  CommandResult folder = Ferry("plan --model smollm2-135m --lora-rank 8 --seq-len 256 --json");
  ASSERT_EQ(folder.code, 0) << folder.output;
  const nlohmann::json f = nlohmann::json::parse(folder.output).at("plan");
  EXPECT_TRUE(f.at("frozen_base_from_files").get<bool>());
  std::set<std::string> names;
  for (const nlohmann::json& a : f.at("memory").at("pageable_host").at("allocations")) {
    names.insert(a.at("name").get<std::string>());
  }
  EXPECT_FALSE(names.contains("weights.frozen")) << folder.output;
  EXPECT_TRUE(names.contains("weights.embedding")) << folder.output;  // the file's mapped table
  CommandResult text = Ferry("plan --model smollm2-135m --lora-rank 8 --seq-len 256");
  EXPECT_NE(text.output.find("packed from the model's files"), std::string::npos) << text.output;
  CommandResult tiny = Ferry("plan --model tiny --lora-rank 8 --seq-len 64 --json");
  ASSERT_EQ(tiny.code, 0) << tiny.output;
  const nlohmann::json t = nlohmann::json::parse(tiny.output).at("plan");
  EXPECT_FALSE(t.at("frozen_base_from_files").get<bool>());
  bool fp32_base = false;
  for (const nlohmann::json& a : t.at("memory").at("pageable_host").at("allocations")) {
    fp32_base = fp32_base || a.at("name") == "weights.frozen";
  }
  EXPECT_TRUE(fp32_base) << tiny.output;
}

TEST_F(PlanCliTest, UnknownModelIsOneLine) {
  CommandResult r = Ferry("plan --model no-such-model");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--model 'no-such-model'"), std::string::npos) << r.output;
}

// `ferry probe --model` writes the job's layer times into the profile; `ferry plan` with the same
// job and that profile prices the step from them (and says so), the same job in another dtype
// (other keys) from its formulas, with a warning naming the dtype the times are for.
TEST_F(PlanCliTest, ProbedLayerTimesAreWhatThePlanUses) {
  const std::string profile = dir_ + "/probed.json";
  const std::string job = " --model tiny --seq-len 16 --batch-size 2 --micro-batches 1";
  CommandResult probe = Ferry("probe --layers-only --repeats 1 --threads 1 --out " + profile + job);
  ASSERT_EQ(probe.code, 0) << probe.output;
  EXPECT_NE(probe.output.find("block.0"), std::string::npos) << probe.output;
  const nlohmann::json written = nlohmann::json::parse(std::ifstream(profile));
  EXPECT_EQ(written["layer_times"].size(), 3u);  // embedding, one block shape, head
  CommandResult measured = Ferry("plan --json --dtype f32 --hardware " + profile + job);
  ASSERT_EQ(measured.code, 0) << measured.output;
  const nlohmann::json m = nlohmann::json::parse(measured.output)["plan"]["layer_times"];
  EXPECT_EQ(m["source"], "measured") << m;
  EXPECT_EQ(m["measured_layers"], m["layers"]) << m;
  CommandResult formulas = Ferry("plan --json --hardware " + profile + job);  // bf16
  ASSERT_EQ(formulas.code, 0) << formulas.output;
  EXPECT_EQ(nlohmann::json::parse(formulas.output)["plan"]["layer_times"]["source"], "formulas");
  // ... and says so, with the option that would use the times; the f32 plan has no such warning.
  CommandResult summary = Ferry("plan --hardware " + profile + job);
  ASSERT_EQ(summary.code, 0) << summary.output;
  EXPECT_NE(summary.output.find("warning: the hardware profile has measured layer times for this "
                                "job in f32 only: this plan (bf16) uses the FLOP formulas; plan "
                                "with --dtype f32 to use them\n"),
            std::string::npos)
      << summary.output;
  EXPECT_TRUE(nlohmann::json::parse(measured.output)["plan"]["warnings"].empty())
      << measured.output;
  // --layers-only without a model has nothing to measure.
  CommandResult nothing = Ferry("probe --layers-only --out " + profile);
  EXPECT_EQ(nothing.code, 1);
  EXPECT_NE(nothing.output.find("--layers-only"), std::string::npos) << nothing.output;
}

}  // namespace
