// Run folders, resume checks, limits and the command line, tried through the real binary as a
// careless or hostile user would: each row is a command crossed with a case, asserting the exit
// code, the message's key words and the files on disk before and after (nothing of the user's
// changed).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/json.h"
#include "tests/cli_testing.h"

namespace {

namespace fs = std::filesystem;
using ferry::testing::CommandResult;
using ferry::testing::ExpectWords;
using ferry::testing::Ferry;
using ferry::testing::kQuickTrain;
using ferry::testing::Snapshot;

class RunFolderCliTest : public ferry::testing::CliTest {
 protected:
  // A finished tiny run in `out` (checkpoints every 2 updates).
  void Train(const std::string& out, const std::string& extra = "") {
    CommandResult r =
        Ferry("train --steps 4 --save-every 2" + kQuickTrain + " --out " + out + extra);
    ASSERT_EQ(r.code, 0) << r.output;
  }
};

// --out equal to, inside or around the sources, or `/`: refused, the sources untouched.
TEST_F(RunFolderCliTest, OutNeverWritesUnderTheSources) {
  const std::string data = dir_ + "/data.txt";
  std::ofstream(data) << "hello world, hello well, the world is wide\n";
  fs::create_directories(dir_ + "/real");
  fs::create_symlink(dir_ + "/real", dir_ + "/link");
  std::ofstream(dir_ + "/real/data.txt") << "hello world\n";
  const auto before = Snapshot(dir_);
  struct Row {
    std::string args;
    const char* word;
  };
  const Row rows[] = {
      {"--data " + data + " --out " + data, "is --data"},
      {"--data " + data + " --out " + data + "/sub", "lies inside --data"},
      {"--data " + dir_ + "/link/data.txt --out " + dir_ + "/real", "holds --data"},
      {"--data " + dir_ + "/real/data.txt --out " + dir_ + "/link/data.txt", "is --data"},
      {"--out /", "filesystem root"},
  };
  for (const Row& row : rows) {
    CommandResult r = Ferry("train --steps 1" + kQuickTrain + " " + row.args);
    EXPECT_EQ(r.code, 1) << row.args << "\n" << r.output;
    ExpectWords(r, {row.word, "--out"});
  }
  EXPECT_EQ(Snapshot(dir_), before);
}

// A folder holding a file ferry did not write is never used, not even with --force.
TEST_F(RunFolderCliTest, ForeignFolderIsRefusedEvenWithForce) {
  const std::string out = dir_ + "/mine";
  fs::create_directories(out);
  std::ofstream(out + "/notes.txt") << "my notes\n";
  const auto before = Snapshot(out);
  for (const char* force : {"", " --force"}) {
    CommandResult r = Ferry("train --steps 1" + kQuickTrain + " --out " + out + force);
    EXPECT_EQ(r.code, 1) << r.output;
    ExpectWords(r, {"ferry did not write", "notes.txt", "new --out"});
    EXPECT_EQ(Snapshot(out), before);
  }
  // Nor a run folder where the user added a file.
  Train(dir_ + "/run");
  std::ofstream(dir_ + "/run/notes.txt") << "mine\n";
  CommandResult r =
      Ferry("train --steps 4 --lr 0.001" + kQuickTrain + " --out " + dir_ + "/run --force");
  EXPECT_EQ(r.code, 1) << r.output;
  ExpectWords(r, {"notes.txt"});
  EXPECT_TRUE(fs::exists(dir_ + "/run/model.safetensors"));
}

// Another job's run folder: refused naming the ways out; --force replaces it; the same job reruns.
TEST_F(RunFolderCliTest, AnotherJobsRunFolderNeedsResumeNewOutOrForce) {
  const std::string run = dir_ + "/run";
  Train(run);
  EXPECT_TRUE(fs::exists(run + "/.ferry-run"));
  const auto before = Snapshot(run);
  CommandResult r = Ferry("train --steps 4 --lr 0.001" + kQuickTrain + " --out " + run);
  EXPECT_EQ(r.code, 1) << r.output;
  ExpectWords(r, {"another job", "lr", "--resume " + run, "new --out", "--force"});
  EXPECT_EQ(Snapshot(run), before);

  r = Ferry("train --steps 4 --lr 0.001" + kQuickTrain + " --out " + run + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  std::ifstream in(run + "/job.json");
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(in)["lr"].get<double>(), 0.001);

  r = Ferry("train --steps 4 --lr 0.001" + kQuickTrain + " --out " + run);  // the same job again
  EXPECT_EQ(r.code, 0) << r.output;
}

// A run folder in use (its marker flock()ed) is refused.
TEST_F(RunFolderCliTest, LockedRunFolderIsRefused) {
  const std::string run = dir_ + "/run";
  Train(run);
  const int fd = ::open((run + "/.ferry-run").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const auto before = Snapshot(run);
  for (const std::string& args : {"--steps 4 --save-every 2" + kQuickTrain + " --out " + run,
                                  "--resume " + run + " --steps 6"}) {
    CommandResult r = Ferry("train " + args);
    EXPECT_EQ(r.code, 1) << r.output;
    ExpectWords(r, {"in use by another ferry run"});
  }
  ::close(fd);
  EXPECT_EQ(Snapshot(run), before);
}

// A run folder from before the marker existed still resumes (and gets the marker).
TEST_F(RunFolderCliTest, RunFolderWithoutMarkerResumes) {
  const std::string run = dir_ + "/run";
  Train(run);
  fs::remove(run + "/.ferry-run");
  CommandResult r = Ferry("train --resume " + run + " --steps 6");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(run + "/.ferry-run"));
}

// --steps below the checkpoint's step: refused before anything is written.
TEST_F(RunFolderCliTest, ResumeRefusesStepsBelowTheCheckpoint) {
  const std::string run = dir_ + "/run";
  Train(run);
  const auto before = Snapshot(run);
  CommandResult r = Ferry("train --resume " + run + " --steps 2");
  EXPECT_EQ(r.code, 1) << r.output;
  ExpectWords(r, {"--steps 2", "below the checkpoint's step 4"});
  EXPECT_EQ(r.output.find("final loss"), std::string::npos) << r.output;
  EXPECT_EQ(Snapshot(run), before);
}

// A checkpoint of another job in the run folder is skipped with a warning naming the difference.
TEST_F(RunFolderCliTest, ResumeSkipsAnotherJobsCheckpoint) {
  const std::string run = dir_ + "/run", other = dir_ + "/other";
  Train(run);
  CommandResult o =
      Ferry("train --steps 6 --save-every 6 --lr 0.001" + kQuickTrain + " --out " + other);
  ASSERT_EQ(o.code, 0) << o.output;
  fs::copy(other + "/checkpoints/step-00000006", run + "/checkpoints/step-00000006",
           fs::copy_options::recursive);
  std::ofstream(run + "/checkpoints/latest") << "step-00000006\n";
  CommandResult r = Ferry("train --resume " + run + " --steps 8");
  EXPECT_EQ(r.code, 0) << r.output;
  ExpectWords(r, {"skipping checkpoint step-00000006", "another job", "lr", "(step 4)"});
}

// --threads beyond the machine: one line naming the option, no run folder, no abort.
TEST_F(RunFolderCliTest, HugeThreadsIsRefusedByEveryCommand) {
  const std::string out = dir_ + "/run";
  const std::string commands[] = {
      "train --steps 1 --out " + out, "generate --prompt hi --max-tokens 2", "plan",
      "eval --data " + dir_ + "/none.jsonl", "probe --quick --out " + dir_ + "/hw.json"};
  // 100000, and a count past 32 bits (read as 64 bits everywhere, so refused by the same check).
  for (const std::string threads : {"100000", "8589934592"}) {
    for (const std::string& c : commands) {
      CommandResult r = Ferry(c + " --threads " + threads);
      EXPECT_EQ(r.code, 1) << c << "\n" << r.output;
      ExpectWords(r, {"--threads " + threads + " exceeds", "hardware threads"});
    }
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir_ + "/hw.json"));
}

// Misspelled subcommands, options and job-file keys get a suggestion; job-file errors name the
// file and the line.
TEST_F(RunFolderCliTest, MisspellingsGetDidYouMean) {
  struct Row {
    std::string args;
    std::vector<std::string> words;
  };
  const std::string job = dir_ + "/job.toml";
  std::ofstream(job) << "steps = 2\nlora-rnk = 4\n";
  const Row rows[] = {
      {"trian", {"unknown command 'trian'", "did you mean 'train'"}},
      {"genrate --prompt hi", {"did you mean 'generate'"}},
      {"train --lora-rnk 4", {"unknown option --lora-rnk", "did you mean --lora-rank"}},
      {"plan --seq-lne 8", {"did you mean --seq-len"}},
      {"--config " + job + " train", {"job.toml:2", "unknown key 'lora-rnk'", "'lora-rank'"}},
  };
  for (const Row& row : rows) {
    CommandResult r = Ferry(row.args + " --out " + dir_ + "/never");
    EXPECT_EQ(r.code, 1) << row.args << "\n" << r.output;
    ExpectWords(r, row.words);
  }
  EXPECT_FALSE(fs::exists(dir_ + "/never"));
}

// A job.json that cannot be written whole (the file size limit, as on a full disk) names the file
// and the reason, and leaves no partial job.json behind.
TEST_F(RunFolderCliTest, FailedJobJsonWriteLeavesNoPartialFile) {
  const std::string out = dir_ + "/run";
  rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 256;  // the marker fits, job.json does not
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  CommandResult r = Ferry("train --steps 1" + kQuickTrain + " --out " + out);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  EXPECT_EQ(r.code, 1) << r.output;
  ExpectWords(r, {"job.json", "File too large", "disk is full"});
  EXPECT_FALSE(fs::exists(out + "/job.json"));
  EXPECT_FALSE(fs::exists(out + "/job.json.tmp"));
}

}  // namespace
