// The command line's matrix through the real binary: each row is a command (train, plan, eval,
// generate, tokenize, probe) crossed with a case (a missing path, a huge number, a misspelled
// option or job-file key, a bad job-file value, an unwritable or foreign output, a full disk) and
// asserts the exit code, the message's key words and the files on disk before and after (nothing
// of the user's changed, no partial file). Only refusals run here, so the whole matrix takes about
// as long as starting the binary once per row; the rows that train are in CheckpointCliTest and
// FullDiskCliTest.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <sstream>
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

struct Row {
  std::string args;
  std::vector<std::string> words;
  int code = 1;
};

class CommandMatrixCliTest : public ferry::testing::CliTest {
 protected:
  // Runs every row in dir_ and checks that nothing under dir_ changed (no output folder, profile,
  // timeline or partial file appeared).
  void RunRows(const std::vector<Row>& rows) {
    const auto before = Snapshot(dir_);
    for (const Row& row : rows) {
      CommandResult r = Ferry(row.args);
      EXPECT_EQ(r.code, row.code) << row.args << "\n" << r.output;
      ExpectWords(r, row.words);
      EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
    }
    EXPECT_EQ(Snapshot(dir_), before);
  }
  std::string Job(const std::string& text) {
    std::ofstream(dir_ + "/job.toml") << text;
    return dir_ + "/job.toml";
  }
};

TEST_F(CommandMatrixCliTest, MissingPaths) {
  const std::string none = dir_ + "/none";
  RunRows({
      {"train --data " + none + ".jsonl --out " + dir_ + "/run --steps 1", {none + ".jsonl"}},
      {"plan --model " + none, {none}},
      {"plan --hardware " + none + ".json", {"--hardware", none + ".json"}},
      {"eval --data " + none + ".jsonl", {none + ".jsonl"}},
      {"eval --model " + none + " --data " + none + ".jsonl", {none}},
      {"generate --model " + none + " --prompt hi", {none}},
      {"tokenize --model " + none + " --text hi", {none}},
      {"probe --base " + none + ".json --out " + dir_ + "/hw.json", {"--base", none + ".json"}},
      {"--config " + none + ".toml train", {none + ".toml"}},
  });
  EXPECT_FALSE(fs::exists(dir_ + "/run/model.safetensors"));
}

TEST_F(CommandMatrixCliTest, HugeNumbers) {
  const std::string run = dir_ + "/run";
  RunRows({
      {"train --steps 99999999999999999999 --out " + run,
       {"--steps", "'99999999999999999999' is not a whole number (in 64 bits)"}},
      {"train --seq-len 100000 --out " + run, {"--seq-len 100000 exceeds", "512 positions"}},
      {"train --batch-size 1000000000 --out " + run,
       {"--batch-size 1000000000", "of device memory", "this machine has"}},
      {"train --batch-size 9223372036854775807 --out " + run, {"2^40 tokens"}},
      {"plan --model qwen3-0.6b --seq-len 100000000", {"--seq-len 100000000 exceeds", "40960"}},
      {"eval --data " + dir_ + "/none.jsonl --batch-size 1000000000",
       {"--batch-size 1000000000 x --seq-len 128", "of device memory"}},
      {"eval --data " + dir_ + "/none.jsonl --seq-len 100000", {"--seq-len 100000 exceeds"}},
      {"generate --prompt hi --max-tokens 100000", {"--max-tokens 100000", "512 positions"}},
      {"generate --prompt hi --max-tokens 9223372036854775807", {"--max-tokens", "positions"}},
      {"probe --layers-only --model tiny --seq-len 100000 --out " + dir_ + "/hw.json",
       {"--seq-len 100000 exceeds"}},
      {"tokenize --model tiny --decode --text 99999999999999999999", {"99999999999999999999"}},
      {"train --seed -1 --out " + run, {"--seed", "'-1' is not a whole number of 0 or more"}},
  });
  EXPECT_FALSE(fs::exists(run));
}

TEST_F(CommandMatrixCliTest, MisspelledOptions) {
  RunRows({
      {"train --stpes 3", {"unknown option --stpes", "did you mean --steps"}},
      {"plan --hardwre x", {"did you mean --hardware"}},
      {"eval --dta x.jsonl", {"did you mean --data"}},
      {"generate --promt hi", {"did you mean --prompt"}},
      {"tokenize --txt hi", {"did you mean --text"}},
      {"probe --qick", {"did you mean --quick"}},
  });
}

// Job files name the file, the line and the key, for an unknown key and for a bad value, with
// each command; a later error about a value the file set names them too.
TEST_F(CommandMatrixCliTest, JobFileKeysAndValues) {
  const std::string job = dir_ + "/job.toml";
  auto row = [&](const std::string& text, const std::string& command,
                 std::vector<std::string> words) {
    std::ofstream(job) << text;
    CommandResult r = Ferry("--config " + job + " " + command);
    EXPECT_EQ(r.code, 1) << text << "\n" << r.output;
    ExpectWords(r, words);
  };
  row("steps = 2\nlora-rnk = 4\n", "train", {"job.toml:2", "unknown key 'lora-rnk'", "lora-rank"});
  row("# a comment\n\nsteps = abc\n", "train",
      {"job.toml:3", "steps = abc", "not a whole number", "--steps"});
  row("steps = 3\nlr = -1\n", "train --out " + dir_ + "/run",
      {"job.toml:2: lr = -1", "--lr must be a positive number"});
  row("seed = -5\n", "train", {"job.toml:1", "seed = -5", "0 or more"});
  row("skip-bad-lines = maybe\n", "train", {"job.toml:1", "not true or false"});
  row("steps = [1, 2]\n", "train", {"job.toml:1", "takes one value"});
  row("steps = 1\nsteps = 2\n", "train", {"job.toml:1", "takes one value"});
  row("steps = 1\nlr = 0.1\nsteps = 2\n", "train", {"job.toml:3", "set twice"});
  row("[bogus]\nsteps = 1\n", "train", {"job.toml:1", "unknown section [bogus]"});
  row("train.x.steps = 1\n", "train", {"job.toml:1", "'train.x.steps' is not a job option"});
  row("[bogus]\n", "train", {"job.toml:1", "unknown section [bogus]"});
  row("config = other.toml\n", "train", {"job.toml:1", "cannot be set in a job file"});
  row("help = true\n", "train", {"job.toml:1", "cannot be set in a job file"});
  row("model = \"qwen3-0.6b\"\nseq-len = 100000000\n", "plan",
      {"job.toml:2: seq-len = 100000000", "exceeds"});
  row("seq-lne = 8\n", "plan", {"job.toml:1", "did you mean 'seq-len'"});
  row("batch-size = 0\n", "eval --data " + dir_ + "/none.jsonl",
      {"job.toml:1: batch-size = 0", "--batch-size at least 1"});
  row("max-tokens = 0\n", "generate --prompt hi",
      {"job.toml:1: max-tokens = 0", "--max-tokens must be at least 1"});
  row("threads = 100000\n", "probe --out " + dir_ + "/hw.json",
      {"job.toml:1: threads = 100000", "--threads 100000 exceeds"});
  row("txt = hi\n", "tokenize", {"job.toml:1", "did you mean 'text'"});
  EXPECT_FALSE(fs::exists(dir_ + "/run"));
  EXPECT_FALSE(fs::exists(dir_ + "/hw.json"));
}

// Outputs that cannot be written: the error names the path and the OS reason; nothing partial is
// left, and a file that was there keeps its contents.
TEST_F(CommandMatrixCliTest, UnwritableAndForeignOutputs) {
  const std::string file = dir_ + "/notes.txt";
  std::ofstream(file) << "mine\n";
  const std::string plan = "plan --model smollm2-135m --seq-len 256 --batch-size 3";
  RunRows({
      {"train --steps 1 --out " + file, {"--out", file, "Not a directory"}},
      {"train --steps 1 --out " + file + "/run", {file + "/run"}},
      {plan + " --svg " + file + "/x.svg", {file + "/x.svg", "Not a directory"}},
      {plan + " --trace " + dir_ + "/none/x.json", {dir_ + "/none/x.json", "No such file"}},
      {plan + " --svg /dev/full", {"/dev/full", "No space left on device", "the disk is full"}},
      {"probe --layers-only --model tiny --seq-len 8 --batch-size 1 --repeats 1 --threads 1 "
       "--out /dev/full",
       {"/dev/full", "the disk is full"}},
      {"probe --layers-only --model tiny --seq-len 8 --batch-size 1 --repeats 1 --threads 1 "
       "--out " +
           file + "/hw.json",
       {file + "/hw.json", "Not a directory"}},
  });
}

// `plan --nvme-dir`: the folder must exist, and the plan may count on no more than its free space
// (statvfs); an --nvme-space beyond it is refused naming both.
TEST_F(CommandMatrixCliTest, PlanNvmeDirChecksFreeSpace) {
  const std::string plan = "plan --model smollm2-135m --seq-len 256 --batch-size 3 --nvme-dir ";
  RunRows({
      {plan + dir_ + "/none", {"--nvme-dir", "statvfs " + dir_ + "/none", "No such file"}},
      {plan + dir_ + " --nvme-space 100000TiB",
       {"--nvme-space 100000TiB", "exceeds the", "free in --nvme-dir " + dir_}},
  });
  CommandResult r = Ferry(plan + dir_ + " --nvme-space 1GiB");
  EXPECT_EQ(r.code, 0) << r.output;
}

// stdout on a full disk: a failure naming it, for the commands whose output is stdout.
TEST_F(CommandMatrixCliTest, FullStdout) {
  const std::vector<std::string> commands = {
      "tokenize --model tiny --text hello", "generate --prompt hi --max-tokens 2 --threads 1",
      "plan --model smollm2-135m --seq-len 256 --batch-size 3"};
  for (const std::string& c : commands) {
    CommandResult r = Ferry(c, "", "/dev/full");
    EXPECT_EQ(r.code, 1) << c << "\n" << r.output;
    ExpectWords(r, {"stdout", "the disk is full"});
  }
}

// A timeline that was there stays whole when its rewrite fails (the file size limit, as on a full
// disk): written beside and renamed, never truncated first.
TEST_F(CommandMatrixCliTest, FailedRewriteKeepsTheOldFile) {
  const std::string svg = dir_ + "/step.svg";
  const std::string plan = "plan --model smollm2-135m --seq-len 256 --batch-size 3 --svg " + svg;
  ASSERT_EQ(Ferry(plan).code, 0);
  const auto before = Snapshot(dir_);
  rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  CommandResult r = Ferry(plan);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  EXPECT_EQ(r.code, 1) << r.output;
  ExpectWords(r, {svg, "File too large"});
  EXPECT_EQ(Snapshot(dir_), before);
}

// metrics.jsonl on a full disk (the file size limit): the run fails naming the file and the
// reason, and the file holds whole lines only.
TEST_F(CommandMatrixCliTest, FullDiskDuringMetricsLeavesWholeLines) {
  const std::string run = dir_ + "/run";
  rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 4000;  // job.json fits; metrics.jsonl reaches it within the run
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  CommandResult r = Ferry("train --steps 40 --save-every 0" + kQuickTrain + " --out " + run);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  EXPECT_EQ(r.code, 1) << r.output;
  ExpectWords(r, {"metrics", run + "/metrics.jsonl", "File too large"});
  std::ifstream in(run + "/metrics.jsonl", std::ios::binary);
  const std::string text(std::istreambuf_iterator<char>(in), {});
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  std::istringstream lines(text);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;
  }
  EXPECT_GT(n, 0);
  EXPECT_LT(n, 40);
  EXPECT_TRUE(fs::exists(run + "/job.json"));
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    EXPECT_FALSE(e.path().string().ends_with(".tmp")) << e.path();
  }
}

// Checkpoints of another job copied into a run folder, at the steps the run will save and beyond
// it: the resumed run skips them, replaces the ones at its own steps (saying so), never counts or
// removes the others, and keeps its own newest checkpoints.
TEST_F(CommandMatrixCliTest, ForeignCheckpointsAreReplacedOrLeftAlone) {
  const std::string run = dir_ + "/run", other = dir_ + "/other";
  CommandResult a = Ferry("train --steps 4 --save-every 2" + kQuickTrain + " --out " + run);
  ASSERT_EQ(a.code, 0) << a.output;
  CommandResult b =
      Ferry("train --steps 10 --save-every 2 --lr 0.001" + kQuickTrain + " --out " + other);
  ASSERT_EQ(b.code, 0) << b.output;
  for (const char* step : {"step-00000006", "step-00000010"}) {
    fs::copy(other + "/checkpoints/" + step, run + "/checkpoints/" + step,
             fs::copy_options::recursive);
  }
  fs::copy_file(other + "/checkpoints/latest", run + "/checkpoints/latest",
                fs::copy_options::overwrite_existing);  // "step-00000010"
  const auto foreign10 = Snapshot(run + "/checkpoints/step-00000010");
  CommandResult r = Ferry("train --resume " + run + " --steps 8");
  ASSERT_EQ(r.code, 0) << r.output;
  ExpectWords(r,
              {"skipping checkpoint step-00000010", "skipping checkpoint step-00000006", "(step 4)",
               "replacing " + run + "/checkpoints/step-00000006", "a checkpoint of another job"});
  auto lr_of = [&](const std::string& step) {
    std::ifstream in(run + "/checkpoints/" + step + "/state.json");
    return nlohmann::json::parse(in)["job"]["lr"].get<double>();
  };
  // This job's three newest (keep 3: 8, 6, 4; 2 pruned); the foreign step 10 untouched.
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step-00000002"));
  for (const char* step : {"step-00000004", "step-00000006", "step-00000008"}) {
    EXPECT_NE(lr_of(step), 0.001) << step;
  }
  EXPECT_EQ(Snapshot(run + "/checkpoints/step-00000010"), foreign10);
  // A later resume still finds this job's newest, not the foreign step 10.
  r = Ferry("train --resume " + run + " --steps 10");
  ASSERT_EQ(r.code, 0) << r.output;
  ExpectWords(r, {"(step 8)", "replacing " + run + "/checkpoints/step-00000010"});
  EXPECT_NE(lr_of("step-00000010"), 0.001);
}

}  // namespace
