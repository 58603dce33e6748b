#include "engine/train/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "engine/json.h"
#include "engine/model/safetensors.h"
#include "engine/testing/golden_files.h"
#include "engine/train/run_training.h"
#include "engine/train/stop_signals.h"
#include "engine/train/training_runner.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/ferry_ckpt_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

 public:
  // A few quick updates of the tiny model.
  JobSpec Job(const std::string& out, int64_t steps, bool lora) const {
    JobSpec job;
    job.steps = steps;
    job.batch_size = 2;
    job.seq_len = 16;
    job.warmup_steps = 2;
    job.threads = 2;
    job.save_every = 0;
    job.out = dir_ + "/" + out;
    if (lora) job.lora = {.rank = 4, .alpha = 8, .targets = kLoraQ | kLoraV};
    return job;
  }
  Status Run(const JobSpec& job, const RunControl& control = {}) const {
    FERRY_RETURN_IF_ERROR(PrepareRunFolder(job.out));
    return RunTraining(job, TinyLlamaPreset(), control);
  }
  std::string dir_;
};

// metrics.jsonl's deterministic columns (elapsed_s and tokens_per_s are wall-clock).
std::vector<std::array<double, 3>> Losses(const std::string& run) {
  std::vector<std::array<double, 3>> out;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (j.is_discarded()) continue;
    EXPECT_EQ(j["step"].get<size_t>(), out.size() + 1) << line;
    // grad_norm is null on a step f16 loss scaling skipped (not finite): -1 here.
    const double norm = j["grad_norm"].is_null() ? -1.0 : j["grad_norm"].get<double>();
    out.push_back({j["loss"].get<double>(), j["lr"].get<double>(), norm});
  }
  return out;
}

std::map<std::string, std::vector<float>> Tensors(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  Result<SafetensorsFile> f = SafetensorsFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return out;
  for (const SafetensorsTensorInfo& t : f->tensors()) out[t.name] = *f->ReadFloats(t.name);
  return out;
}

// The same job straight through, and stopped after 3 of 6 updates (as a signal would) then
// resumed: every loss, rate and gradient norm, and every final weight, identical bit for bit
// (the data is a pure function of the step and the optimizer state is restored exactly).
void ExpectResumeEqualsStraight(CheckpointTest* t, const JobSpec& straight, JobSpec stopped) {
  ASSERT_TRUE(t->Run(straight).ok());
  int polls = 0;
  RunControl stop;
  stop.stop_requested = [&polls] { return ++polls == 3 ? SIGTERM : 0; };
  Status s = t->Run(stopped, stop);
  ASSERT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_NE(s.message().find("--resume " + stopped.out), std::string::npos) << s.message();
  EXPECT_EQ(Losses(stopped.out).size(), 3u);
  RunControl resume;
  resume.resume = true;
  s = t->Run(stopped, resume);
  ASSERT_TRUE(s.ok()) << s.ToString();

  const auto a = Losses(straight.out), b = Losses(stopped.out);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t c = 0; c < 3; ++c) EXPECT_EQ(a[i][c], b[i][c]) << "step " << i + 1 << " col " << c;
  }
  const std::string file =
      straight.lora.enabled() ? "adapter_model.safetensors" : "model.safetensors";
  const auto wa = Tensors(straight.out + "/" + file), wb = Tensors(stopped.out + "/" + file);
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << file << " differs after a resume";
}

TEST_F(CheckpointTest, ResumeMatchesStraightRunFull) {
  ExpectResumeEqualsStraight(this, Job("straight", 6, false), Job("stopped", 6, false));
}

TEST_F(CheckpointTest, ResumeMatchesStraightRunLoraCompressed) {
  JobSpec stopped = Job("stopped", 6, true);
  stopped.checkpoint_compress = true;
  ExpectResumeEqualsStraight(this, Job("straight", 6, true), stopped);
  // LoRA: only the adapter (and its moments) is in the checkpoint, compressed.
  const std::string ckpt = CheckpointsDir(stopped.out) + "/" + CheckpointName(6);
  EXPECT_TRUE(fs::exists(ckpt + "/trainable.safetensors.zst"));
  Result<CheckpointState> c = ReadCheckpoint(ckpt);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (const auto& [name, values] : c->trainable.tensors) {
    EXPECT_NE(name.find("lora_"), std::string::npos) << name;
    EXPECT_EQ(c->exp_avg.tensors.at(name).size(), values.size());
    EXPECT_EQ(c->exp_avg_sq.tensors.at(name).size(), values.size());
  }
  EXPECT_EQ(c->step, 6);
}

// --devices 2 with a host budget one that keeps the optimizer state in RAM does not fit: the plan
// puts it on NVMe (--nvme-dir), the run keeps it there, and it trains as the RAM run does, bit for
// bit, stopped and resumed (the store rebuilt from the checkpoint) as straight through.
TEST_F(CheckpointTest, ResumeMatchesStraightRunWithOptimizerStateOnNvme) {
  const std::string nvme = dir_ + "/nvme";
  fs::create_directories(nvme);
  JobSpec ram = Job("ram", 6, false);
  ram.devices = 2;
  ram.micro_batches = 2;
  // The largest host budget whose plan puts optimizer state on NVMe, searched down from the
  // all-in-RAM plan's host total.
  Result<TrainingRunner> all_ram = CreateTrainingRunner(ram, TinyLlamaPreset(), 2);
  ASSERT_TRUE(all_ram.ok()) << all_ram.status().ToString();
  ASSERT_EQ(all_ram->plan->optimizer_state, Tier::kHost);
  EXPECT_TRUE(all_ram->optimizer_nvme_dir().empty());
  const uint64_t host =
      all_ram->plan->memory.pinned_host.total() + all_ram->plan->memory.pageable_host.total();
  JobSpec straight = Job("straight", 6, false);
  straight.devices = 2;
  straight.micro_batches = 2;
  straight.nvme_dir = nvme;
  std::optional<plan::Plan> planned;
  // A killed run's records (its folder's lock file left, no process holding it) are cleared
  // before the next run of the job plans.
  const std::string leftover = nvme + "/straight.optimizer-state";
  fs::create_directories(leftover);
  std::ofstream(leftover + "/.ferry-lock");
  std::ofstream(leftover + "/record-00009.slots") << "left by a killed run";
  for (uint64_t budget = host - 4096; budget > host / 4 && !planned; budget -= 4096) {
    straight.host_memory = std::to_string(budget);
    Result<TrainingRunner> t = CreateTrainingRunner(straight, TinyLlamaPreset(), 2);
    EXPECT_FALSE(fs::exists(leftover + "/record-00009.slots"));
    if (t.ok() && t->plan->optimizer_state == Tier::kNvme) {
      EXPECT_EQ(t->optimizer_nvme_dir(), nvme + "/straight.optimizer-state");
      EXPECT_EQ(t->plan->activations, Tier::kHost);
      planned = t->plan;
      // The run holds its folder: a second run of the same name is refused, naming it.
      Result<TrainingRunner> twin = CreateTrainingRunner(straight, TinyLlamaPreset(), 2);
      ASSERT_FALSE(twin.ok());
      EXPECT_EQ(twin.status().code(), StatusCode::kFailedPrecondition);
      EXPECT_NE(twin.status().message().find(t->optimizer_nvme_dir() + " is in use by another"),
                std::string::npos)
          << twin.status().ToString();
    }
  }
  ASSERT_TRUE(planned) << "no host budget below " << host << " puts optimizer state on NVMe";
  JobSpec stopped = straight;
  stopped.out = dir_ + "/stopped";
  ExpectResumeEqualsStraight(this, straight, stopped);
  ASSERT_TRUE(Run(ram).ok());
  const auto a = Losses(ram.out), b = Losses(straight.out);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t c = 0; c < 3; ++c) EXPECT_EQ(a[i][c], b[i][c]) << "step " << i + 1 << " col " << c;
  }
  EXPECT_TRUE(Tensors(ram.out + "/model.safetensors") ==
              Tensors(straight.out + "/model.safetensors"));
  // A finished run removes its store: the final checkpoint holds the state.
  EXPECT_FALSE(fs::exists(nvme + "/straight.optimizer-state"));
  EXPECT_FALSE(fs::exists(nvme + "/stopped.optimizer-state"));
}

TEST_F(CheckpointTest, KeepsNewestAndPointsLatestAtIt) {
  JobSpec job = Job("run", 5, false);
  job.save_every = 1;
  job.keep_checkpoints = 2;
  ASSERT_TRUE(Run(job).ok());
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(CheckpointsDir(job.out))) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", CheckpointName(4), CheckpointName(5)}));
  EXPECT_EQ(testing::ReadTextFile(CheckpointsDir(job.out) + "/latest"), CheckpointName(5) + "\n");
  Result<CheckpointState> c = ReadCheckpoint(CheckpointsDir(job.out) + "/" + CheckpointName(4));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->step, 4);
  EXPECT_EQ(std::count(c->meta.metrics.begin(), c->meta.metrics.end(), '\n'), 4);
  EXPECT_EQ(c->meta.job["steps"], 5);
}

// A flipped byte or a truncated file is Corruption naming the file; loading falls back to the
// previous intact checkpoint with a warning naming the bad one.
// f16 with growth after every finite step (the scale moves each step), stopped by a signal after
// 3 updates and resumed: the straight run's numbers bit for bit, so the scaler's state came back.
TEST_F(CheckpointTest, ResumeMatchesStraightRunF16LossScaling) {
  JobSpec straight = Job("straight", 6, false), stopped = Job("stopped", 6, false);
  for (JobSpec* j : {&straight, &stopped}) {
    j->dtype = "f16";
    j->loss_scale_growth_interval = 1;
  }
  ExpectResumeEqualsStraight(this, straight, stopped);
}

// state.json keeps the loss scaler's state for f16 runs only, as metrics.jsonl saw it; a
// malformed one is Corruption naming the file.
TEST_F(CheckpointTest, LossScalerStateIsSavedForF16Only) {
  JobSpec f16 = Job("f16", 2, false);
  f16.dtype = "f16";
  f16.loss_scale = 1024;
  f16.loss_scale_growth_interval = 1;
  ASSERT_TRUE(Run(f16).ok());
  const std::string dir = CheckpointsDir(f16.out) + "/" + CheckpointName(2);
  Result<CheckpointState> c = ReadCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->loss_scaler.has_value());
  std::ifstream in(f16.out + "/metrics.jsonl");
  double scale = 0;
  int64_t skipped = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const bool skip = j["skipped"].get<bool>();
    skipped += skip;
    scale = skip ? j["loss_scale"].get<double>() / 2 : j["loss_scale"].get<double>() * 2;
  }
  EXPECT_EQ(c->loss_scaler->scale, scale);
  EXPECT_EQ(c->loss_scaler->skipped_steps, skipped);
  EXPECT_EQ(c->loss_scaler->growth_tracker, 0);  // interval 1: every finite step grows

  JobSpec f32 = Job("f32", 2, false);
  ASSERT_TRUE(Run(f32).ok());
  Result<CheckpointState> plain = ReadCheckpoint(CheckpointsDir(f32.out) + "/" + CheckpointName(2));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->loss_scaler.has_value());

  nlohmann::json state = nlohmann::json::parse(std::ifstream(dir + "/state.json"));
  state["loss_scaler"]["scale"] = "big";
  std::ofstream(dir + "/state.json") << state.dump();
  Result<CheckpointState> bad = ReadCheckpoint(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("loss_scaler"), std::string::npos)
      << bad.status().ToString();
}

TEST_F(CheckpointTest, CorruptCheckpointIsDetectedAndSkipped) {
  for (const bool compress : {false, true}) {
    JobSpec trained = Job("run" + std::to_string(compress), 4, false);
    trained.save_every = 2;
    trained.checkpoint_compress = compress;
    ASSERT_TRUE(Run(trained).ok());
    for (const bool truncate : {false, true}) {
      JobSpec job = trained;
      job.out += truncate ? "_truncated" : "_flipped";
      fs::copy(trained.out, job.out, fs::copy_options::recursive);
      const std::string newest = CheckpointsDir(job.out) + "/" + CheckpointName(4);
      const std::string victim =
          newest + "/optimizer.safetensors" + (compress ? std::string(".zst") : "");
      const auto size = fs::file_size(victim);
      if (truncate) {
        fs::resize_file(victim, size / 2);
      } else {
        std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(std::streamoff(size / 2));
        char c = 0;
        f.read(&c, 1);
        f.seekp(std::streamoff(size / 2));
        c = char(c ^ 0x10);
        f.write(&c, 1);
      }
      Result<CheckpointState> bad = ReadCheckpoint(newest);
      ASSERT_FALSE(bad.ok());
      EXPECT_EQ(bad.status().code(), StatusCode::kCorruption) << bad.status().ToString();
      EXPECT_NE(bad.status().message().find(victim), std::string::npos) << bad.status().message();
      std::vector<std::string> warnings;
      Result<CheckpointState> c =
          LoadLatestCheckpoint(job.out, [&](const std::string& w) { warnings.push_back(w); });
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_EQ(c->step, 2);
      ASSERT_EQ(warnings.size(), 1u);
      EXPECT_NE(warnings[0].find(CheckpointName(4)), std::string::npos) << warnings[0];
    }
  }
}

// A compressed tensor file is decompressed a piece at a time, straight into its tensors: it reads
// back as the uncompressed one does, and a raw size in state.json the frames do not make (more or
// fewer bytes) is Corruption naming the file.
TEST_F(CheckpointTest, ACompressedFileReadsInPiecesAndItsRawSizeIsChecked) {
  std::map<bool, CheckpointState> read;
  for (const bool compress : {false, true}) {
    JobSpec job = Job("pieces" + std::to_string(compress), 2, false);
    job.save_every = 2;
    job.checkpoint_compress = compress;
    ASSERT_TRUE(Run(job).ok());
    Result<CheckpointState> c = ReadCheckpoint(CheckpointsDir(job.out) + "/" + CheckpointName(2));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    read[compress] = std::move(*c);
  }
  EXPECT_EQ(read[true].trainable.tensors, read[false].trainable.tensors);
  EXPECT_EQ(read[true].exp_avg.tensors, read[false].exp_avg.tensors);
  EXPECT_EQ(read[true].exp_avg_sq.tensors, read[false].exp_avg_sq.tensors);
  EXPECT_FALSE(read[true].trainable.tensors.empty());
  const std::string dir = CheckpointsDir(Job("pieces1", 2, false).out) + "/" + CheckpointName(2);
  const nlohmann::json original = nlohmann::json::parse(std::ifstream(dir + "/state.json"));
  for (const int64_t delta : {-4, 4}) {
    nlohmann::json state = original;
    nlohmann::json& entry = state["files"]["trainable.safetensors.zst"];
    entry["raw_bytes"] = entry["raw_bytes"].get<int64_t>() + delta;
    std::ofstream(dir + "/state.json") << state.dump();
    Result<CheckpointState> bad = ReadCheckpoint(dir);
    ASSERT_FALSE(bad.ok()) << delta;
    EXPECT_EQ(bad.status().code(), StatusCode::kCorruption) << bad.status().ToString();
    EXPECT_NE(bad.status().message().find(dir + "/trainable.safetensors.zst"), std::string::npos)
        << bad.status().ToString();
  }
}

// A tensor file is read a piece at a time, its header parsed before the checksum can be checked:
// a damaged header is still a corrupt checkpoint naming the file, never a crash nor another error
// code — a flipped byte in a dtype, and an empty tensor placed inside another's bytes (which the
// format's own checks let through).
TEST_F(CheckpointTest, ADamagedHeaderIsCorruption) {
  JobSpec trained = Job("header", 2, false);
  trained.save_every = 2;
  ASSERT_TRUE(Run(trained).ok());
  const std::string ckpt = CheckpointsDir(trained.out) + "/" + CheckpointName(2);
  const std::string victim = ckpt + "/trainable.safetensors";
  std::string original;
  {
    std::ifstream in(victim, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(original.size(), 16u);
  std::string flipped = original;
  const size_t dtype = flipped.find("\"F32\"");
  ASSERT_NE(dtype, std::string::npos);
  flipped[dtype + 2] = char(flipped[dtype + 2] ^ 0x10);  // "F32" -> "F#2"
  std::string nested = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  nested.append((8 - nested.size() % 8) % 8, ' ');
  std::string crafted(8, '\0');
  for (int i = 0; i < 8; ++i) crafted[size_t(i)] = char(uint8_t(nested.size() >> (8 * i)));
  crafted += nested + std::string(8, '\x01');
  for (const std::string* bytes : {&flipped, &crafted}) {
    {
      std::ofstream out(victim, std::ios::binary | std::ios::trunc);
      out << *bytes;
    }
    // state.json's size for the file, so the read gets past the size check.
    std::ifstream in(ckpt + "/state.json");
    nlohmann::json state = nlohmann::json::parse(in);
    state["files"]["trainable.safetensors"]["bytes"] = bytes->size();
    std::ofstream(ckpt + "/state.json", std::ios::trunc) << state.dump(2);
    Result<CheckpointState> bad = ReadCheckpoint(ckpt);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kCorruption) << bad.status().ToString();
    EXPECT_NE(bad.status().message().find(victim), std::string::npos) << bad.status().message();
  }
}

TEST_F(CheckpointTest, NoIntactCheckpointIsAnErrorWithAdvice) {
  Result<CheckpointState> c = LoadLatestCheckpoint(dir_ + "/nothing", nullptr);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("start a new run"), std::string::npos);
}

// A save that fails at any stage leaves the previous checkpoint and `latest` as they were, and no
// temporary folder behind.
TEST_F(CheckpointTest, FailedSaveLeavesPreviousCheckpoint) {
  for (const char* stage : {"trainable", "optimizer", "metrics", "state", "publish"}) {
    JobSpec job = Job(std::string("run_") + stage, 4, true);
    job.save_every = 2;
    const std::string want = stage;
    RunControl control;
    control.checkpoint_fault_hook = [want](int64_t step, std::string_view reached) {
      return step == 4 && reached == want ? Status::IOError("injected") : Status::Ok();
    };
    Status s = Run(job, control);
    ASSERT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(CheckpointsDir(job.out))) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"latest", CheckpointName(2)})) << stage;
    Result<CheckpointState> c = LoadLatestCheckpoint(job.out, nullptr);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->step, 2);
  }
}

TEST_F(CheckpointTest, StopSignalsTurnSignalsIntoPolls) {
  {
    Result<StopSignals> signals = StopSignals::Install();
    ASSERT_TRUE(signals.ok()) << signals.status().ToString();
    EXPECT_FALSE(StopSignals::Install().ok());  // one at a time
    EXPECT_EQ(signals->Poll(), 0);
    ASSERT_EQ(::raise(SIGTERM), 0);  // handled: the process lives on
    // TSan may run a handler a little after raise returns: wait for it (no time asserted).
    for (int i = 0; i < 5000 && signals->Poll() == 0; ++i) ::usleep(1000);
    EXPECT_EQ(signals->Poll(), SIGTERM);
    ASSERT_EQ(::raise(SIGINT), 0);  // a second one changes nothing
    ::usleep(1000);
    EXPECT_EQ(signals->Poll(), SIGTERM);
  }
  // Uninstalled: the previous disposition is back, and a new StopSignals starts clear.
  struct sigaction now = {};
  ASSERT_EQ(::sigaction(SIGTERM, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  Result<StopSignals> again = StopSignals::Install();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->Poll(), 0);
}

}  // namespace
}  // namespace ferry
