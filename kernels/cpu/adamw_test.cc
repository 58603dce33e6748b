// AdamW: every instruction-set variant this CPU runs against the fp32
// reference, element by element; the formula itself against numbers computed by
// hand; the global-norm sum of squares.
#include "kernels/cpu/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/ref/adamw.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using cpu::AdamWHostTensor;
using cpu::AdamWKernel;
using cpu::SimdLevel;
using testing::RandomVector;

constexpr float kU = DTypeEpsilon(DType::kF32);

// One instantiation per instruction-set variant; a variant this CPU cannot run
// reports a skip.
class AdamWLevelTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (!cpu::SimdLevelSupported(GetParam())) {
      GTEST_SKIP() << "this CPU lacks " << cpu::SimdLevelName(GetParam());
    }
  }
  SimdLevel level() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Levels, AdamWLevelTest, ::testing::ValuesIn(cpu::kAllSimdLevels),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(cpu::SimdLevelName(info.param));
                         });

// Two updates of one element, worked by hand (exact real arithmetic):
//  hyper: lr 0.1, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1; p0 = 1, g1 =
//  0.5, g2 = -0.25. step 1: p = 1 * (1 - 0.01) = 0.99;  m = 0.1 * 0.5 = 0.05;
//  v = 0.001 * 0.25 = 0.00025
//          bc1 = 0.1, bc2 = 0.001: d = sqrt(0.00025) / sqrt(0.001) + 1e-8 =
//          0.50000001 p = 0.99 - (0.1 / 0.1) * 0.05 / 0.50000001 = 0.890000002
//  step 2: p = 0.890000002 * 0.99 = 0.88110000198;  m = 0.9 * 0.05 + 0.1 *
//  -0.25 = 0.02
//          v = 0.999 * 0.00025 + 0.001 * 0.0625 = 0.00031225
//          bc1 = 0.19, bc2 = 0.001999: d = sqrt(0.00031225 / 0.001999) + 1e-8 =
//          0.3952253907 p = 0.88110000198 - (0.1 / 0.19) * 0.02 / 0.3952253907
//          = 0.854466299
// The fp32 kernel rounds each of its ~10 operations once (relative u each) on
// values of magnitude <= 1, so 16 u absolute bounds the difference from these
// exact values.
TEST_P(AdamWLevelTest, MatchesHandComputedElement) {
  // n = 1 runs the scalar tail; n = 37 runs full vectors and a tail with
  // identical elements.
  for (int64_t n : {1, 37}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
    AdamWHyperparameters h;
    h.lr = 0.1;
    h.weight_decay = 0.1;
    const float want_p[2] = {0.890000002f, 0.854466299f};
    const float want_m[2] = {0.05f, 0.02f};
    const float want_v[2] = {0.00025f, 0.00031225f};
    const float grads[2] = {0.5f, -0.25f};
    for (int t = 0; t < 2; ++t) {
      std::vector<float> g(n, grads[t]);
      h.step = t + 1;
      AdamWHostTensor ht{p.data(), g.data(), DType::kF32, m.data(), v.data(), nullptr, n};
      ASSERT_TRUE(AdamWKernel(level()).Update(h, ht, nullptr).ok());
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(p[i], want_p[t], 16 * kU) << "step " << t + 1 << " [" << i << "]";
        EXPECT_NEAR(m[i], want_m[t], 16 * kU * want_m[t]) << "step " << t + 1;
        EXPECT_NEAR(v[i], want_v[t], 16 * kU * want_v[t]) << "step " << t + 1;
      }
    }
  }
}

// Bit-for-bit equality of two float arrays; names the first differing element.
void ExpectIdentical(const std::vector<float>& got, const std::vector<float>& want,
                     const char* what, int step) {
  ASSERT_EQ(got.size(), want.size());
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0) return;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << "[" << i << "] after step " << step << ": " << got[i] << " vs "
                    << want[i] << " (reference)";
      return;
    }
  }
}

// Runs 4 updates through one level and the fp32 reference and demands identical
// bits: both perform the same correctly rounded IEEE operations in the same
// order on the same fp32 scalars (no contraction: -ffp-contract=off), so any
// difference is a bug, not rounding.
void ExpectBitIdenticalToReference(SimdLevel level, DType g_dtype, int64_t n, double weight_decay,
                                   double grad_scale, int threads) {
  ThreadPool pool(threads);
  SCOPED_TRACE(std::string(cpu::SimdLevelName(level)) + " g=" + std::string(DTypeName(g_dtype)) +
               " n=" + std::to_string(n) + " threads=" + std::to_string(threads));
  std::vector<float> p = RandomVector(size_t(n), 11, -2.0f, 2.0f);
  std::vector<float> m(size_t(n), 0.0f), v(size_t(n), 0.0f);
  std::vector<float> rp = p, rm = m, rv = v;
  std::vector<bf16> p_bf16(static_cast<size_t>(n));
  for (int t = 1; t <= 4; ++t) {
    AdamWHyperparameters h;
    h.lr = 1e-3 * t;  // a schedule: the scalars change per step
    h.beta1 = 0.9;
    h.beta2 = 0.95;
    h.eps = 1e-6;
    h.weight_decay = weight_decay;
    h.grad_scale = grad_scale;
    h.step = t;
    // Mixed magnitudes, with exact zeros, so sqrt(v) spans many binades.
    std::vector<float> g = RandomVector(size_t(n), 100 + t, -3.0f, 3.0f);
    for (size_t i = 0; i < g.size(); i += 5) g[i] *= 1e-4f;
    for (size_t i = 3; i < g.size(); i += 11) g[i] = 0.0f;
    g = testing::Rounded(g, g_dtype);  // what the stored gradient holds
    testing::HostTensor g_store(g_dtype, Shape{n}, g);
    AdamWHostTensor ht{p.data(), BackendAccess::Raw(g_store.tensor().data),
                       g_dtype,  m.data(),
                       v.data(), p_bf16.data(),
                       n};
    ASSERT_TRUE(AdamWKernel(level).Update(h, ht, &pool).ok());
    ref::AdamWStep<float>(h, rp.data(), g.data(), rm.data(), rv.data(), n);
    std::vector<float> rp_bf16(rp.size()), got_bf16(rp.size());
    for (size_t i = 0; i < rp.size(); ++i) {
      rp_bf16[i] = RoundTo(DType::kBF16, rp[i]);
      got_bf16[i] = BF16ToFloat(p_bf16[i]);
    }
    ExpectIdentical(p, rp, "p", t);
    ExpectIdentical(m, rm, "m", t);
    ExpectIdentical(v, rv, "v", t);
    ExpectIdentical(got_bf16, rp_bf16, "p_bf16", t);
  }
}

TEST_P(AdamWLevelTest, MatchesReferenceF32Grad) {
  for (int64_t n : {1, 7, 8, 15, 16, 17, 33, 1001}) {
    ExpectBitIdenticalToReference(level(), DType::kF32, n, 0.1, 0.5, 1);
  }
}

TEST_P(AdamWLevelTest, MatchesReferenceBF16Grad) {
  for (int64_t n : {1, 9, 31, 1003}) {
    ExpectBitIdenticalToReference(level(), DType::kBF16, n, 0.01, 1.0, 1);
  }
}

TEST_P(AdamWLevelTest, NoWeightDecayAndUnitScale) {
  ExpectBitIdenticalToReference(level(), DType::kF32, 257, 0.0, 1.0, 1);
}

TEST_P(AdamWLevelTest, SplitOverThreads) {
  // Larger than the per-chunk grain (32K) so several workers run pieces with
  // odd boundaries.
  ExpectBitIdenticalToReference(level(), DType::kF32, 66001, 0.1, 0.25, 3);
  ExpectBitIdenticalToReference(level(), DType::kBF16, 40001, 0.1, 1.0, 2);
}

// The fp32 formula against the same formula in double on random data: each fp32
// operation rounds once (relative u). p changes by at most ~lr * |m/sqrt(v)|
// per step (|m/sqrt(v)| <= (1-b1)/sqrt(1-b2) ~ 0.45 after bias correction, well
// under 1), so over 4 steps with |p| <= 2 the fp32 result stays within 32 u *
// (|p| + 1) of the double one.
TEST(AdamWTest, FloatReferenceTracksDouble) {
  const int64_t n = 513;
  std::vector<float> pf = RandomVector(size_t(n), 5, -2.0f, 2.0f), mf(static_cast<size_t>(n)),
                     vf(static_cast<size_t>(n));
  std::vector<double> pd(pf.begin(), pf.end()), md(static_cast<size_t>(n)),
      vd(static_cast<size_t>(n));
  for (int t = 1; t <= 4; ++t) {
    AdamWHyperparameters h;
    h.lr = 1e-2;
    h.weight_decay = 0.1;
    h.step = t;
    const std::vector<float> g = RandomVector(size_t(n), 50 + t);
    const std::vector<double> gd(g.begin(), g.end());
    ref::AdamWStep<float>(h, pf.data(), g.data(), mf.data(), vf.data(), n);
    ref::AdamWStep<double>(h, pd.data(), gd.data(), md.data(), vd.data(), n);
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(pf[i], pd[i], 32 * kU * (std::fabs(pd[i]) + 1)) << i;
  }
}

// Sum of n non-negative squares in double: the relative error is at most n *
// 2^-53 whatever the order, so every level agrees with the plain double loop to
// rtol n * 1.2e-16.
TEST_P(AdamWLevelTest, SumOfSquaresMatchesReference) {
  ThreadPool pool1(1), pool3(3);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {0, 1, 15, 16, 17, 64, 1000, 100001}) {
      SCOPED_TRACE(std::string(DTypeName(dt)) + " n=" + std::to_string(n));
      const std::vector<float> g = testing::Rounded(RandomVector(size_t(n), 9, -4, 4), dt);
      testing::HostTensor store(dt, Shape{n}, g);
      const void* raw = BackendAccess::Raw(store.tensor().data);
      const double want = ref::SumOfSquares<float>(g.data(), n);
      const AdamWKernel k(level());
      const double got1 = k.SumOfSquares(raw, dt, n, &pool1);
      const double got3 = k.SumOfSquares(raw, dt, n, &pool3);
      EXPECT_NEAR(got1, want, double(n) * 1.2e-16 * want);
      // Fixed blocks summed in order: the pool size must not change a bit.
      EXPECT_EQ(std::memcmp(&got1, &got3, sizeof(double)), 0) << got1 << " vs " << got3;
    }
  }
}

TEST(AdamWTest, RejectsBadHyperparameters) {
  AdamWHyperparameters h;
  EXPECT_TRUE(ValidateAdamWHyperparameters(h).ok());
  h.step = 0;
  EXPECT_EQ(ValidateAdamWHyperparameters(h).code(), StatusCode::kInvalidArgument);
  h = {};
  h.beta2 = 1.0;
  const Status s = ValidateAdamWHyperparameters(h);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("beta2"), std::string::npos) << s.ToString();
  h = {};
  h.lr = std::nan("");
  EXPECT_FALSE(ValidateAdamWHyperparameters(h).ok());
  float x = 0;
  AdamWHostTensor t{&x, &x, DType::kF16, &x, &x, nullptr, 1};
  EXPECT_EQ(AdamWKernel().Update(AdamWHyperparameters{}, t, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST(AdamWTest, ValidateNamesMismatchedTensor) {
  testing::HostTensor p(DType::kF32, Shape{10}), g(DType::kBF16, Shape{2, 5}),
      m(DType::kF32, Shape{10}), v(DType::kF32, Shape{9});
  AdamWArgs a{p.tensor(), g.tensor(), m.tensor(), v.tensor(), {}, {}};
  const Status s = ValidateAdamW(a);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("v is"), std::string::npos) << s.ToString();
  a.v = m.tensor();
  EXPECT_TRUE(ValidateAdamW(a).ok());
  a.m = g.tensor();  // bf16 moments are not allowed
  EXPECT_FALSE(ValidateAdamW(a).ok());
}

// The Tensor-level kernel (what the device dispatcher runs) against the
// reference.
TEST(AdamWTest, TensorKernelMatchesReference) {
  const int64_t n = 300;
  const std::vector<float> p0 = RandomVector(size_t(n), 1), g = RandomVector(size_t(n), 2);
  testing::HostTensor p(DType::kF32, Shape{n}, p0), gt(DType::kF32, Shape{n}, g),
      m(DType::kF32, Shape{n}, std::vector<float>(size_t(n), 0.0f)),
      v(DType::kF32, Shape{n}, std::vector<float>(size_t(n), 0.0f)), pb(DType::kBF16, Shape{n});
  AdamWHyperparameters h;
  h.weight_decay = 0.05;
  AdamWArgs a{p.tensor(), gt.tensor(), m.tensor(), v.tensor(), pb.tensor(), h};
  ASSERT_TRUE(ValidateAdamW(a).ok());
  ThreadPool pool(2);
  ASSERT_TRUE(cpu::AdamWStep(pool, a).ok());
  std::vector<float> rp = p0, rm(static_cast<size_t>(n)), rv(static_cast<size_t>(n));
  ref::AdamWStep<float>(h, rp.data(), g.data(), rm.data(), rv.data(), n);
  // Bit-identical for the reason given above ExpectBitIdenticalToReference.
  testing::ExpectClose(p.Get(), rp, 0, 0, "p");
  testing::ExpectClose(m.Get(), rm, 0, 0, "m");
  testing::ExpectClose(v.Get(), rv, 0, 0, "v");
  testing::ExpectClose(pb.Get(), testing::Rounded(rp, DType::kBF16), 0, 0, "p_bf16");
}

}  // namespace
}  // namespace ferry
