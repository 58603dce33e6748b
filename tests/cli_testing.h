// Runs the ferry binary (FERRY_BINARY, set by tests/CMakeLists.txt) as a user
// would, for the command-line tests: exit code and combined stdout + stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace ferry::testing {

struct CommandResult {
  int code = -1;
  std::string output;  // stdout and stderr
};

// `env`: assignments put before the command ("NAME=value ..."). `stdout_to`: a file that gets
// stdout (then `output` is stderr alone).
inline CommandResult Ferry(const std::string& args, const std::string& env = "",
                           const std::string& stdout_to = "") {
  CommandResult r;
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(FERRY_BINARY) +
                          " " + args + " 2>&1" + (stdout_to.empty() ? "" : " >" + stdout_to);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The text a successful `ferry generate` printed: its output (stdout and stderr) less the lines
// its log writes on stderr (the devices at the start, the speed at the end: each a line of its own
// that starts with "ferry generate: "). A failed run's output is left whole.
inline CommandResult GeneratedText(CommandResult r) {
  if (r.code != 0) return r;
  const std::string log = "ferry generate: ";
  for (size_t at = r.output.find(log); at != std::string::npos; at = r.output.find(log, at)) {
    if (at > 0 && r.output[at - 1] != '\n') {  // not at a line's start: the text's own
      at += log.size();
      continue;
    }
    const size_t end = r.output.find('\n', at);
    r.output.erase(at, end == std::string::npos ? std::string::npos : end + 1 - at);
  }
  return r;
}

// Options that make a `ferry train` of the tiny model take a fraction of a second.
inline const std::string kQuickTrain = " --batch-size 2 --seq-len 16 --warmup-steps 2 --threads 2";

// Every file under `path` (or `path` itself when it is a file): relative path -> contents, what
// "nothing of the user's changed" compares.
inline std::map<std::string, std::string> Snapshot(const std::string& path) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> out;
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  if (!fs::exists(path)) return out;
  if (fs::is_regular_file(path)) {
    out[""] = read(path);
    return out;
  }
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), path).string()] = read(e.path());
  }
  return out;
}

// Each of `words` occurs in the command's output.
inline void ExpectWords(const CommandResult& r, const std::vector<std::string>& words) {
  for (const std::string& w : words) {
    EXPECT_NE(r.output.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.output;
  }
}

// A fixture with a fresh temporary folder per test (dir_), removed afterwards.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/ferry_cli_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

}  // namespace ferry::testing
