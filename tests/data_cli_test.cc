// `ferry train --data FILE` and `ferry eval` as a user runs them: dataset files, validation loss
// in metrics.jsonl, one-line errors with file and line, and eval agreeing with the training run's
// own validation loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/json.h"
#include "tests/cli_testing.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::Ferry;

class DataCliTest : public ferry::testing::CliTest {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::trunc) << text;
    return path;
  }
  // Every format of line, a dozen examples.
  std::string Dataset() {
    std::string s;
    for (int i = 0; i < 4; ++i) {
      const std::string n = std::to_string(i);
      s += R"({"text": "The ferry leaves at )" + n +
           R"( o'clock."})"
           "\n";
      s += R"({"prompt": "Q: )" + n + R"( + 1? A:", "completion": " )" + std::to_string(i + 1) +
           R"("})"
           "\n";
      s += R"({"messages": [{"role": "user", "content": "hi )" + n +
           R"("}, {"role": "assistant", "content": "hello )" + n +
           R"("}]})"
           "\n";
    }
    return s;
  }
};

std::vector<nlohmann::json> Metrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST_F(DataCliTest, HelpDocumentsTheDataOptions) {
  CommandResult r = Ferry("train --help");
  EXPECT_EQ(r.code, 0);
  for (const char* opt :
       {"--data", "--val-data", "--val-fraction", "--eval-every", "--eval-batches",
        "--chat-template", "--long-examples", "--skip-bad-lines", "--train-on-prompt"}) {
    EXPECT_NE(r.output.find(opt), std::string::npos) << opt;
  }
  r = Ferry("eval --help");
  EXPECT_EQ(r.code, 0);
  for (const char* opt : {"--model", "--data", "--max-batches", "--json", "--chat-template"}) {
    EXPECT_NE(r.output.find(opt), std::string::npos) << opt;
  }
}

TEST_F(DataCliTest, TrainWritesValidationLossAndEvalReproducesIt) {
  const std::string data = Write("train.jsonl", Dataset());
  const std::string all = Dataset();
  size_t cut = 0;
  for (int line = 0; line < 6; ++line) cut = all.find('\n', cut) + 1;
  const std::string val = Write("val.jsonl", all.substr(0, cut));  // the first six lines
  const std::string out = dir_ + "/run";
  CommandResult r = Ferry("train --data " + data + " --val-data " + val +
                          " --eval-every 2 --steps 4 --batch-size 2 --seq-len 64 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<nlohmann::json> m = Metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.size(), 4u);
  EXPECT_FALSE(m[0].contains("val_loss"));
  EXPECT_FALSE(m[2].contains("val_loss"));
  ASSERT_TRUE(m[1].contains("val_loss"));
  ASSERT_TRUE(m[3].contains("val_loss"));
  const double val_loss = m[3]["val_loss"].get<double>();
  // Fresh weights predict ~uniformly over 260 byte tokens: ln 260 = 5.56.
  EXPECT_GT(val_loss, 1.0);
  EXPECT_LT(val_loss, 7.0);

  // The run folder holds the final weights, which the last validation used: eval over the same
  // file with the same rows per batch computes the same sums (f32 weights saved exactly; the
  // same kernels in the same order), so the losses agree to rounding of the printed value.
  r = Ferry("eval --model " + out + " --data " + val + " --seq-len 64 --batch-size 2 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json e = nlohmann::json::parse(r.output);
  EXPECT_NEAR(e["loss"].get<double>(), val_loss, 1e-9 * val_loss);
  EXPECT_NEAR(e["perplexity"].get<double>(), std::exp(e["loss"].get<double>()), 1e-9);
  EXPECT_GT(e["targets"].get<int64_t>(), 0);

  r = Ferry("eval --model " + out + " --data " + data + " --seq-len 16 --batch-size 1 " +
            "--max-batches 2 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["micro_batches"].get<int64_t>(), 2);
}

TEST_F(DataCliTest, ValidationFractionAndTextFiles) {
  const std::string data = Write("corpus.txt", "one document\nstill one\n\nanother\n\nthird\n");
  CommandResult r = Ferry("train --data " + data +
                          " --val-fraction 0.34 --eval-every 1 --steps 2 --batch-size 1 "
                          "--seq-len 16 --out " +
                          dir_ + "/run");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("3 examples (1 held out for validation)"), std::string::npos) << r.output;
  for (const nlohmann::json& j : Metrics(dir_ + "/run/metrics.jsonl")) {
    EXPECT_TRUE(j.contains("val_loss")) << j.dump();
  }
}

TEST_F(DataCliTest, BadLineIsOneLineWithFileAndLineUnlessSkipped) {
  const std::string data =
      Write("bad.jsonl", Dataset() + R"({"messages": "hi"})" + "\n" + Dataset());
  CommandResult r = Ferry("train --data " + data + " --steps 1 --out " + dir_ + "/run");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(r.output, "ferry train: " + data +
                          ":13: 'messages' must be an array (--skip-bad-lines skips such lines)\n");
  r = Ferry("train --data " + data + " --skip-bad-lines --steps 1 --batch-size 2 --seq-len 32 " +
            "--out " + dir_ + "/run");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("24 examples, 1 bad line skipped"), std::string::npos) << r.output;
  // `ferry tokenize --data` shows what training sees, the skip too (--jsonl: one object a line).
  r = Ferry("tokenize --model tiny --data " + data + " --jsonl");
  EXPECT_EQ(r.code, 1) << r.output;
  r = Ferry("tokenize --model tiny --data " + data + " --skip-bad-lines --jsonl");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '{'), 24) << r.output;
  EXPECT_NE(r.output.find("\n24 examples, 1 bad line skipped, "), std::string::npos) << r.output;
  r = Ferry("tokenize --model tiny --text hi --skip-bad-lines");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--skip-bad-lines is for a dataset"), std::string::npos) << r.output;

  r = Ferry("eval --data " + dir_ + "/missing.jsonl");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("missing.jsonl"), std::string::npos) << r.output;
}

// --train-on-prompt puts the loss on the prompt too: a prompt+completion file then scores what the
// same text as {"text": ...} scores, to the bit (same tokens, same mask), in eval and in
// tokenize's view; without it fewer targets count. A run keeps the choice in job.json; over the
// built-in text it says the option changes nothing.
TEST_F(DataCliTest, TrainOnPromptScoresThePromptsToo) {
  std::string pairs, texts;
  for (int i = 0; i < 6; ++i) {
    const std::string p = "Q: " + std::to_string(i) + " + 2? A:", c = " " + std::to_string(i + 2);
    pairs += nlohmann::json{{"prompt", p}, {"completion", c}}.dump() + "\n";
    texts += nlohmann::json{{"text", p + c}}.dump() + "\n";
  }
  const std::string pc = Write("pc.jsonl", pairs), text = Write("text.jsonl", texts);
  auto eval = [&](const std::string& data, const std::string& flag) {
    CommandResult r =
        Ferry("eval --model tiny --data " + data + flag + " --seq-len 32 --batch-size 2 --json");
    EXPECT_EQ(r.code, 0) << r.output;
    return r.code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json();
  };
  const nlohmann::json all = eval(pc, " --train-on-prompt"), whole = eval(text, "");
  EXPECT_EQ(all["loss"], whole["loss"]);
  EXPECT_EQ(all["targets"], whole["targets"]);
  EXPECT_LT(eval(pc, "")["targets"].get<int64_t>(), all["targets"].get<int64_t>());
  CommandResult r = Ferry("tokenize --model tiny --data " + pc + " --train-on-prompt --jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json first = nlohmann::json::parse(r.output.substr(0, r.output.find('\n')));
  std::vector<int> want(first["ids"].size(), 1);
  want[0] = 0;  // the BOS the tokenizer adds
  EXPECT_EQ(first["trained"].get<std::vector<int>>(), want);
  r = Ferry("tokenize --model tiny --text hi --train-on-prompt");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--train-on-prompt is for a dataset's loss mask"), std::string::npos)
      << r.output;
  const std::string out = dir_ + "/run";
  r = Ferry("train --data " + pc + " --train-on-prompt --steps 1 --batch-size 2 --seq-len 32 " +
            "--threads 2 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(out + "/job.json"))["train_on_prompt"], true);
  EXPECT_EQ(r.output.find("changes nothing"), std::string::npos) << r.output;
  // The built-in text has no prompts: the run says the option does nothing, and trains.
  r = Ferry("train --train-on-prompt --steps 1 --batch-size 2 --seq-len 32 --threads 2 --out " +
            dir_ + "/builtin");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("built-in text, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--train-on-prompt changes nothing here"), std::string::npos) << r.output;
}

// A .json file holding the dataset's objects as one JSON array trains as the .jsonl file does:
// the same losses step by step; a truncated array stops the run naming the file and line.
TEST_F(DataCliTest, JsonArrayTrainsAsItsLines) {
  std::string array = "[\n";
  for (char c : Dataset()) array += c == '\n' ? std::string(",\n  ") : std::string(1, c);
  array.resize(array.size() - 4);  // the last ",\n  "
  array += "\n]\n";
  const std::string job = " --batch-size 4 --seq-len 32 --steps 2 --threads 2 --out ";
  CommandResult lines =
      Ferry("train --data " + Write("train.jsonl", Dataset()) + job + dir_ + "/a");
  ASSERT_EQ(lines.code, 0) << lines.output;
  CommandResult json = Ferry("train --data " + Write("train.json", array) + job + dir_ + "/b");
  ASSERT_EQ(json.code, 0) << json.output << array;
  const std::vector<nlohmann::json> a = Metrics(dir_ + "/a/metrics.jsonl"),
                                    b = Metrics(dir_ + "/b/metrics.jsonl");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << i;
  const std::string cut = Write("cut.json", array.substr(0, array.size() / 2));
  CommandResult r = Ferry("train --data " + cut + job + dir_ + "/c");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(cut + ":8: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(a truncated file?)"), std::string::npos) << r.output;
}

// --epochs sets the run's length from the packed rows: ceil(epochs x rows / --batch-size) updates
// (the rows as the run's data line counts them), job.json saying so; --resume --epochs 3 goes on
// to three epochs' updates, and fewer than the checkpoint's is refused naming --epochs; --steps
// beside --epochs, and --epochs on the built-in text, are refused.
TEST_F(DataCliTest, EpochsSetTheRunsLength) {
  const std::string data = Write("train.jsonl", Dataset());
  const std::string out = dir_ + "/epochs";
  const std::string job =
      "train --data " + data + " --batch-size 4 --seq-len 16 --warmup-steps 1 --threads 2 --out ";
  CommandResult r = Ferry(job + out + " --epochs 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t at = r.output.find("training: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const long long rows = std::atoll(r.output.c_str() + at + std::strlen("training: "));
  ASSERT_GT(rows, 4) << r.output;
  const size_t two = size_t((2 * rows + 3) / 4), three = size_t((3 * rows + 3) / 4);
  EXPECT_NE(r.output.find("--epochs 2 of " + std::to_string(rows) +
                          " training rows: " + std::to_string(two) + " updates of 4 rows"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(Metrics(out + "/metrics.jsonl").size(), two);
  EXPECT_EQ(r.output.find("--warmup-steps"), std::string::npos) << r.output;  // 1 of `two`
  nlohmann::json saved = nlohmann::json::parse(std::ifstream(out + "/job.json"));
  EXPECT_EQ(saved["steps"], two);
  EXPECT_EQ(saved["epochs"], 2.0);

  r = Ferry("train --resume " + out + " --epochs 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(Metrics(out + "/metrics.jsonl").size(), three);
  saved = nlohmann::json::parse(std::ifstream(out + "/job.json"));
  EXPECT_EQ(saved["steps"], three);
  r = Ferry("train --resume " + out + " --epochs 1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--epochs 1 ("), std::string::npos) << r.output;
  EXPECT_EQ(Metrics(out + "/metrics.jsonl").size(), three);  // nothing lost
  // A count of updates takes over from the epochs.
  r = Ferry("train --resume " + out + " --steps " + std::to_string(three + 1));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(Metrics(out + "/metrics.jsonl").size(), three + 1);
  saved = nlohmann::json::parse(std::ifstream(out + "/job.json"));
  EXPECT_EQ(saved["epochs"], 0.0);
  // --epochs on the command line beats a job file's steps on a resume too.
  const size_t four = size_t(rows);  // 4 epochs of 4-row updates
  r = Ferry("train --config " + Write("steps.toml", "steps = 2\n") + " --resume " + out +
            " --epochs 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(Metrics(out + "/metrics.jsonl").size(), four);
  saved = nlohmann::json::parse(std::ifstream(out + "/job.json"));
  EXPECT_EQ(saved["epochs"], 4.0);
  EXPECT_EQ(saved["steps"], four);

  r = Ferry(job + dir_ + "/both --epochs 2 --steps 5");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--steps and --epochs"), std::string::npos) << r.output;
  // A warm-up longer than the run is said to be so.
  r = Ferry("train --data " + data +
            " --batch-size 4 --seq-len 16 --threads 2 --epochs 0.5 --out " + dir_ + "/short");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("note: --warmup-steps 20 is more than the run's"), std::string::npos)
      << r.output;
  r = Ferry("train --epochs 1 --out " + dir_ + "/builtin");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--epochs needs a --data file"), std::string::npos) << r.output;
}

}  // namespace
