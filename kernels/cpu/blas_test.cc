// CpuBlas (kernels/cpu/blas.h) and CpuFeatures against /proc/cpuinfo, read here independently:
//  - the flags CPUID gives equal the kernel's;
//  - the OpenBLAS core in use is not below what the flags allow (the library's own report,
//    openblas_get_corename; with a user's OPENBLAS_CORETYPE set, the automatic choice is checked
//    in a child process without it);
//  - every OpenBLAS core at or below the host's ISA runs this binary's GEMM and LM-head tests
//    (element by element against their references) in a child process forced to that core.
#include "kernels/cpu/blas.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/testing/host_cpu.h"

namespace ferry::cpu {
namespace {

using testing::CpuinfoFlags;

// OpenBLAS core names by the x86 ISA level their kernels need, lowest first.
int CoreRank(std::string core) {
  std::transform(core.begin(), core.end(), core.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  const std::vector<std::vector<std::string>> levels = {
      {"prescott"},
      {"core2", "penryn", "dunnington"},
      {"nehalem"},
      {"sandybridge", "bulldozer", "piledriver"},
      {"haswell", "zen", "steamroller", "excavator"},
      {"skylakex"},
      {"cooperlake", "sapphirerapids"}};
  for (size_t i = 0; i < levels.size(); ++i) {
    if (std::find(levels[i].begin(), levels[i].end(), core) != levels[i].end()) return int(i);
  }
  return -1;
}

// The lowest core rank /proc/cpuinfo's flags allow (the same table, from the kernel's words).
int RequiredRank(const std::set<std::string>& f) {
  auto has = [&](const char* x) { return f.count(x) > 0; };
  const bool avx512 =
      has("avx512f") && has("avx512cd") && has("avx512bw") && has("avx512dq") && has("avx512vl");
  if (avx512 && has("avx512_bf16")) return 6;
  if (avx512) return 5;
  if (has("avx2") && has("fma")) return 4;
  if (has("avx")) return 3;
  if (has("sse4_2")) return 2;
  if (has("ssse3")) return 1;
  return 0;
}

// This binary again with OPENBLAS_CORETYPE set to `core` (empty: unset).
int RunChild(const std::string& filter, const std::string& core) {
  return testing::RunChild(filter, {{"OPENBLAS_CORETYPE", core}});
}

TEST(CpuFeatures, AgreeWithProcCpuinfo) {
  const std::set<std::string> flags = CpuinfoFlags();
  if (flags.empty()) GTEST_SKIP() << "/proc/cpuinfo has no flags line (not x86 Linux?)";
  const CpuFeatures f = DetectCpuFeatures();
  const std::vector<std::pair<const char*, bool>> pairs = {
      {"pni", f.sse3},          {"ssse3", f.ssse3},
      {"sse4_1", f.sse41},      {"sse4_2", f.sse42},
      {"avx", f.avx},           {"avx2", f.avx2},
      {"fma", f.fma},           {"f16c", f.f16c},
      {"avx512f", f.avx512f},   {"avx512cd", f.avx512cd},
      {"avx512bw", f.avx512bw}, {"avx512dq", f.avx512dq},
      {"avx512vl", f.avx512vl}, {"avx512_bf16", f.avx512_bf16},
      {"amx_tile", f.amx_tile}, {"amx_bf16", f.amx_bf16}};
  for (const auto& [name, detected] : pairs) {
    EXPECT_EQ(detected, flags.count(name) > 0) << name;
  }
}

TEST(CpuBlas, CoreInUseIsNotBelowTheCpuinfoFlags) {
  const std::set<std::string> flags = CpuinfoFlags();
  if (flags.empty()) GTEST_SKIP() << "/proc/cpuinfo has no flags line (not x86 Linux?)";
  if (const char* user = std::getenv("OPENBLAS_CORETYPE"); user != nullptr && *user) {
    // The user's choice is honoured; check the automatic one where nobody chose.
    EXPECT_EQ(Blas().core_source(),
              std::string("OPENBLAS_CORETYPE=") + user + " from the environment");
    ASSERT_EQ(RunChild("CpuBlas.CoreInUseIsNotBelowTheCpuinfoFlags", ""), 0);
    return;
  }
  const CpuBlas& b = Blas();
  const int rank = CoreRank(b.core_name());
  EXPECT_GE(rank, RequiredRank(flags)) << b.Describe() << " runs below the CPU's flags";
  EXPECT_NE(b.core_source().find("chosen from CPU flags"), std::string::npos) << b.Describe();
  EXPECT_NE(b.config().find("OpenBLAS"), std::string::npos) << b.config();
}

TEST(CpuBlas, LoadedCoreIsTheOneAsked) {
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  const std::string want =
      asked != nullptr && *asked ? std::string(asked) : OpenBlasCoreFor(DetectCpuFeatures());
  std::string got = Blas().core_name();
  EXPECT_EQ(CoreRank(got), CoreRank(want)) << "asked " << want << ", loaded " << got;
}

TEST(CpuBlas, EveryCoreAtOrBelowTheHostIsaMatchesTheReference) {
  if (std::getenv("FERRY_TEST_CHILD") != nullptr) GTEST_SKIP() << "a child run";
#if defined(__SANITIZE_THREAD__)
  // The children repeat the GEMM tests once per OpenBLAS core; the TSan build runs those tests
  // on its own core (their threads are covered there), the normal and ASan builds on every core.
  GTEST_SKIP() << "the per-core children run in the normal and ASan builds (~300 s under TSan)";
#endif
  const std::set<std::string> flags = CpuinfoFlags();
  if (flags.empty()) GTEST_SKIP() << "/proc/cpuinfo has no flags line (not x86 Linux?)";
  const int host = RequiredRank(flags);
  const bool amd = DetectCpuFeatures().vendor == "AuthenticAMD";
  std::vector<std::string> cores = {
      "Prescott", "Core2",     "Nehalem", "Sandybridge", amd ? "Zen" : "Haswell",
      "SkylakeX", "Cooperlake"};
  if (amd && host >= 4) cores.push_back("Haswell");  // the Intel-tuned AVX2 blocking too
  int ran = 0;
  for (const std::string& core : cores) {
    if (CoreRank(core) > host) continue;
    SCOPED_TRACE(core);
    EXPECT_EQ(RunChild("CpuGemm.*:CpuBlas.LoadedCoreIsTheOneAsked:*LmHead*", core), 0)
        << "the GEMM tests fail on OpenBLAS core " << core;
    ++ran;
  }
  EXPECT_GE(ran, 1);
}

TEST(CpuBlas, DescribeNamesTheCoreAndTheIsa) {
  const CpuBlas& b = Blas();
  const std::string d = b.Describe();
  EXPECT_NE(d.find("core " + b.core_name()), std::string::npos) << d;
  EXPECT_NE(d.find("host ISA " + CpuIsaName(DetectCpuFeatures())), std::string::npos) << d;
  EXPECT_EQ(d.rfind("OpenBLAS ", 0), 0u) << d;
}

}  // namespace
}  // namespace ferry::cpu
