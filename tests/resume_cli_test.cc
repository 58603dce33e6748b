// `ferry train` interrupted and resumed as a user would: kill -9 in the middle of writing a
// checkpoint, SIGTERM/SIGINT, and --resume through the real binary.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/json.h"
#include "tests/cli_testing.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using ferry::testing::CommandResult;
using ferry::testing::Ferry;

class ResumeCliTest : public ferry::testing::CliTest {};

const std::string kQuick = " --batch-size 2 --seq-len 16 --warmup-steps 2 --threads 2";

std::vector<double> Losses(const std::string& run) {
  std::vector<double> out;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (j.is_discarded()) continue;
    EXPECT_EQ(j["step"].get<size_t>(), out.size() + 1) << line;
    out.push_back(j["loss"].get<double>());
  }
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_F(ResumeCliTest, HelpDocumentsCheckpointOptions) {
  CommandResult r = Ferry("train --help");
  EXPECT_EQ(r.code, 0);
  for (const char* opt :
       {"--resume", "--save-every", "--keep-checkpoints", "--checkpoint-compress"}) {
    EXPECT_NE(r.output.find(opt), std::string::npos) << opt;
  }
}

// kill -9 (the process SIGKILLs itself, deterministically, after writing the optimizer file of
// step 4's checkpoint): step 2's checkpoint stays the latest and intact, and --resume from it
// reproduces the uninterrupted run's losses exactly.
TEST_F(ResumeCliTest, KillDuringCheckpointLeavesPreviousOneUsable) {
  const std::string straight = dir_ + "/straight", killed = dir_ + "/killed";
  CommandResult r = Ferry("train --steps 6 --save-every 2" + kQuick + " --out " + straight);
  ASSERT_EQ(r.code, 0) << r.output;
  r = Ferry("train --steps 6 --save-every 2" + kQuick + " --out " + killed,
            "FERRY_TEST_CHECKPOINT_KILL=4:optimizer");
  // Killed by SIGKILL: the shell reports 128 + 9, or the status carries the signal.
  EXPECT_TRUE(r.code == 137 || r.code == -1) << r.code << ": " << r.output;
  EXPECT_EQ(ReadFile(killed + "/checkpoints/latest"), "step-00000002\n");
  EXPECT_FALSE(fs::exists(killed + "/checkpoints/step-00000004"));
  EXPECT_TRUE(fs::exists(killed + "/checkpoints/.tmp-step-00000004"));  // the torn save

  r = Ferry("train --resume " + killed);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming from"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(killed + "/checkpoints/.tmp-step-00000004"));  // cleaned by a save
  const std::vector<double> a = Losses(straight), b = Losses(killed);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // bit for bit
}

// A run of `job` (six steps, a checkpoint every two, --nvme-dir `nvme`) into dir/killed, which
// SIGKILLs itself as `kill_env` says after `done` steps logged their loss: step `latest`'s
// checkpoint stays the latest and the run's NVMe folders `left` (under `nvme`) stay behind.
// --resume clears them, reproduces the uninterrupted run's losses (dir/straight) bit for bit,
// saying it runs the same tiers
// (`tiers`, e.g. "saved activations on NVMe"), and leaves `nvme` empty.
void ExpectKilledRunResumesBitForBit(const std::string& dir, const std::string& nvme,
                                     const std::string& job, const std::string& kill_env,
                                     size_t done, int latest, const std::vector<std::string>& left,
                                     const std::vector<std::string>& tiers) {
  const std::string killed = dir + "/killed";
  CommandResult r = Ferry(job + " --out " + killed, kill_env);
  EXPECT_TRUE(r.code == 137 || r.code == -1) << r.code << ": " << r.output;
  EXPECT_EQ(Losses(killed).size(), done) << "not killed where asked";
  char latest_name[32];
  std::snprintf(latest_name, sizeof latest_name, "step-%08d\n", latest);
  EXPECT_EQ(ReadFile(killed + "/checkpoints/latest"), latest_name);
  for (const std::string& folder : left) {
    EXPECT_TRUE(fs::exists(nvme + "/" + folder)) << "the killed run left no " << folder;
  }
  r = Ferry("train --resume " + killed);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const std::string& tier : tiers) {
    EXPECT_NE(r.output.find(tier + " in " + nvme + "/killed."), std::string::npos) << r.output;
  }
  const std::vector<double> a = Losses(dir + "/straight"), b = Losses(killed);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // bit for bit
  EXPECT_TRUE(fs::is_empty(nvme)) << "a store was left behind";
}

// kill -9 with the saved activations on NVMe, while writing step 4's checkpoint (between steps).
TEST_F(ResumeCliTest, KillWithActivationsOnNvmeResumesBitForBit) {
  const std::string nvme = dir_ + "/nvme";
  fs::create_directories(nvme);
  const std::string job =
      "train --steps 6 --save-every 2 --threads 1 --devices 2 --batch-size 64 --micro-batches 8 "
      "--seq-len 64 --host-memory 200MiB --nvme-dir " +
      nvme;
  CommandResult r = Ferry(job + " --out " + dir_ + "/straight");
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_NE(r.output.find("saved activations on NVMe in " + nvme + "/straight.activations"),
            std::string::npos)
      << r.output;
  ExpectKilledRunResumesBitForBit(dir_, nvme, job, "FERRY_TEST_CHECKPOINT_KILL=4:optimizer", 4, 2,
                                  {"killed.activations"}, {"saved activations on NVMe"});
}

class ResumeCliNvmeTest : public ResumeCliTest {
 protected:
  // A six-step job (`extra` options added) whose plan puts both saved activations and optimizer
  // state on NVMe, under dir_/nvme, with the host budget that does it; run once, uninterrupted,
  // into dir_/straight. Empty (a failure reported) when no budget tried does.
  std::string JobWithBothTiersOnNvme(const std::string& extra) {
    const std::string nvme = dir_ + "/nvme", straight = dir_ + "/straight";
    fs::create_directories(nvme);
    const std::string common =
        "train --steps 6 --save-every 2 --threads 1 --devices 2 --batch-size 64 "
        "--micro-batches 8 --seq-len 64" +
        extra + " --nvme-dir " + nvme + " --host-memory ";
    const std::string both[] = {"saved activations on NVMe in " + nvme + "/straight.activations",
                                "optimizer state on NVMe in " + nvme + "/straight.optimizer-state"};
    // The first host budget (the planner's choice today first) whose plan puts both on NVMe.
    CommandResult r;
    for (const int mib : {128, 120, 136, 132, 124, 116, 112, 108, 104, 100, 96, 92, 88}) {
      const std::string job = common + std::to_string(mib) + "MiB";
      r = Ferry(job + " --force --out " + straight);
      if (r.code == 0 && r.output.find(both[0]) != std::string::npos &&
          r.output.find(both[1]) != std::string::npos) {
        return job;
      }
    }
    ADD_FAILURE() << "no budget puts both tiers on NVMe:\n" << r.output;
    return "";
  }
};

// kill -9 inside a step with both NVMe tiers: saved activations and optimizer state on NVMe
// (--grad-clip 0, so each layer is updated as its gradients land, during the backward stages).
// The process SIGKILLs itself right after the second layer record of step 4's update is
// committed (FERRY_TEST_COMMIT_KILL): step 4's backward is still running and its other layers are
// still at step 3.
TEST_F(ResumeCliNvmeTest, KillInsideAStepWithNvmeTiersResumesBitForBit) {
  const std::string job = JobWithBothTiersOnNvme(" --grad-clip 0");
  ASSERT_FALSE(job.empty());
  ExpectKilledRunResumesBitForBit(dir_, dir_ + "/nvme", job, "FERRY_TEST_COMMIT_KILL=4:2", 3, 2,
                                  {"killed.activations", "killed.optimizer-state"},
                                  {"saved activations on NVMe", "optimizer state on NVMe"});
}

// The same with global-norm clipping (the default): step 5's update waits for its norm, so each
// layer is updated when step 6's forward asks for its weights (StepHooks::weights_needed). The
// kill comes after the second record of step 5's update is committed, while step 6's forward is
// being enqueued: step 5 has logged its loss, its other layers are still at step 4, and step 4's
// checkpoint is the latest.
TEST_F(ResumeCliNvmeTest, KillInTheForwardOfAClippedStepResumesBitForBit) {
  const std::string job = JobWithBothTiersOnNvme("");
  ASSERT_FALSE(job.empty());
  ASSERT_NE(ReadFile(dir_ + "/straight/job.json").find("\"grad_clip\": 1.0"), std::string::npos);
  ExpectKilledRunResumesBitForBit(dir_, dir_ + "/nvme", job, "FERRY_TEST_COMMIT_KILL=5:2", 5, 4,
                                  {"killed.activations", "killed.optimizer-state"},
                                  {"saved activations on NVMe", "optimizer state on NVMe"});
}

TEST_F(ResumeCliTest, ResumeRefusesChangedJobAndExtendsSteps) {
  const std::string run = dir_ + "/run";
  CommandResult r = Ferry("train --steps 2" + kQuick + " --out " + run);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const std::string& bad :
       std::vector<std::string>{"--seq-len 32", "--lora-rank 4", "--lr 0.1", "--out " + dir_}) {
    r = Ferry("train --resume " + run + " " + bad);
    EXPECT_EQ(r.code, 1) << bad << ": " << r.output;
    EXPECT_NE(r.output.find(bad.substr(0, bad.find(' '))), std::string::npos) << r.output;
  }
  r = Ferry("train --resume " + dir_ + "/none");
  EXPECT_EQ(r.code, 1) << r.output;
  // The same value as the job is fine; --steps extends the run.
  r = Ferry("train --resume " + run + " --seq-len 16 --steps 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(Losses(run).size(), 4u);
  EXPECT_NE(ReadFile(run + "/job.json").find("\"steps\": 4"), std::string::npos);
}

// Starts ferry with stdout and stderr into `log`.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  std::string bin = FERRY_BINARY;
  argv.push_back(bin.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// SIGTERM and SIGINT (each sent twice, the second while the first is being handled) stop the
// run after its current update with a checkpoint, exit 128 + the signal, and say how to resume;
// the resumed run finishes.
TEST_F(ResumeCliTest, SignalSavesCheckpointAndExitsWithItsCode) {
  for (const int sig : {SIGTERM, SIGINT}) {
    const std::string run = dir_ + "/run" + std::to_string(sig), log = run + ".log";
    const pid_t pid = Spawn({"train", "--steps", "100000", "--save-every", "0", "--batch-size", "2",
                             "--seq-len", "16", "--threads", "1", "--out", run},
                            log);
    ASSERT_GT(pid, 0);
    // Wait (no time limit asserted) until the run has made an update, so it is in the loop.
    while (!fs::exists(run + "/metrics.jsonl") || fs::file_size(run + "/metrics.jsonl") == 0) {
      ::usleep(20000);
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, WNOHANG), 0) << ReadFile(log);
    }
    ASSERT_EQ(::kill(pid, sig), 0);
    ASSERT_EQ(::kill(pid, sig), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << ReadFile(log);
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << ReadFile(log);
    const std::string out = ReadFile(log);
    EXPECT_NE(out.find("ferry train --resume " + run), std::string::npos) << out;
    const size_t done = Losses(run).size();
    ASSERT_GE(done, 1u);
    EXPECT_TRUE(fs::exists(run + "/checkpoints/step-" +
                           std::string(8 - std::to_string(done).size(), '0') +
                           std::to_string(done)))
        << out;
    CommandResult r = Ferry("train --resume " + run + " --steps " + std::to_string(done + 2));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(Losses(run).size(), done + 2);
  }
}

}  // namespace
