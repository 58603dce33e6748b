// Fast CPU residual add / accumulate against the reference (double), in f32 and bf16 storage,
// mixed storage and in place, and the finite-difference check that the add's backward passes dy
// to both inputs.
#include "kernels/cpu/residual.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/ref/residual.h"
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

void Check(int64_t n, DType dt_in, DType dt_out, int threads) {
  SCOPED_TRACE(::testing::Message()
               << "n=" << n << " " << DTypeName(dt_in) << "->" << DTypeName(dt_out));
  const auto a = Rounded(RandomVector(size_t(n), 1), dt_in);
  const auto b = Rounded(RandomVector(size_t(n), 2), dt_in);
  const auto acc = Rounded(RandomVector(size_t(n), 3), dt_out);
  std::vector<double> y(a.size()), acc_want = ToDouble(acc);
  ref::ResidualAdd<double>(n, ToDouble(a).data(), ToDouble(b).data(), y.data());
  ref::Accumulate<double>(n, ToDouble(a).data(), acc_want.data());
  ThreadPool pool(threads);
  HostTensor ta(dt_in, {n}, a), tb(dt_in, {n}, b), ty(dt_out, {n}), tacc(dt_out, {n}, acc);
  ResidualAddArgs add{ta.tensor(), tb.tensor(), ty.tensor()};
  ResidualAccumulateArgs accum{ta.tensor(), tacc.tensor()};
  ASSERT_TRUE(ValidateResidualAdd(add).ok());
  ASSERT_TRUE(ValidateResidualAccumulate(accum).ok());
  ASSERT_TRUE(cpu::ResidualAdd(pool, add).ok());
  ASSERT_TRUE(cpu::ResidualAccumulate(pool, accum).ok());
  // One fp32 add of exact inputs (u32 relative) and one rounding to the output dtype.
  const float tol = DTypeEpsilon(DType::kF32) + DTypeEpsilon(dt_out);
  ExpectClose(ty.Get(), ToFloat(y), 0, tol, "y");
  ExpectClose(tacc.Get(), ToFloat(acc_want), 0, tol, "dx");
  // In place: a += b through ResidualAdd with y aliasing a.
  ASSERT_TRUE(cpu::ResidualAdd(pool, {ta.tensor(), tb.tensor(), ta.tensor()}).ok());
  if (dt_in == dt_out) ExpectClose(ta.Get(), ty.Get(), 0, 0, "in-place y");
}

TEST(CpuResidual, MatchesReference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Check(1, dt, dt, 2);
    Check(1031, dt, dt, 3);
    Check(70001, dt, dt, 2);
  }
  Check(4099, DType::kBF16, DType::kF32, 2);  // bf16 branch gradient into an fp32 stream
}

TEST(RefResidual, AddBackwardIsIdentityToBothInputs) {
  auto a = ToDouble(RandomVector(9, 4)), b = ToDouble(RandomVector(9, 5));
  const auto g = ToDouble(RandomVector(9, 6));
  auto loss = [&] {
    std::vector<double> y(a.size());
    ref::ResidualAdd<double>(int64_t(a.size()), a.data(), b.data(), y.data());
    return Dot(g, y);
  };
  // Linear loss: central differences are exact up to rounding (~1e-11).
  ExpectClose(ToFloat(testing::FiniteDifference(a, loss)), ToFloat(g), 1e-8f, 0, "da");
  ExpectClose(ToFloat(testing::FiniteDifference(b, loss)), ToFloat(g), 1e-8f, 0, "db");
}

TEST(CpuResidual, ValidationNamesTheMismatch) {
  HostTensor a(DType::kF32, {4, 8}), b(DType::kF32, {4, 7}), y(DType::kF32, {4, 8});
  const Status s = ValidateResidualAdd({a.tensor(), b.tensor(), y.tensor()});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("b must have shape [4, 8], got [4, 7]"), std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace ferry
