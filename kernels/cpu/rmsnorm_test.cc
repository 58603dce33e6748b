// Fast CPU RMSNorm against the reference (double), on awkward sizes in f32 and bf16 storage, the
// Hugging Face rounding rule for bf16, and finite-difference checks of the reference backward.
#include "kernels/cpu/rmsnorm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ref/rmsnorm.h"
#include "kernels/testing/op_testing.h"
#include "kernels/testing/real_vectors.h"

namespace ferry {
namespace {

using testing::Dot;
using testing::ExpectClose;
using testing::HostTensor;
using testing::MaxAbs;
using testing::RandomVector;
using testing::Rounded;
using testing::ToDouble;
using testing::ToFloat;

constexpr float kEps = 1e-5f;

void CheckForward(int64_t n, int64_t c, DType dt, int threads) {
  SCOPED_TRACE(::testing::Message()
               << n << "x" << c << " " << DTypeName(dt) << " threads " << threads);
  const auto x = Rounded(RandomVector(size_t(n * c), 1, -2, 2), dt);
  const auto w = Rounded(RandomVector(size_t(c), 2, 0.5f, 1.5f), dt);
  HostTensor tx(dt, {n, c}, x), tw(dt, {c}, w), ty(dt, {n, c}), trstd(DType::kF32, {n});
  ThreadPool pool(threads);
  RmsNormForwardArgs a{tx.tensor(), tw.tensor(), ty.tensor(), trstd.tensor(), kEps};
  ASSERT_TRUE(ValidateRmsNormForward(a).ok());
  ASSERT_TRUE(cpu::RmsNormForward(pool, a).ok());
  std::vector<double> y(static_cast<size_t>(n * c)), rstd(static_cast<size_t>(n));
  ref::RmsNormForward<double>(n, c, ToDouble(x).data(), ToDouble(w).data(), kEps, y.data(),
                              rstd.data());
  // fp32 sum of c squares: relative error <= c u32 (positive terms, no cancellation); the mean,
  // eps add, sqrt and divide add ~4 u32 and the square root halves the sum's error, so rstd is
  // within (c + 4) u32 relative. y = w * (x * rstd) adds 2 roundings; in bf16 the normalized
  // value and y are each rounded once more (u_bf16 each, the Hugging Face rule).
  const float u32 = DTypeEpsilon(DType::kF32);
  ExpectClose(trstd.Get(), ToFloat(rstd), 0, float(c + 4) * u32, "rstd");
  const float rounding = dt == DType::kF32 ? 0 : 2 * DTypeEpsilon(dt);
  ExpectClose(ty.Get(), ToFloat(y), 0, float(c + 8) * u32 + rounding, "y");
  if (dt != DType::kF32) {
    // The Hugging Face rule exactly: y = round(w * round(x * rstd)) with fp32 products.
    const auto got = ty.Get(), got_rstd = trstd.Get();
    std::vector<float> hf(got.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < c; ++j) {
        hf[size_t(i * c + j)] =
            RoundTo(dt, w[size_t(j)] * RoundTo(dt, x[size_t(i * c + j)] * got_rstd[size_t(i)]));
      }
    }
    // Same fp32 operations in the same order: bit-identical.
    ExpectClose(got, hf, 0, 0, "y (Hugging Face rounding)");
  }
}

TEST(CpuRmsNorm, ForwardMatchesReference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CheckForward(1, 1, dt, 2);
    CheckForward(7, 13, dt, 3);
    CheckForward(33, 1031, dt, 2);  // rows longer than the staging piece
    CheckForward(129, 64, dt, 1);
  }
}

void CheckBackward(int64_t n, int64_t c, DType dt, int threads, bool in_place) {
  SCOPED_TRACE(::testing::Message() << n << "x" << c << " " << DTypeName(dt) << " threads "
                                    << threads << (in_place ? " dx aliases dy" : ""));
  const auto x = Rounded(RandomVector(size_t(n * c), 3, -2, 2), dt);
  const auto w = Rounded(RandomVector(size_t(c), 4, 0.5f, 1.5f), dt);
  const auto dy = Rounded(RandomVector(size_t(n * c), 5), dt);
  const auto dw0 = Rounded(RandomVector(size_t(c), 6), dt);
  std::vector<double> y(static_cast<size_t>(n * c)), rstd(static_cast<size_t>(n));
  ref::RmsNormForward<double>(n, c, ToDouble(x).data(), ToDouble(w).data(), kEps, y.data(),
                              rstd.data());
  const auto rstd_f = ToFloat(rstd);
  std::vector<double> rstd_used(rstd_f.begin(), rstd_f.end());  // what the kernel sees
  std::vector<double> dx(static_cast<size_t>(n * c)), dw = ToDouble(dw0);
  ref::RmsNormBackward<double>(n, c, ToDouble(dy).data(), ToDouble(x).data(), ToDouble(w).data(),
                               rstd_used.data(), dx.data(), dw.data());

  HostTensor tx(dt, {n, c}, x), tw(dt, {c}, w), tdy(dt, {n, c}, dy), tdx(dt, {n, c}),
      tdw(dt, {c}, dw0), trstd(DType::kF32, {n}, rstd_f);
  ThreadPool pool(threads);
  RmsNormBackwardArgs a{tdy.tensor(),
                        tx.tensor(),
                        tw.tensor(),
                        trstd.tensor(),
                        in_place ? tdy.tensor() : tdx.tensor(),
                        tdw.tensor()};
  ASSERT_TRUE(ValidateRmsNormBackward(a).ok());
  ASSERT_TRUE(cpu::RmsNormBackward(pool, a).ok());
  const auto got_dx = in_place ? tdy.Get() : tdx.Get();

  // dx = rstd (g - xhat mean(g xhat)): the fp32 dot over c terms errs by <= (c + 4) u32 times
  // the sum of |terms|, and the subtraction can cancel, so the bound is absolute, scaled by the
  // largest term magnitude S = max rstd * (max|g| + max|xhat| * max|g xhat|); then one rounding
  // to the storage dtype (relative).
  const double gmax = MaxAbs(ToDouble(dy)) * MaxAbs(ToDouble(w)),
               xhat_max = MaxAbs(ToDouble(x)) * MaxAbs(rstd);
  const double s = MaxAbs(rstd) * (gmax + xhat_max * gmax * xhat_max);
  const float u32 = DTypeEpsilon(DType::kF32), ud = DTypeEpsilon(dt);
  ExpectClose(got_dx, ToFloat(dx), float((c + 8) * u32 * s), dt == DType::kF32 ? 0 : ud, "dx");
  // dw: n products summed onto dw0 in fp32: <= (n + 2) u32 * (|dw0| + n max|dy xhat|); in bf16
  // each xhat is rounded first (HF rule, u_bf16 relative per term) and dw is stored once more.
  const double term = MaxAbs(ToDouble(dy)) * xhat_max;
  const double dw_scale = MaxAbs(ToDouble(dw0)) + double(n) * term;
  const float dw_atol = float((n + 2) * u32 * dw_scale + (dt == DType::kF32 ? 0 : ud * n * term));
  ExpectClose(tdw.Get(), ToFloat(dw), dw_atol, dt == DType::kF32 ? 0 : ud, "dweight");
}

TEST(CpuRmsNorm, BackwardMatchesReference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CheckBackward(1, 1, dt, 2, false);
    CheckBackward(7, 13, dt, 3, false);
    CheckBackward(33, 1031, dt, 2, false);
    CheckBackward(65, 17, dt, 3, true);
  }
}

// L = sum(G o y(x, w)); the reference backward's dx and dw must match central differences.
TEST(RefRmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t n = 3, c = 7;
  auto x = ToDouble(RandomVector(size_t(n * c), 7, -2, 2));
  auto w = ToDouble(RandomVector(size_t(c), 8, 0.5f, 1.5f));
  const auto g = ToDouble(RandomVector(size_t(n * c), 9));
  auto loss = [&] {
    std::vector<double> y(static_cast<size_t>(n * c)), rstd(static_cast<size_t>(n));
    ref::RmsNormForward<double>(n, c, x.data(), w.data(), 1e-5, y.data(), rstd.data());
    return Dot(g, y);
  };
  std::vector<double> y(static_cast<size_t>(n * c)), rstd(static_cast<size_t>(n)),
      dx(static_cast<size_t>(n * c)), dw(size_t(c), 0);
  ref::RmsNormForward<double>(n, c, x.data(), w.data(), 1e-5, y.data(), rstd.data());
  ref::RmsNormBackward<double>(n, c, g.data(), x.data(), w.data(), rstd.data(), dx.data(),
                               dw.data());
  // Central differences with a 1e-5 relative step: truncation ~h^2 |L'''| ~ 1e-9 for O(1)
  // inputs, rounding ~1e-16 / 1e-5 = 1e-11; 1e-6 bounds both with margin and still catches a
  // wrong term (errors of order 1e-2 or more).
  ExpectClose(ToFloat(testing::FiniteDifference(x, loss)), ToFloat(dx), 1e-6f, 1e-6f, "dx");
  ExpectClose(ToFloat(testing::FiniteDifference(w, loss)), ToFloat(dw), 1e-6f, 1e-6f, "dw");
}

}  // namespace
}  // namespace ferry
