// The vector exp against libm's exp in double, lane by lane, over its whole clamped range, and
// MapF4's handling of a partial last group.
#include "kernels/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace ferry::cpu {
namespace {

TEST(VecMath, ExpIsWithinFourUlpOverItsRange) {
  // A fine uniform grid plus special points covers every step of the range reduction (each n in
  // [-126, 128)) with r of both signs.
  std::vector<float> x;
  for (double v = -87.0; v <= 88.0; v += 0.0137) x.push_back(float(v));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f, 88.0f, -87.0f}) x.push_back(v);
  std::vector<float> y(x.size());
  MapF4(
      int64_t(x.size()), y.data(), [](VecF4 v, VecF4) { return ExpF4(v); }, x.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(double(x[i]));
    // Cephes documents a peak relative error of 2.3e-7 for its expf, i.e. < 4 ulp of the lower
    // end of the result's binade (ulp = 2^(e - 23) for results in [2^e, 2^(e+1))).
    EXPECT_NEAR(y[i], want, 4 * std::ldexp(1.0, std::ilogb(want) - 23)) << "x=" << x[i];
  }
}

TEST(VecMath, ExpClampsInsteadOfOverflowing) {
  const float x[2] = {-1000.0f, 1000.0f};
  float y[2];
  MapF4(
      2, y, [](VecF4 v, VecF4) { return ExpF4(v); }, x);
  EXPECT_GT(y[0], 0.0f);
  EXPECT_LT(y[0], 1e-37f);
  EXPECT_TRUE(std::isfinite(y[1]));
  EXPECT_GT(y[1], 1e38f);
}

TEST(VecMath, MapStoresOnlyTheElementsAsked) {
  std::vector<float> a(11), b(11), out(12, -7.0f);
  for (int i = 0; i < 11; ++i) a[size_t(i)] = float(i), b[size_t(i)] = float(2 * i);
  MapF4(
      11, out.data(), [](VecF4 p, VecF4 q) { return p + q; }, a.data(), b.data());
  for (int i = 0; i < 11; ++i) EXPECT_EQ(out[size_t(i)], float(3 * i));
  EXPECT_EQ(out[11], -7.0f);  // past n: untouched
}

}  // namespace
}  // namespace ferry::cpu
