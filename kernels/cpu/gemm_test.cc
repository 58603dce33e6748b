// Fast CPU GEMM and bias gradient against the reference (a naive triple loop in double), and a
// finite-difference check that the GEMM calls documented for a linear layer's backward give its
// gradient.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ref/gemm.h"
#include "kernels/testing/op_testing.h"
#include "kernels/testing/real_vectors.h"

namespace ferry {
namespace {

using testing::Dot;
using testing::HostTensor;
using testing::RandomVector;
using testing::Rounded;
using testing::ToDouble;

std::vector<double> Abs(std::vector<double> v) {
  for (auto& x : v) x = std::fabs(x);
  return v;
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
  bool bias;
};

// Runs the fast GEMM with the given storage dtypes and checks every element against the exact
// product (double) of the same stored inputs, within the rounding-error bound of an fp32 dot
// product: |got - exact| <= (k + 3) u32 * S + u_c * |exact|, where S = |alpha| sum|a||b| +
// |beta||c| + |bias| (the classic gamma_k bound, plus one rounding each for alpha, beta*c and
// the bias add) and u_c is the unit roundoff of C's dtype (one final rounding to storage).
// Operands of bf16 x bf16 run on both bf16 paths: oneDNN's (where the host has it; products
// exact, fp32 sums in its order, so the same bound holds) and the converted fp32 panels.
void CheckGemmOn(const Case& cs, GemmDTypes dt, int threads, uint64_t seed,
                 const cpu::OneDnn* bf16);
void CheckGemm(const Case& cs, GemmDTypes dt, int threads, uint64_t seed) {
  CheckGemmOn(cs, dt, threads, seed, cpu::Bf16GemmLibrary());
  if (dt.a == DType::kBF16 && dt.b == DType::kBF16 && cpu::Bf16GemmLibrary() != nullptr) {
    SCOPED_TRACE("converted fp32 panels");
    CheckGemmOn(cs, dt, threads, seed, nullptr);
  }
}

void CheckGemmOn(const Case& cs, GemmDTypes dt, int threads, uint64_t seed,
                 const cpu::OneDnn* bf16) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " ta=" << cs.ta
               << " tb=" << cs.tb << " alpha=" << cs.alpha << " beta=" << cs.beta
               << " bias=" << cs.bias << " dtypes=" << DTypeName(dt.a) << "," << DTypeName(dt.b)
               << "," << DTypeName(dt.c) << " threads=" << threads);
  const Shape sa = cs.ta ? Shape{cs.k, cs.m} : Shape{cs.m, cs.k};
  const Shape sb = cs.tb ? Shape{cs.n, cs.k} : Shape{cs.k, cs.n};
  const auto a = Rounded(RandomVector(size_t(cs.m * cs.k), seed), dt.a);
  const auto b = Rounded(RandomVector(size_t(cs.k * cs.n), seed + 1), dt.b);
  auto c0 = Rounded(RandomVector(size_t(cs.m * cs.n), seed + 2), dt.c);
  if (cs.beta == 0.0f) {  // beta == 0 must not read C: NaNs there must not propagate
    std::fill(c0.begin(), c0.end(), std::numeric_limits<float>::quiet_NaN());
  }
  const auto bias = Rounded(RandomVector(size_t(cs.n), seed + 3), dt.c);

  ThreadPool pool(threads);
  // Empty operands (k == 0) are left unset: staging an empty vector hands memcpy a null pointer.
  auto stage = [](DType t, Shape shape, const std::vector<float>& v) {
    return v.empty() ? HostTensor(t, shape) : HostTensor(t, shape, v);
  };
  HostTensor ta = stage(dt.a, sa, a), tb = stage(dt.b, sb, b);
  HostTensor tc(dt.c, {cs.m, cs.n}, c0), tbias(dt.c, {cs.n}, bias);
  const size_t scratch_bytes = cpu::GemmScratchBytes(threads, cs.m, cs.n, cs.k, dt);
  HostTensor scratch(DType::kF32, {int64_t(scratch_bytes / 4) + 1});
  GemmArgs g{ta.tensor(),      tb.tensor(), tc.tensor(), cs.bias ? tbias.tensor() : Tensor{},
             scratch.tensor(), cs.ta,       cs.tb,       cs.alpha,
             cs.beta};
  ASSERT_TRUE(ValidateGemm(g).ok()) << ValidateGemm(g).ToString();
  const Status run = cpu::GemmWith(pool, g, bf16);
  ASSERT_TRUE(run.ok()) << run.ToString();
  const std::vector<float> got = tc.Get();

  auto want = ToDouble(c0);
  const auto bias_d = ToDouble(bias);
  ref::Gemm<double>(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, ToDouble(a).data(),
                    ToDouble(b).data(), cs.beta, want.data(), cs.bias ? bias_d.data() : nullptr);
  auto scale = Abs(ToDouble(c0));
  const auto abs_bias = Abs(bias_d);
  ref::Gemm<double>(cs.ta, cs.tb, cs.m, cs.n, cs.k, std::fabs(cs.alpha), Abs(ToDouble(a)).data(),
                    Abs(ToDouble(b)).data(), std::fabs(cs.beta), scale.data(),
                    cs.bias ? abs_bias.data() : nullptr);
  const double u32 = DTypeEpsilon(DType::kF32);
  const double uc = DTypeEpsilon(dt.c);
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = (double(cs.k) + 3) * u32 * scale[i] * (1 + uc) + uc * std::fabs(want[i]);
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= bound) && bad++ < 5) {
      ADD_FAILURE() << "c[" << i << "]: got " << got[i] << " want " << want[i] << " err " << err
                    << " > bound " << bound;
    }
  }
  EXPECT_EQ(bad, 0);
}

const GemmDTypes kF32s{DType::kF32, DType::kF32, DType::kF32};
const GemmDTypes kBF16s{DType::kBF16, DType::kBF16, DType::kBF16};

TEST(CpuGemm, AllTransposesAlphaBetaSmallAwkwardShapes) {
  uint64_t seed = 1;
  for (GemmDTypes dt : {kF32s, kBF16s}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (auto [m, n, k] : {std::array<int64_t, 3>{1, 1, 1},
                               {7, 13, 5},
                               {37, 61, 129},
                               {17, 1, 31},
                               {1, 29, 3}}) {
          CheckGemm({m, n, k, ta, tb, 1.0f, 0.0f, false}, dt, 3, seed++);
          CheckGemm({m, n, k, ta, tb, -0.75f, 1.0f, false}, dt, 2, seed++);
          CheckGemm({m, n, k, ta, tb, 2.5f, -0.5f, true}, dt, 1, seed++);
        }
      }
    }
  }
}

// Larger than one tile in every dimension (kGemmTileM/N/K) with ragged edges, for the tiled
// (converting) path in all transposes; the in-place f32 path splits by threads only.
TEST(CpuGemm, MultiTileShapes) {
  static_assert(cpu::kGemmTileM < 261 && cpu::kGemmTileK < 259 && cpu::kGemmTileN < 517);
  uint64_t seed = 100;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CheckGemm({261, 517, 259, ta, tb, 1.0f, 0.5f, ta}, kBF16s, 3, seed++);
    }
  }
  CheckGemm({261, 517, 259, true, false, 1.0f, 0.5f, true}, kF32s, 3, seed++);
}

TEST(CpuGemm, MixedStorageDTypes) {
  uint64_t seed = 200;
  for (GemmDTypes dt : {GemmDTypes{DType::kF32, DType::kBF16, DType::kF32},
                        GemmDTypes{DType::kBF16, DType::kF32, DType::kBF16},
                        GemmDTypes{DType::kF32, DType::kF32, DType::kBF16},
                        GemmDTypes{DType::kBF16, DType::kBF16, DType::kF32},
                        GemmDTypes{DType::kF16, DType::kF16, DType::kF16}}) {
    CheckGemm({45, 70, 300, false, true, 1.0f, 1.0f, true}, dt, 2, seed++);
    CheckGemm({300, 3, 33, true, false, 1.0f, 0.0f, false}, dt, 3, seed++);
  }
}

TEST(CpuGemm, EmptyInnerDimensionScalesC) {
  for (GemmDTypes dt : {kF32s, kBF16s}) {
    CheckGemm({5, 7, 0, false, false, 1.0f, 0.5f, true}, dt, 2, 300);
    CheckGemm({5, 7, 0, true, true, 1.0f, 0.0f, false}, dt, 2, 301);
  }
}

// Every worker calls sgemm at once, thousands of times: a BLAS that shares internal buffers
// between concurrent calls (Debian's serial OpenBLAS does) gives wrong blocks here. Each result
// must equal the first bit for bit (same blocks, same code).
TEST(CpuGemm, ConcurrentBlasCallsAreSafe) {
  const int64_t m = 64, n = 32, k = 129;  // m >= n: four 16-row blocks, one per worker
  ThreadPool pool(4);
  HostTensor a(DType::kF32, {k, m}, RandomVector(size_t(m * k), 1)),
      b(DType::kF32, {n, k}, RandomVector(size_t(n * k), 2)), c(DType::kF32, {m, n});
  const GemmArgs g{
      .a = a.tensor(), .b = b.tensor(), .c = c.tensor(), .trans_a = true, .trans_b = true};
  ASSERT_TRUE(cpu::Gemm(pool, g).ok());
  const std::vector<float> first = c.Get();
  int bad = 0;
  for (int it = 0; it < 3000; ++it) {  // ~0.1 s
    ASSERT_TRUE(cpu::Gemm(pool, g).ok());
    if (c.Get() != first) ++bad;
  }
  EXPECT_EQ(bad, 0) << "concurrent sgemm calls corrupted " << bad << " of 3000 products";
}

TEST(CpuGemm, RejectsTooSmallScratch) {
  ThreadPool pool(2);
  HostTensor a(DType::kBF16, {4, 8}), b(DType::kBF16, {8, 4}), c(DType::kBF16, {4, 4});
  GemmArgs g{.a = a.tensor(), .b = b.tensor(), .c = c.tensor()};
  ASSERT_GT(cpu::GemmScratchBytes(2, 4, 4, 8, kBF16s), 0u);
  const Status s = cpu::Gemm(pool, g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(cpu::GemmScratchBytes(2, 4, 4, 8, kF32s), 0u) << "f32 GEMM must run in place";
}

TEST(CpuGemm, ValidationNamesTheMismatch) {
  HostTensor a(DType::kF32, {4, 8}), b(DType::kF32, {7, 4}), c(DType::kF32, {4, 4});
  GemmArgs g{.a = a.tensor(), .b = b.tensor(), .c = c.tensor()};
  const Status s = ValidateGemm(g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inner dimensions"), std::string::npos) << s.ToString();
  g.b = b.tensor().Reshape({4, 7});
  g.trans_b = true;  // op(b) = (7, 4)^T... still K = 7 != 8
  EXPECT_FALSE(ValidateGemm(g).ok());
  HostTensor bias(DType::kF32, {5});
  HostTensor b_ok(DType::kF32, {8, 4});
  GemmArgs h{.a = a.tensor(), .b = b_ok.tensor(), .c = c.tensor(), .bias = bias.tensor()};
  EXPECT_NE(ValidateGemm(h).message().find("bias"), std::string::npos);
}

void CheckBiasGrad(int64_t rows, int64_t cols, DType dt, int threads) {
  SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " " << DTypeName(dt));
  const auto dy = Rounded(RandomVector(size_t(rows * cols), 7), dt);
  const auto db0 = Rounded(RandomVector(size_t(cols), 8), dt);
  HostTensor tdy(dt, {rows, cols}, dy), tdb(dt, {cols}, db0);
  ThreadPool pool(threads);
  ASSERT_TRUE(cpu::BiasGrad(pool, {tdy.tensor(), tdb.tensor()}).ok());
  auto want = ToDouble(db0);
  ref::BiasGrad<double>(rows, cols, ToDouble(dy).data(), want.data());
  // A sum of rows + 1 terms of magnitude <= 1 in fp32: error <= (rows + 1) u32 (rows + 1); then
  // one rounding to db's dtype (relative u_dt).
  const float atol = float(rows + 1) * float(rows + 1) * DTypeEpsilon(DType::kF32);
  testing::ExpectClose(tdb.Get(), std::vector<float>(want.begin(), want.end()), atol,
                       DTypeEpsilon(dt), "db");
}

TEST(CpuGemm, BiasGradAccumulatesColumnSums) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CheckBiasGrad(1, 1, dt, 2);
    CheckBiasGrad(37, 1031, dt, 3);
    CheckBiasGrad(129, 7, dt, 2);
  }
}

// The linear layer L = sum(G o (x W^T + b)): the backward GEMM calls documented in
// kernels/ops/gemm.h (dx = dy W, dW += dy^T x, db += colsum dy, with dy = G) must match central
// finite differences of L, in double on the reference.
TEST(RefGemm, LinearLayerBackwardMatchesFiniteDifferences) {
  const int64_t n = 5, in = 4, out = 3;
  auto x = ToDouble(RandomVector(size_t(n * in), 11));
  auto w = ToDouble(RandomVector(size_t(out * in), 12));
  auto b = ToDouble(RandomVector(size_t(out), 13));
  const auto g = ToDouble(RandomVector(size_t(n * out), 14));
  auto loss = [&] {
    std::vector<double> y(size_t(n * out));
    ref::Gemm<double>(false, true, n, out, in, 1.0, x.data(), w.data(), 0.0, y.data(), b.data());
    return Dot(g, y);
  };
  std::vector<double> dx(x.size()), dw(w.size(), 0.5), db(b.size(), -0.25);
  const std::vector<double> dw0 = dw, db0 = db;
  ref::Gemm<double>(false, false, n, in, out, 1.0, g.data(), w.data(), 0.0, dx.data(), nullptr);
  ref::Gemm<double>(true, false, out, in, n, 1.0, g.data(), x.data(), 1.0, dw.data(), nullptr);
  ref::BiasGrad<double>(n, out, g.data(), db.data());
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];  // remove what was accumulated onto
  for (size_t i = 0; i < db.size(); ++i) db[i] -= db0[i];
  // L is linear in each parameter, so central differences are exact up to double rounding of
  // the O(1) loss divided by the 2e-5 step: ~1e-16 / 1e-5 = 1e-11; 1e-8 leaves ample margin.
  auto expect = [](const std::vector<double>& fd, const std::vector<double>& an, const char* what) {
    for (size_t i = 0; i < fd.size(); ++i)
      EXPECT_NEAR(fd[i], an[i], 1e-8) << what << "[" << i << "]";
  };
  expect(testing::FiniteDifference(x, loss), dx, "dx");
  expect(testing::FiniteDifference(w, loss), dw, "dw");
  expect(testing::FiniteDifference(b, loss), db, "db");
}

}  // namespace
}  // namespace ferry
