// Test helpers for kernels whose path depends on the host CPU: /proc/cpuinfo's flags, read
// independently of ferry's CPUID code, and this test binary run again in a child process with
// some environment variables set (a library's kernel set is chosen when it loads, so each choice
// is tested in a process of its own).
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace ferry::testing {

// The first "flags" line of /proc/cpuinfo; empty where there is none (not x86 Linux).
inline std::set<std::string> CpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

// Runs this test binary again with --gtest_filter=`filter`, FERRY_TEST_CHILD=1 and each of `env`
// (name, value) set (an empty value: unset); returns its exit status (its output goes to ours).
inline int RunChild(const std::string& filter,
                    const std::vector<std::pair<std::string, std::string>>& env_set) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool replaced = kv.rfind("FERRY_TEST_CHILD=", 0) == 0;
    for (const auto& [name, value] : env_set) replaced |= kv.rfind(name + "=", 0) == 0;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [name, value] : env_set) {
    if (!value.empty()) env.push_back(name + "=" + value);
  }
  env.push_back("FERRY_TEST_CHILD=1");
  std::vector<char*> envp;
  for (std::string& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", flag = "--gtest_filter=" + filter;
  std::vector<char*> argv = {exe.data(), flag.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace ferry::testing
