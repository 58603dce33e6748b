// `ferry train --devices N` as a user runs it: the job planned for N CPU devices and trained
// through the pipeline executor gives the losses of the one-device run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/json.h"
#include "tests/cli_testing.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::Ferry;

class PipelineCliTest : public ferry::testing::CliTest {};

std::vector<double> Losses(const std::string& run) {
  std::ifstream metrics(run + "/metrics.jsonl");
  std::vector<double> losses;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (!j.is_discarded()) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

// Three steps of `job` (train options without --out and --devices) on --devices 1 into
// `one` and on --devices 2 into `two` (each step's loss, from metrics.jsonl; empty on failure).
void TrainOnOneAndTwoDevices(const std::string& dir, const std::string& job,
                             std::vector<double>& one, std::vector<double>& two) {
  const std::string steps = "train --steps 3 --threads 2 " + job + " --out ";
  CommandResult r1 = Ferry(steps + dir + "/one --devices 1");
  ASSERT_EQ(r1.code, 0) << r1.output;
  CommandResult r2 = Ferry(steps + dir + "/two --devices 2");
  ASSERT_EQ(r2.code, 0) << r2.output;
  EXPECT_NE(r2.output.find("ferry train: 2 CPU devices, "), std::string::npos) << r2.output;
  one = Losses(dir + "/one");
  two = Losses(dir + "/two");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(two.size(), 3u);
  EXPECT_LT(one[2], one[0]);  // it learns: the comparison is not moot
}

// `job` (train options without --steps and --out) run whole for `steps` into dir/whole, and run
// for `stop` steps into dir/half then resumed there to `steps` (--resume, which reads the job
// back from the run folder): the caller compares the two folders. `outputs`, when given, gets the
// whole run's and the resumed run's output.
void TrainWholeAndResumed(const std::string& dir, const std::string& job, int stop, int steps,
                          std::pair<std::string, std::string>* outputs = nullptr) {
  CommandResult whole =
      Ferry("train " + job + " --steps " + std::to_string(steps) + " --out " + dir + "/whole");
  ASSERT_EQ(whole.code, 0) << whole.output;
  CommandResult half =
      Ferry("train " + job + " --steps " + std::to_string(stop) + " --out " + dir + "/half");
  ASSERT_EQ(half.code, 0) << half.output;
  CommandResult rest =
      Ferry("train --steps " + std::to_string(steps) + " --resume " + dir + "/half");
  ASSERT_EQ(rest.code, 0) << rest.output;
  if (outputs != nullptr) *outputs = {whole.output, rest.output};
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Tolerance as the executor's trainer test (engine/exec/pipeline_executor_test.cc): the first
// loss comes from identical weights (the per-micro-batch sums are the same: 1e-12 relative);
// later ones follow updates whose gradients differ by reassociation only: 1e-5 relative.
TEST_F(PipelineCliTest, TwoDevicesGiveTheOneDeviceLosses) {
  std::vector<double> want, got;
  TrainOnOneAndTwoDevices(dir_, "--batch-size 4 --micro-batches 2 --seq-len 32", want, got);
  ASSERT_FALSE(HasFatalFailure());
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(got[s], want[s], (s == 0 ? 1e-12 : 1e-5) * std::abs(want[s])) << "step " << s;
  }
}

// --dtype bf16 over --devices 2 (bf16 weights and activations on both devices, as on one): one
// micro-batch per step runs the same kernels in the same order on the same bits as --devices 1,
// so the gradients, the updates and every step's loss are the one-device run's, bit for bit.
TEST_F(PipelineCliTest, Bf16OnTwoDevicesGivesTheOneDeviceLosses) {
  std::vector<double> want, got;
  TrainOnOneAndTwoDevices(dir_, "--batch-size 4 --seq-len 32 --dtype bf16", want, got);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(got, want);
}

// --trace FILE: the measured timeline as Chrome-trace JSON with the plan's lanes, and the run ends
// with measured vs predicted step time and memory per tier (no timing is asserted), the prediction
// on this machine's measured rates.
TEST_F(PipelineCliTest, TraceWritesTheMeasuredTimelineAndTheRunComparesItWithThePlan) {
  const std::string trace = dir_ + "/trace.json";
  CommandResult r = Ferry(
      "train --steps 3 --threads 1 --devices 2 --batch-size 4 --micro-batches 2 "
      "--seq-len 32 --out " +
      dir_ + "/run --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.output;
  // The prediction is priced on rates measured at start (PriceOnCpuDevices), not nominal ones.
  for (const char* line : {"on this machine's rates, measured in",
                           "measured vs predicted (plan for profile "
                           "cpu-devices, rates measured here, 2 devices",
                           "step time", "cpu0 peak", "cpu1 peak", "host peak", "predicted ",
                           "planned ", "wrote the trace of 3 steps"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << " in\n" << r.output;
  }
  std::ifstream in(trace);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON: " << trace;
  std::set<std::string> lanes;
  size_t spans = 0;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["name"] == "thread_name") {
      lanes.insert("pid " + e["pid"].dump() + " " + e["args"]["name"].get<std::string>());
    }
    spans += e["ph"] == "X" ? 1 : 0;
  }
  for (const char* lane :
       {"pid 0 compute", "pid 0 host->device", "pid 0 device->host", "pid 1 compute",
        "pid 1 host->device", "pid 1 device->host", "pid 2 host memory"}) {
    EXPECT_TRUE(lanes.count(lane)) << lane;
  }
  EXPECT_GT(spans, 0u);
}

// One device runs through the same executor, so it is traced too: the trace has one device's
// lanes, and its losses are the two-device run's bit for bit.
// --skip-rate-probe: no probe line, the report's profile is the nominal one, and the weights are
// those of a run that probed (pricing changes the prediction only).
TEST_F(PipelineCliTest, SkipRateProbeKeepsTheNominalPredictionAndTheSameWeights) {
  const std::string job = "train --steps 2 --threads 1 --batch-size 4 --seq-len 32 --out ";
  CommandResult probed = Ferry(job + dir_ + "/probed");
  ASSERT_EQ(probed.code, 0) << probed.output;
  CommandResult skipped = Ferry(job + dir_ + "/skipped --skip-rate-probe");
  ASSERT_EQ(skipped.code, 0) << skipped.output;
  EXPECT_NE(probed.output.find("on this machine's rates, measured in"), std::string::npos)
      << probed.output;
  EXPECT_EQ(skipped.output.find("measured in"), std::string::npos) << skipped.output;
  EXPECT_EQ(skipped.output.find("rates measured here"), std::string::npos) << skipped.output;
  EXPECT_NE(skipped.output.find("plan for profile cpu-devices, 1 device,"), std::string::npos)
      << skipped.output;
  const std::string a = FileBytes(dir_ + "/probed/model.safetensors");
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, FileBytes(dir_ + "/skipped/model.safetensors"));
}

TEST_F(PipelineCliTest, OneDeviceIsTracedAndEqualsTwo) {
  const std::string job = "train --threads 2 --batch-size 4 --seq-len 32 --steps 2 ";
  CommandResult one = Ferry(job + "--trace " + dir_ + "/t.json --out " + dir_ + "/one");
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_NE(one.output.find("ferry train: 1 CPU device, "), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("wrote the trace of 2 steps"), std::string::npos) << one.output;
  std::ifstream in(dir_ + "/t.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  bool device_span = false;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e.value("ph", "") == "X" && e.value("pid", -1) == 0) device_span = true;
  }
  EXPECT_TRUE(device_span) << "no span on device 0";
  CommandResult two = Ferry(job + "--devices 2 --out " + dir_ + "/two");
  ASSERT_EQ(two.code, 0) << two.output;
  EXPECT_EQ(Losses(dir_ + "/one"), Losses(dir_ + "/two"));
}

// The NVMe rows of a run's report: "NVMe  X (what)  planned X" and "NVMe/step  X read, X written
// planned X read, X written": measured equals planned in both.
void ExpectNvmeAsPlanned(const std::string& output) {
  for (const std::string row : {"NVMe ", "NVMe/step "}) {
    const size_t at = output.find("  " + row);
    ASSERT_NE(at, std::string::npos) << row << " in\n" << output;
    const std::string line = output.substr(at + 2, output.find('\n', at) - at - 2);
    const size_t planned = line.find("planned ");
    ASSERT_NE(planned, std::string::npos) << line;
    std::string measured = line.substr(row.size(), planned - row.size());
    measured = measured.substr(0, measured.find(" ("));  // the space row names what it holds
    measured.erase(0, measured.find_first_not_of(' '));
    measured.erase(measured.find_last_not_of(' ') + 1);
    EXPECT_EQ(measured, line.substr(planned + 8)) << line;
  }
}

// Runs `job` into dir_/ram, then with --nvme-dir dir_/nvme and each host budget of `mib` in turn
// into dir_/nv until a run succeeds saying `says`; that run's losses are the RAM run's bit for
// bit, its report's NVMe space and bytes per step are the plan's, and it removed its store.
// Returns it.
CommandResult ExpectNvmeRunEqualsRam(const std::string& dir, const std::string& job,
                                     const std::vector<int>& mib, const std::string& says) {
  CommandResult ram = Ferry(job + "--out " + dir + "/ram");
  EXPECT_EQ(ram.code, 0) << ram.output;
  const std::string nvme = dir + "/nvme";
  std::filesystem::create_directories(nvme);
  CommandResult r;
  bool found = false;
  for (size_t i = 0; i < mib.size() && !found; ++i) {
    r = Ferry(job + "--host-memory " + std::to_string(mib[i]) + "MiB --nvme-dir " + nvme +
              " --force --out " + dir + "/nv");
    found = r.code == 0 && r.output.find(says) != std::string::npos;
  }
  EXPECT_TRUE(found) << says << " in\n" << r.output;
  if (!found) return r;
  EXPECT_EQ(Losses(dir + "/nv"), Losses(dir + "/ram"));
  ExpectNvmeAsPlanned(r.output);
  EXPECT_TRUE(std::filesystem::is_empty(nvme)) << "the finished run left its store";
  return r;
}

// One device obeys the budgets too: with host RAM short and --nvme-dir, its one-stage plan puts
// the optimizer state on NVMe (the smallest budget, searched, that fits), the losses are the RAM
// run's bit for bit, the report's NVMe bytes per step are the plan's, and a finished run removes
// its store.
TEST_F(PipelineCliTest, OneDeviceOptimizerOnNvmeEqualsRam) {
  const CommandResult r =
      ExpectNvmeRunEqualsRam(dir_, "train --threads 2 --batch-size 4 --seq-len 32 --steps 3 ",
                             {28, 30, 32, 34, 36, 38, 40, 42, 44}, "optimizer state on NVMe");
  EXPECT_NE(r.output.find("ferry train: 1 CPU device, 1 stage"), std::string::npos) << r.output;
}

// Two devices with host RAM short and --nvme-dir: the plan puts the saved activations on NVMe
// (the largest budget, searched, for which it does), with the same checks: the RAM run's losses
// bit for bit, the plan's bytes per step, the activation store removed.
TEST_F(PipelineCliTest, SavedActivationsOnNvmeEqualRam) {
  ExpectNvmeRunEqualsRam(
      dir_,
      "train --threads 1 --devices 2 --batch-size 64 --micro-batches 8 --seq-len 64 --steps 2 ",
      {220, 200, 180, 160, 140, 120, 100},
      "saved activations on NVMe in " + dir_ + "/nvme/nv.activations");
}

// QLoRA (--quantize nf4): the built-in model's block projections in NF4, LoRA on every one. The
// run trains (the loss falls), gives the same losses bit for bit on one device and on two (one
// micro-batch), records the base's storage in job.json, writes a PEFT adapter and resumes bit for
// bit. Without --lora-rank it is one line naming it; fp4 is refused as not supported yet.
TEST_F(PipelineCliTest, QloraTrainsTheSameOnAnyDevices) {
  const std::string job =
      "train --threads 2 --batch-size 4 --seq-len 32 --lr 3e-3 --lora-rank 8 --quantize nf4 ";
  CommandResult one = Ferry(job + "--steps 4 --out " + dir_ + "/one");
  ASSERT_EQ(one.code, 0) << one.output;
  CommandResult two = Ferry(job + "--steps 4 --devices 2 --out " + dir_ + "/two");
  ASSERT_EQ(two.code, 0) << two.output;
  const std::vector<double> losses = Losses(dir_ + "/one");
  ASSERT_EQ(losses.size(), 4u);
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_EQ(Losses(dir_ + "/two"), losses);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/one/adapter_model.safetensors"));
  std::ifstream job_file(dir_ + "/one/job.json");
  const nlohmann::json saved = nlohmann::json::parse(job_file, nullptr, false);
  EXPECT_EQ(saved.value("quantize", ""), "nf4") << saved.dump();
  // Stopped after two steps and resumed: the base is quantized again from the same source and the
  // adapter and optimizer come from the checkpoint, so the losses are the whole run's bit for bit.
  CommandResult half = Ferry(job + "--save-every 2 --steps 2 --out " + dir_ + "/half");
  ASSERT_EQ(half.code, 0) << half.output;
  CommandResult rest = Ferry("train --steps 4 --resume " + dir_ + "/half");
  ASSERT_EQ(rest.code, 0) << rest.output;
  EXPECT_EQ(Losses(dir_ + "/half"), losses);

  CommandResult full = Ferry("train --quantize nf4 --steps 1 --out " + dir_ + "/full");
  EXPECT_EQ(full.code, 1) << full.output;
  EXPECT_EQ(std::count(full.output.begin(), full.output.end(), '\n'), 1) << full.output;
  EXPECT_NE(full.output.find("--lora-rank"), std::string::npos) << full.output;
  CommandResult fp4 = Ferry("train --quantize fp4 --lora-rank 8 --out " + dir_ + "/fp4");
  EXPECT_NE(fp4.code, 0) << fp4.output;
  EXPECT_NE(fp4.output.find("not supported yet"), std::string::npos) << fp4.output;
}

TEST_F(PipelineCliTest, BadDeviceOptionsAreOneLine) {
  for (const std::string args : {"train --devices 0", "train --devices 65",
                                 "train --devices cpu,cuda:0", "train --devices gpu"}) {
    CommandResult r = Ferry(args + " --out " + dir_ + "/run");
    EXPECT_EQ(r.code, 1) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find("--devices"), std::string::npos) << args << ": " << r.output;
  }
  // A GPU asked for where there is none (CUDA_VISIBLE_DEVICES hides any): refused in one line
  // that says why and what to give, before the run folder exists.
  CommandResult r =
      Ferry("train --devices cuda:0,cuda:0 --out " + dir_ + "/gpu", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("--devices cuda:0,cuda:0: no GPU ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run on CPU devices with --devices 2"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/gpu"));
  // --gpu-memory caps CUDA devices: on CPU devices it is refused the same way.
  r = Ferry("train --devices cpu --gpu-memory 4GiB --out " + dir_ + "/cap");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("--gpu-memory 4GiB: the job runs on cpu (CPU devices)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/cap"));
  // eval takes it too, refused alike before anything is read.
  r = Ferry("eval --devices cpu --gpu-memory 4GiB --data " + dir_ + "/none.jsonl");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("ferry eval: --gpu-memory 4GiB: the job runs on cpu (CPU devices)"),
            std::string::npos)
      << r.output;
}

// --devices cpu,cpu: two CPU devices, said at the start with why, recorded in job.json as the list
// and kept on --resume (a count of 2 agrees with it; another list is refused).
TEST_F(PipelineCliTest, ListedCpuDevicesAreSaidRecordedAndKept) {
  const std::string job =
      "train" + ferry::testing::kQuickTrain + " --micro-batches 2 --steps 2 --save-every 1 ";
  CommandResult r = Ferry(job + "--devices cpu,cpu --out " + dir_ + "/run");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ferry train: devices: 2 CPU devices (--devices cpu,cpu)\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ferry train: 2 CPU devices, "), std::string::npos) << r.output;
  std::ifstream job_file(dir_ + "/run/job.json");
  const nlohmann::json saved = nlohmann::json::parse(job_file, nullptr, false);
  EXPECT_EQ(saved.value("device_kind", ""), "cpu") << saved.dump();
  EXPECT_EQ(saved.value("devices", 0), 2) << saved.dump();
  EXPECT_EQ(saved.value("dtype", ""), "f32") << saved.dump();
  CommandResult same = Ferry("train --steps 3 --devices 2 --resume " + dir_ + "/run");
  EXPECT_EQ(same.code, 0) << same.output;
  CommandResult other = Ferry("train --steps 4 --devices cpu --resume " + dir_ + "/run");
  EXPECT_EQ(other.code, 1) << other.output;
  EXPECT_NE(other.output.find("--devices cpu differs from the run's cpu,cpu"), std::string::npos)
      << other.output;
}

// Without a GPU (hidden here), a count of devices means CPU devices and the start says why.
TEST_F(PipelineCliTest, WithoutAGpuACountIsCpuDevicesAndSaysWhy) {
  CommandResult r =
      Ferry("train" + ferry::testing::kQuickTrain + " --steps 1 --out " + dir_ + "/run",
            "CUDA_VISIBLE_DEVICES=");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ferry train: devices: 1 CPU device (no GPU: "), std::string::npos)
      << r.output;
}

// --stale-updates over --devices 2: a checkpoint is a synchronization point, so a run stopped at
// a checkpoint and resumed repeats the uninterrupted run's losses bit for bit; the first step is
// the synchronous run's, the second is not (it runs on the initial weights again); one device
// gives the same losses bit for bit.
TEST_F(PipelineCliTest, StaleUpdatesResumeBitForBitOnAnyDevices) {
  TrainWholeAndResumed(
      dir_, "--threads 2 --batch-size 4 --seq-len 32 --devices 2 --stale-updates --save-every 2", 2,
      4);
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<double> want = Losses(dir_ + "/whole"), got = Losses(dir_ + "/half");
  ASSERT_EQ(want.size(), 4u);
  EXPECT_EQ(got, want);
  std::ifstream saved(dir_ + "/half/job.json");
  const nlohmann::json j = nlohmann::json::parse(saved, nullptr, false);
  EXPECT_EQ(j.value("stale_updates", false), true) << j.dump();
  // Synchronous updates give another run from the second step on.
  CommandResult sync = Ferry(
      "train --threads 2 --batch-size 4 --seq-len 32 --devices 2 "
      "--steps 2 --out " +
      dir_ + "/sync");
  ASSERT_EQ(sync.code, 0) << sync.output;
  const std::vector<double> s = Losses(dir_ + "/sync");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], want[0]);
  EXPECT_NE(s[1], want[1]);

  CommandResult one = Ferry(
      "train --threads 2 --batch-size 4 --seq-len 32 --devices 1 --stale-updates --save-every 2 "
      "--steps 4 --out " +
      dir_ + "/one");
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_EQ(Losses(dir_ + "/one"), want);
}

// --stale-updates with host RAM short and --nvme-dir over --devices 2: the optimizer state goes
// to NVMe (updated a layer's record at a time, once the step has read the layer) and the losses
// are the stale RAM run's bit for bit, with the plan's NVMe bytes per step.
TEST_F(PipelineCliTest, StaleUpdatesWithOptimizerOnNvmeEqualRam) {
  ExpectNvmeRunEqualsRam(
      dir_, "train --threads 2 --batch-size 4 --seq-len 32 --steps 3 --devices 2 --stale-updates ",
      {30, 32, 34, 36, 38, 40, 42, 44}, "optimizer state on NVMe");
}

// Validation on --devices 2 runs forward only through the executor: val_loss is reported, and
// equals the one-device run's within the tolerance of the weights it evaluates (1e-5 relative:
// their updates differ by reassociation only).
TEST_F(PipelineCliTest, ValidationLossOnTwoDevices) {
  // Ten short documents as a text corpus (blank-line separated); one held out.
  const std::string data = dir_ + "/corpus.txt";
  {
    std::ofstream f(data);
    for (int d = 0; d < 10; ++d) {
      f << "document " << d << " says the quick brown fox jumps over the lazy dog " << d * 7
        << " times\n\n";
    }
  }
  std::vector<std::vector<double>> val(2);
  for (int devices : {1, 2}) {
    const std::string run = dir_ + "/val" + std::to_string(devices);
    CommandResult r = Ferry("train --data " + data +
                            " --steps 2 --threads 2 --batch-size 4 --seq-len 32 "
                            "--val-fraction 0.1 --eval-every 1 --devices " +
                            std::to_string(devices) + " --out " + run);
    ASSERT_EQ(r.code, 0) << r.output;
    std::ifstream metrics(run + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      ASSERT_TRUE(j.contains("val_loss")) << line;
      val[size_t(devices - 1)].push_back(j["val_loss"].get<double>());
    }
  }
  ASSERT_EQ(val[0].size(), 2u);
  ASSERT_EQ(val[1].size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_NEAR(val[1][s], val[0][s], 1e-5 * std::abs(val[0][s])) << "step " << s;
  }
}

// --dtype f16: dynamic loss scaling. The initial scale 2^20 overflows the f16 gradients, so the
// first steps are skipped (and say so in metrics.jsonl) while the scale halves; growth after every
// finite step (--loss-scale-growth-interval 1) then moves the scale every step, so a resume that
// lost the scaler's state would diverge. A run stopped after 3 steps and resumed equals the
// uninterrupted one bit for bit: losses, scales, skips and the final weights. Both final lines
// give the whole run's final scale and skipped count, as metrics.jsonl has them; job.json keeps
// the options.
TEST_F(PipelineCliTest, F16LossScalingResumesBitForBit) {
  std::pair<std::string, std::string> out;
  TrainWholeAndResumed(dir_,
                       "--threads 2 --batch-size 4 --seq-len 32 --devices 2 --dtype f16 "
                       "--loss-scale 1048576 --loss-scale-growth-interval 1 --save-every 3",
                       3, 8, &out);
  ASSERT_FALSE(HasFatalFailure());
  auto column = [](const std::string& run, const char* key) {
    std::ifstream metrics(run + "/metrics.jsonl");
    std::vector<nlohmann::json> values;
    for (std::string line; std::getline(metrics, line);) {
      values.push_back(nlohmann::json::parse(line, nullptr, false).value(key, nlohmann::json()));
    }
    return values;
  };
  const std::string whole = dir_ + "/whole", half = dir_ + "/half";
  EXPECT_EQ(Losses(half), Losses(whole));
  EXPECT_EQ(column(half, "loss_scale"), column(whole, "loss_scale"));
  EXPECT_EQ(column(half, "skipped"), column(whole, "skipped"));
  EXPECT_EQ(FileBytes(half + "/model.safetensors"), FileBytes(whole + "/model.safetensors"));
  const std::vector<nlohmann::json> skipped = column(whole, "skipped");
  const std::vector<nlohmann::json> scales = column(whole, "loss_scale");
  ASSERT_EQ(skipped.size(), 8u);
  ASSERT_TRUE(skipped[0].is_boolean());
  EXPECT_TRUE(skipped[0].get<bool>()) << "2^20 did not overflow f16: the test is moot";
  EXPECT_EQ(scales[0].get<double>(), 1048576.0);
  int skips = 0;
  for (size_t s = 0; s < 8; ++s) {
    skips += skipped[s].get<bool>();
    if (s == 0) continue;  // each step's scale follows from the previous step's outcome
    const double before = scales[s - 1].get<double>();
    EXPECT_EQ(scales[s].get<double>(), skipped[s - 1].get<bool>() ? before / 2 : before * 2)
        << "step " << s;
  }
  EXPECT_LT(skips, 8) << "no step was finite";
  // Growth after every finite step keeps the scale at the edge: the last step may overflow too.
  const double final_scale =
      skipped[7].get<bool>() ? scales[7].get<double>() / 2 : scales[7].get<double>() * 2;
  char want[128];
  std::snprintf(want, sizeof want, "f16 loss scale %.17g at the end, %d of 8 steps skipped",
                final_scale, skips);
  EXPECT_NE(out.first.find(want), std::string::npos) << want << "\n" << out.first;
  EXPECT_NE(out.second.find(want), std::string::npos) << want << "\n" << out.second;
  std::ifstream saved(whole + "/job.json");
  const nlohmann::json j = nlohmann::json::parse(saved, nullptr, false);
  EXPECT_EQ(j.value("dtype", ""), "f16") << j.dump();
  EXPECT_EQ(j.value("loss_scale", 0.0), 1048576.0) << j.dump();
  EXPECT_EQ(j.value("loss_scale_growth_interval", 0), 1) << j.dump();
}

}  // namespace
