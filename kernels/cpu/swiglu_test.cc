// Fast CPU SwiGLU against the reference (double) in f32 and bf16 storage, and finite-difference
// checks of the reference backward.
#include "kernels/cpu/swiglu.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/ref/swiglu.h"
#include "kernels/testing/op_testing.h"
#include "kernels/testing/real_vectors.h"

namespace ferry {
namespace {

using testing::Dot;
using testing::ExpectClose;
using testing::HostTensor;
using testing::RandomVector;
using testing::Rounded;
using testing::ToDouble;
using testing::ToFloat;

void Check(int64_t n, int64_t inter, DType dt, int threads) {
  SCOPED_TRACE(::testing::Message() << n << "x" << inter << " " << DTypeName(dt));
  const auto gu = Rounded(RandomVector(size_t(n * 2 * inter), 1, -6, 6), dt);
  const auto dh = Rounded(RandomVector(size_t(n * inter), 2), dt);
  std::vector<double> h(dh.size()), dgu(gu.size());
  ref::SwiGluForward<double>(n, inter, ToDouble(gu).data(), h.data());
  ref::SwiGluBackward<double>(n, inter, ToDouble(gu).data(), ToDouble(dh).data(), dgu.data());
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
  ExpectClose(th.Get(), ToFloat(h), 16 * u32, 16 * u32 + ud, "h");
  ExpectClose(tdgu.Get(), ToFloat(dgu), 16 * 36 * u32, 16 * u32 + ud, "dgate_up");
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
  auto gu = ToDouble(RandomVector(size_t(n * 2 * inter), 3, -4, 4));
  const auto g = ToDouble(RandomVector(size_t(n * inter), 4));
  auto loss = [&] {
    std::vector<double> h(g.size());
    ref::SwiGluForward<double>(n, inter, gu.data(), h.data());
    return Dot(g, h);
  };
  std::vector<double> dgu(gu.size());
  ref::SwiGluBackward<double>(n, inter, gu.data(), g.data(), dgu.data());
  // Central differences, 1e-5 relative step on |x| <= 4: truncation ~1e-8, rounding ~1e-11.
  ExpectClose(ToFloat(testing::FiniteDifference(gu, loss)), ToFloat(dgu), 1e-6f, 1e-6f, "dgate_up");
}

}  // namespace
}  // namespace ferry
