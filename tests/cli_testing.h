// Runs the ferry binary (FERRY_BINARY, set by tests/CMakeLists.txt) as a user
// would, for the command-line tests: exit code and combined stdout + stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace ferry::testing {

struct CommandResult {
  int code = -1;
  std::string output;  // stdout and stderr
};

// `env`: assignments put before the command ("NAME=value ...").
inline CommandResult Ferry(const std::string& args, const std::string& env = "") {
  CommandResult r;
  const std::string cmd =
      (env.empty() ? "" : "env " + env + " ") + std::string(FERRY_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
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
