// Runs the ferry binary (FERRY_BINARY, set by tests/CMakeLists.txt) as a user
// would, for the command-line tests: exit code and combined stdout + stderr.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace ferry::testing {

struct CommandResult {
  int code = -1;
  std::string output;  // stdout and stderr
};

inline CommandResult Ferry(const std::string& args) {
  CommandResult r;
  const std::string cmd = std::string(FERRY_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace ferry::testing
