// Fast CPU SwiGLU against the reference (double) in f32 and bf16 storage, and finite-difference
// checks of the reference backward.
#include "kernels/cpu/swiglu.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/ref/swiglu.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::HostTensor;
using testing::RandomVector;
using testing::Rounded;

std::vector<double> D(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<float> F(const std::vector<double>& v) { return {v.begin(), v.end()}; }

void Check(int64_t n, int64_t inter, DType dt, int threads) {
  SCOPED_TRACE(::testing::Message() << n << "x" << inter << " " << DTypeName(dt));
  const auto gu = Rounded(RandomVector(size_t(n * 2 * inter), 1, -6, 6), dt);
  const auto dh = Rounded(RandomVector(size_t(n * inter), 2), dt);
  std::vector<double> h(dh.size()), dgu(gu.size());
  ref::SwiGluForward<double>(n, inter, D(gu).data(), h.data());
  ref::SwiGluBackward<double>(n, inter, D(gu).data(), D(dh).data(), dgu.data());
  ThreadPool pool(threads);
  HostTensor tgu(dt, {n, 2 * inter}, gu), th(dt, {n, inter}), tdh(dt, {n, inter}, dh),
      tdgu(dt, {n, 2 * inter});
  SwiGluForwardArgs fa{tgu.tensor(), th.tensor()};
  SwiGluBackwardArgs ba{tgu.tensor(), tdh.tensor(), tdgu.tensor()};
  ASSERT_TRUE(ValidateSwiGluForward(fa).ok());
  ASSERT_TRUE(ValidateSwiGluBackward(ba).ok());
  ASSERT_TRUE(cpu::SwiGluForward(pool, fa).ok());
  ASSERT_TRUE(cpu::SwiGluBackward(pool, ba).ok());
  // fp32 exp is within a few ulp and each formula has < 8 roundings: 16 u32 relative to the
  // terms; the gate derivative's 1 + g (1 - s) can cancel near g = -1.28, so there the bound is
  // absolute, scaled by the largest term (|dh u g| <= 6 * 6): 16 u32 * 36. bf16 storage adds one
  // output rounding (relative).
  const float u32 = DTypeEpsilon(DType::kF32), ud = dt == DType::kF32 ? 0 : DTypeEpsilon(dt);
  ExpectClose(th.Get(), F(h), 16 * u32, 16 * u32 + ud, "h");
  ExpectClose(tdgu.Get(), F(dgu), 16 * 36 * u32, 16 * u32 + ud, "dgate_up");
}

TEST(CpuSwiGlu, MatchesReference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Check(1, 1, dt, 2);
    Check(7, 13, dt, 3);
    Check(37, 1031, dt, 2);  // pieces straddle row ends
  }
}

TEST(RefSwiGlu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 3, inter = 5;
  auto gu = D(RandomVector(size_t(n * 2 * inter), 3, -4, 4));
  const auto g = D(RandomVector(size_t(n * inter), 4));
  auto loss = [&] {
    std::vector<double> h(g.size());
    ref::SwiGluForward<double>(n, inter, gu.data(), h.data());
    double l = 0;
    for (size_t i = 0; i < h.size(); ++i) l += g[i] * h[i];
    return l;
  };
  std::vector<double> dgu(gu.size());
  ref::SwiGluBackward<double>(n, inter, gu.data(), g.data(), dgu.data());
  // Central differences, 1e-5 relative step on |x| <= 4: truncation ~1e-8, rounding ~1e-11.
  ExpectClose(F(testing::FiniteDifference(gu, loss)), F(dgu), 1e-6f, 1e-6f, "dgate_up");
}

}  // namespace
}  // namespace ferry
