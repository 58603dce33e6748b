// Fast CPU LayerNorm against the reference (double), on awkward sizes in f32 and bf16 storage,
// and finite-difference checks of the reference backward.
#include "kernels/cpu/layernorm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ref/layernorm.h"
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
using testing::Zeros;

constexpr float kEps = 1e-5f;

void CheckForward(int64_t n, int64_t c, DType dt, int threads) {
  SCOPED_TRACE(::testing::Message() << n << "x" << c << " " << DTypeName(dt));
  // An offset mean (1.5) makes the two-pass variance matter.
  const auto x = Rounded(RandomVector(size_t(n * c), 1, -0.5f, 3.5f), dt);
  const auto w = Rounded(RandomVector(size_t(c), 2, 0.5f, 1.5f), dt);
  const auto b = Rounded(RandomVector(size_t(c), 3), dt);
  HostTensor tx(dt, {n, c}, x), tw(dt, {c}, w), tb(dt, {c}, b), ty(dt, {n, c}),
      tmean(DType::kF32, {n}), trstd(DType::kF32, {n});
  ThreadPool pool(threads);
  LayerNormForwardArgs a{tx.tensor(),    tw.tensor(),    tb.tensor(), ty.tensor(),
                         tmean.tensor(), trstd.tensor(), kEps};
  ASSERT_TRUE(ValidateLayerNormForward(a).ok());
  ASSERT_TRUE(cpu::LayerNormForward(pool, a).ok());
  auto y = Zeros(n * c), mean = Zeros(n), rstd = Zeros(n);
  ref::LayerNormForward<double>(n, c, ToDouble(x).data(), ToDouble(w).data(), ToDouble(b).data(),
                                kEps, y.data(), mean.data(), rstd.data());
  // mean: a sum of c terms in fp32 errs by <= c u32 * max|x| (absolute, the terms have mixed
  // signs after the offset is removed only in the variance pass). The variance sums c positive
  // squares of (x - mean): relative (c + 4) u32, plus the mean's error enters squared-weighted
  // (second order); rstd is within (c + 6) u32 relative. y = (x - mean) rstd w + b: the
  // subtraction's absolute error is the mean's, scaled by rstd*|w|; each output then has a few
  // more fp32 roundings and, in bf16, one rounding to storage.
  const float u32 = DTypeEpsilon(DType::kF32), ud = dt == DType::kF32 ? 0 : DTypeEpsilon(dt);
  const float mean_atol = float(c + 2) * u32 * float(MaxAbs(ToDouble(x)));
  ExpectClose(tmean.Get(), ToFloat(mean), mean_atol, 0, "mean");
  ExpectClose(trstd.Get(), ToFloat(rstd), 0, float(c + 6) * u32, "rstd");
  const float y_scale =
      float(MaxAbs(rstd) * MaxAbs(ToDouble(w)) * (MaxAbs(ToDouble(x)) + MaxAbs(mean)) +
            MaxAbs(ToDouble(b)));
  ExpectClose(ty.Get(), ToFloat(y), mean_atol * y_scale + float(c + 8) * u32 * y_scale, ud, "y");
}

TEST(CpuLayerNorm, ForwardMatchesReference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CheckForward(1, 1, dt, 2);
    CheckForward(7, 13, dt, 3);
    CheckForward(33, 1031, dt, 2);
    CheckForward(129, 64, dt, 1);
  }
}

void CheckBackward(int64_t n, int64_t c, DType dt, int threads, bool in_place) {
  SCOPED_TRACE(::testing::Message()
               << n << "x" << c << " " << DTypeName(dt) << (in_place ? " dx aliases dy" : ""));
  const auto x = Rounded(RandomVector(size_t(n * c), 4, -2, 2), dt);
  const auto w = Rounded(RandomVector(size_t(c), 5, 0.5f, 1.5f), dt);
  const auto dy = Rounded(RandomVector(size_t(n * c), 6), dt);
  const auto dw0 = Rounded(RandomVector(size_t(c), 7), dt);
  const auto db0 = Rounded(RandomVector(size_t(c), 8), dt);
  auto y = Zeros(n * c), mean = Zeros(n), rstd = Zeros(n), b = Zeros(c);
  ref::LayerNormForward<double>(n, c, ToDouble(x).data(), ToDouble(w).data(), b.data(), kEps,
                                y.data(), mean.data(), rstd.data());
  const auto mean_f = ToFloat(mean),
             rstd_f = ToFloat(rstd);  // the saved statistics, as the kernel sees them
  const auto mean_used = ToDouble(mean_f), rstd_used = ToDouble(rstd_f);
  auto dx = Zeros(n * c), dw = ToDouble(dw0), db = ToDouble(db0);
  ref::LayerNormBackward<double>(n, c, ToDouble(dy).data(), ToDouble(x).data(), ToDouble(w).data(),
                                 mean_used.data(), rstd_used.data(), dx.data(), dw.data(),
                                 db.data());
  HostTensor tx(dt, {n, c}, x), tw(dt, {c}, w), tdy(dt, {n, c}, dy), tdx(dt, {n, c}),
      tdw(dt, {c}, dw0), tdb(dt, {c}, db0), tmean(DType::kF32, {n}, mean_f),
      trstd(DType::kF32, {n}, rstd_f);
  ThreadPool pool(threads);
  LayerNormBackwardArgs a{tdy.tensor(),   tx.tensor(),    tw.tensor(),
                          tmean.tensor(), trstd.tensor(), in_place ? tdy.tensor() : tdx.tensor(),
                          tdw.tensor(),   tdb.tensor()};
  ASSERT_TRUE(ValidateLayerNormBackward(a).ok());
  ASSERT_TRUE(cpu::LayerNormBackward(pool, a).ok());
  // dx = rstd (g - mean(g) - xhat mean(g xhat)): two fp32 sums of c terms, each within
  // (c + 4) u32 of the sum of |terms|, and a cancelling subtraction: absolute bound scaled by
  // S = max rstd (max|g| (1 + max|xhat|^2)); then one rounding to storage (relative).
  const float u32 = DTypeEpsilon(DType::kF32), ud = dt == DType::kF32 ? 0 : DTypeEpsilon(dt);
  const double g = MaxAbs(ToDouble(dy)) * MaxAbs(ToDouble(w));
  const double xhat = (MaxAbs(ToDouble(x)) + MaxAbs(mean)) * MaxAbs(rstd);
  const double s = MaxAbs(rstd) * g * (1 + xhat * xhat);
  ExpectClose(in_place ? tdy.Get() : tdx.Get(), ToFloat(dx), float((c + 8) * u32 * s), ud, "dx");
  // dw, db: n terms summed onto the old value in fp32, (n + 2) u32 times the magnitude sum; then
  // one rounding to storage.
  const double dw_scale = MaxAbs(ToDouble(dw0)) + double(n) * MaxAbs(ToDouble(dy)) * xhat;
  const double db_scale = MaxAbs(ToDouble(db0)) + double(n) * MaxAbs(ToDouble(dy));
  ExpectClose(tdw.Get(), ToFloat(dw), float((n + 4) * u32 * dw_scale), ud, "dweight");
  ExpectClose(tdb.Get(), ToFloat(db), float((n + 2) * u32 * db_scale), ud, "dbias");
}

TEST(CpuLayerNorm, BackwardMatchesReference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CheckBackward(1, 1, dt, 2, false);
    CheckBackward(7, 13, dt, 3, false);
    CheckBackward(33, 1031, dt, 2, false);
    CheckBackward(65, 17, dt, 3, true);
  }
}

// L = sum(G o y(x, w, b)); the reference backward must match central differences.
TEST(RefLayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t n = 3, c = 7;
  auto x = ToDouble(RandomVector(size_t(n * c), 9, -2, 2));
  auto w = ToDouble(RandomVector(size_t(c), 10, 0.5f, 1.5f));
  auto b = ToDouble(RandomVector(size_t(c), 11));
  const auto g = ToDouble(RandomVector(size_t(n * c), 12));
  auto y = Zeros(n * c), mean = Zeros(n), rstd = Zeros(n);
  auto loss = [&] {
    ref::LayerNormForward<double>(n, c, x.data(), w.data(), b.data(), 1e-5, y.data(), mean.data(),
                                  rstd.data());
    return Dot(g, y);
  };
  loss();
  auto dx = Zeros(n * c), dw = Zeros(c), db = Zeros(c);
  ref::LayerNormBackward<double>(n, c, g.data(), x.data(), w.data(), mean.data(), rstd.data(),
                                 dx.data(), dw.data(), db.data());
  // Central differences, 1e-5 relative step: truncation ~1e-9, rounding ~1e-11 for O(1) values;
  // 1e-6 bounds both and still catches a wrong term.
  ExpectClose(ToFloat(testing::FiniteDifference(x, loss)), ToFloat(dx), 1e-6f, 1e-6f, "dx");
  ExpectClose(ToFloat(testing::FiniteDifference(w, loss)), ToFloat(dw), 1e-6f, 1e-6f, "dw");
  ExpectClose(ToFloat(testing::FiniteDifference(b, loss)), ToFloat(db), 1e-6f, 1e-6f, "db");
}

}  // namespace
}  // namespace ferry
