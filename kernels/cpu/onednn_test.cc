// The CPU's bf16 GEMM path (kernels/cpu/onednn.h) against /proc/cpuinfo, read here independently:
//  - oneDNN's bf16 kernels are on exactly when the flags have AVX512-BF16 or AMX-BF16, and the
//    kernel oneDNN reports is the highest those flags allow (AMX where there is AMX);
//  - every oneDNN bf16 kernel at or below the host's ISA runs this binary's GEMM and LM-head tests
//    (element by element against the double-precision reference, kernels/cpu/gemm_test.cc,
//    lm_head_loss_test.cc) in a child process
//    capped to it with oneDNN's own DNNL_MAX_CPU_ISA, and a cap below the bf16 kernels turns the
//    path off with the reason, leaving the converted fp32 panels (tested there too);
//  - the documented numerics: bf16 denormal inputs count as zero.
#include "kernels/cpu/onednn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/testing/host_cpu.h"
#include "kernels/testing/op_testing.h"

namespace ferry::cpu {
namespace {

using testing::CpuinfoFlags;
using testing::HostTensor;

bool CpuinfoHasBf16(const std::set<std::string>& f) {
  return f.count("avx512_bf16") > 0 || f.count("amx_bf16") > 0;
}

bool UserCapsOneDnn() {
  const char* cap = std::getenv("DNNL_MAX_CPU_ISA");
  return cap != nullptr && *cap;
}

TEST(OneDnn, OnExactlyWhereTheCpuinfoFlagsHaveBf16) {
  const std::set<std::string> flags = CpuinfoFlags();
  if (flags.empty()) GTEST_SKIP() << "/proc/cpuinfo has no flags line (not x86 Linux?)";
  if (UserCapsOneDnn()) {
    // The user's cap is honoured; check the automatic choice where nobody capped.
    ASSERT_EQ(testing::RunChild("OneDnn.OnExactlyWhereTheCpuinfoFlagsHaveBf16",
                                {{"DNNL_MAX_CPU_ISA", ""}}),
              0);
    return;
  }
  const Result<const OneDnn*> d = OneDnn::Load();
  if (!CpuinfoHasBf16(flags)) {
    EXPECT_FALSE(d.ok()) << "oneDNN's bf16 path is on without bf16 flags: " << (*d)->Describe();
    EXPECT_EQ(Bf16GemmLibrary(), nullptr);
    EXPECT_NE(Bf16GemmPathDescription().find("converted panels"), std::string::npos);
    return;
  }
  ASSERT_TRUE(d.ok()) << "the CPU has bf16 instructions but oneDNN's path is off: "
                      << d.status().ToString();
  EXPECT_EQ(Bf16GemmLibrary(), *d);
  const std::string& what = (*d)->Describe();
  EXPECT_NE(what.find("oneDNN"), std::string::npos) << what;
  const char* want = flags.count("amx_bf16") ? "avx512_core_amx_bf16" : "avx512_core_bf16";
  EXPECT_NE(what.find(want), std::string::npos) << what << " runs below the CPU's flags";
  EXPECT_EQ(Bf16GemmPathDescription(), "bf16 GEMM: " + what);
}

// In a child capped by DNNL_MAX_CPU_ISA: the kernel in use is the one the cap names, or the path
// is off when FERRY_TEST_EXPECT_OFF is set.
TEST(OneDnn, ChildRunsTheKernelAsked) {
  if (std::getenv("FERRY_TEST_CHILD") == nullptr || !UserCapsOneDnn()) {
    GTEST_SKIP() << "run as a child by OneDnn.EveryBf16KernelAtOrBelowTheHostMatchesTheReference";
  }
  const Result<const OneDnn*> d = OneDnn::Load();
  if (std::getenv("FERRY_TEST_EXPECT_OFF") != nullptr) {
    EXPECT_FALSE(d.ok());
    EXPECT_EQ(Bf16GemmLibrary(), nullptr);
    return;
  }
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  std::string want = std::getenv("DNNL_MAX_CPU_ISA");
  for (char& ch : want) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  EXPECT_NE((*d)->Describe().find("brg:" + want), std::string::npos) << (*d)->Describe();
}

TEST(OneDnn, EveryBf16KernelAtOrBelowTheHostMatchesTheReference) {
  if (std::getenv("FERRY_TEST_CHILD") != nullptr) GTEST_SKIP() << "a child run";
#if defined(__SANITIZE_THREAD__)
  // The children repeat single-threaded numerics per kernel (the normal build runs them); the
  // threads of the oneDNN path are covered here by the CpuGemm tests themselves.
  GTEST_SKIP() << "the per-kernel children run in the normal and ASan builds (~100 s under TSan)";
#endif
  const std::set<std::string> flags = CpuinfoFlags();
  if (!CpuinfoHasBf16(flags)) GTEST_SKIP() << "the CPU has neither AVX512-BF16 nor AMX-BF16";
  const std::string tests = "CpuGemm.*:LmHeadLossTest.*:OneDnn.ChildRunsTheKernelAsked";
  std::vector<std::string> kernels;
  if (flags.count("avx512_bf16")) kernels.push_back("AVX512_CORE_BF16");
  if (flags.count("amx_bf16")) kernels.push_back("AVX512_CORE_AMX");
  for (const std::string& isa : kernels) {
    SCOPED_TRACE(isa);
    EXPECT_EQ(testing::RunChild(tests, {{"DNNL_MAX_CPU_ISA", isa}}), 0)
        << "the GEMM tests fail on oneDNN's " << isa << " kernels";
  }
  // Capped below its bf16 kernels, the path is off and bf16 runs on converted panels.
  EXPECT_EQ(testing::RunChild(
                tests, {{"DNNL_MAX_CPU_ISA", "AVX512_CORE"}, {"FERRY_TEST_EXPECT_OFF", "1"}}),
            0);
}

TEST(OneDnn, Bf16DenormalInputsCountAsZero) {
  const OneDnn* d = Bf16GemmLibrary();
  if (d == nullptr) GTEST_SKIP() << Bf16GemmPathDescription();
  // A = [tiny, 1] (1 x 2) and B = [[2^127], [0]]: the exact product is tiny * 2^127 = 1.
  const float tiny = 0x1p-127f;  // a bf16 denormal (bf16 keeps f32's exponent range)
  HostTensor a(DType::kBF16, {1, 2}, {tiny, 1.0f}), b(DType::kBF16, {2, 1}, {0x1p127f, 0.0f});
  ASSERT_EQ(a.Get()[0], tiny) << "bf16 storage kept the denormal";
  ThreadPool pool(1);
  const GemmDTypes dt{DType::kBF16, DType::kBF16, DType::kF32};
  HostTensor scratch(DType::kF32, {int64_t(GemmScratchBytes(1, 1, 1, 2, dt) / 4) + 1});
  for (const OneDnn* path : {static_cast<const OneDnn*>(nullptr), d}) {
    HostTensor c(DType::kF32, {1, 1});
    const GemmArgs g{
        .a = a.tensor(), .b = b.tensor(), .c = c.tensor(), .scratch = scratch.tensor()};
    ASSERT_TRUE(GemmWith(pool, g, path).ok());
    // The converted fp32 panels keep the denormal; oneDNN's bf16 kernels flush it (documented).
    EXPECT_EQ(c.Get()[0], path == nullptr ? 1.0f : 0.0f) << (path ? d->Describe() : "panels");
  }
}

// oneDNN's scratchpad is the call's own (user mode, so the plan's scratch is all it takes): a
// product whose scratchpad is larger than the call's scratch runs in blocks that fit (ragged last
// blocks included), writing into that scratch; with no scratch at all it runs on oneDNN's own.
// bf16 C, which oneDNN accumulates in an fp32 scratchpad buffer. With one K block (k = 96) the
// blocks give the whole product's bits; with several (k = 600) oneDNN's K blocking may differ
// with the block's shape (the same terms summed in another order), so each element is the whole
// product's within one bf16 ulp.
TEST(OneDnn, ScratchpadComesFromTheCallAndBlocksFitIt) {
  const OneDnn* d = Bf16GemmLibrary();
  if (d == nullptr) GTEST_SKIP() << Bf16GemmPathDescription();
  const int64_t m = 300, n = 200;  // no multiples of 32: ragged blocks
  std::vector<std::byte> ample(size_t(16) << 20), tight(size_t(16) << 10);
  for (const int64_t k : {int64_t(96), int64_t(600)}) {
    for (const bool trans_a : {false, true}) {
      for (const bool trans_b : {false, true}) {
        SCOPED_TRACE("k " + std::to_string(k) + ", trans_a " + (trans_a ? "1" : "0") +
                     ", trans_b " + (trans_b ? "1" : "0"));
        HostTensor a(DType::kBF16, trans_a ? Shape{k, m} : Shape{m, k},
                     testing::RandomVector(size_t(m * k), 1));
        HostTensor b(DType::kBF16, trans_b ? Shape{n, k} : Shape{k, n},
                     testing::RandomVector(size_t(k * n), 2));
        HostTensor bias(DType::kBF16, {n}, testing::RandomVector(size_t(n), 3));
        HostTensor whole(DType::kBF16, {m, n}), blocks(DType::kBF16, {m, n});
        const auto raw = [](HostTensor& t) { return BackendAccess::Raw(t.tensor().data); };
        Bf16GemmCall call{.trans_a = trans_a,
                          .trans_b = trans_b,
                          .m = m,
                          .n = n,
                          .k = k,
                          .a = raw(a),
                          .lda = trans_a ? m : k,
                          .b = raw(b),
                          .ldb = trans_b ? k : n,
                          .ldc = n,
                          .c_dtype = DType::kBF16,
                          .bias = raw(bias),
                          .bias_dtype = DType::kBF16};
        call.c = raw(whole);
        call.scratch = ample.data();
        call.scratch_bytes = ample.size();
        ASSERT_TRUE(d->Run(call).ok());
        const std::vector<float> want = whole.Get();
        std::fill(tight.begin(), tight.end(), std::byte{0x5a});
        call.c = raw(blocks);
        call.scratch = tight.data();
        call.scratch_bytes = tight.size();
        const Status s = d->Run(call);
        ASSERT_TRUE(s.ok()) << s.message();
        EXPECT_NE(std::count(tight.begin(), tight.end(), std::byte{0x5a}), ptrdiff_t(tight.size()))
            << "oneDNN wrote nothing into the call's scratch";
        // One bf16 ulp of `want` (2^-7 relative at most), or the same bits with one K block.
        const auto expect_like_whole = [&](const std::vector<float>& got) {
          for (size_t i = 0; i < want.size(); ++i) {
            const float bound = k == 96 ? 0.0f : std::ldexp(std::fabs(want[i]), -7) + 1e-6f;
            ASSERT_LE(std::fabs(got[i] - want[i]), bound)
                << "element " << i << ": " << got[i] << " against " << want[i];
          }
        };
        expect_like_whole(blocks.Get());
        blocks.Set(std::vector<float>(want.size(), 0.0f));
        call.scratch = nullptr;
        call.scratch_bytes = 0;
        ASSERT_TRUE(d->Run(call).ok());
        expect_like_whole(blocks.Get());
      }
    }
  }
}

}  // namespace
}  // namespace ferry::cpu
