// The CUDA RMSNorm, LayerNorm and bias gradient (kernels/cuda/norms.cu, through the op
// dispatchers), forward and backward, against the CPU backend: activations, weights and gradients
// in f32, bf16 and f16 (one dtype for all, and mixed: fp32 gradients of bf16 layers), rows and
// hidden sizes that fit no warp, block or column tile; parameter gradients accumulate onto
// non-zero values. Tolerances: kernels/testing/cuda_vs_cpu.h, (a) to (c), per element.
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/gemm_bias_grad.h"
#include "kernels/ops/layernorm.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {
namespace {

using CudaNormsTest = CudaVsCpuTest;

// 1 / sqrt(mean(x^2) + eps) of each stored row, in double.
std::vector<float> RowRstd(const std::vector<float>& x, int64_t rows, int64_t cols, double eps,
                           std::vector<float>* mean_out = nullptr) {
  std::vector<float> rstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0;
    if (mean_out != nullptr) {
      for (int64_t j = 0; j < cols; ++j) m += x[size_t(r * cols + j)];
      m /= double(cols);
      (*mean_out)[size_t(r)] = float(m);
    }
    double ss = 0;
    for (int64_t j = 0; j < cols; ++j) ss += std::pow(x[size_t(r * cols + j)] - m, 2);
    rstd[size_t(r)] = float(1.0 / std::sqrt(ss / double(cols) + eps));
  }
  return rstd;
}

struct NormDtypes {
  DType act, param, grad;  // x/y/dy/dx, weight (and bias), dweight (and dbias)
  std::string Name() const {
    return testing::Name(act) + "/" + testing::Name(param) + "/" + testing::Name(grad);
  }
};
const std::vector<NormDtypes> kNormDtypes = {{kF32, kF32, kF32},
                                             {kBF16, kBF16, kBF16},
                                             {kF16, kF16, kF16},
                                             {kBF16, kBF16, kF32},  // fp32 gradient accumulation
                                             {kF16, kF32, kF32}};

// Calls fn(dtypes, rows, cols) for every norm dtype set and row shape, traced.
template <typename Fn>
void ForEachNormCase(const Fn& fn) {
  for (const NormDtypes& t : kNormDtypes) {
    for (const RowShape& s : kRowShapes) {
      SCOPED_TRACE(t.Name() + " N=" + std::to_string(s.rows) + " C=" + std::to_string(s.cols));
      fn(t, s.rows, s.cols);
    }
  }
}

// The stored inputs of a norm's backward: x, dy, the weight and the gradients' starting values.
struct NormBackwardInputs {
  NormBackwardInputs(const NormDtypes& t, int64_t n, int64_t c, uint64_t seed)
      : x(StoredRandom(t.act, n * c, seed, -2, 2)),
        dy(StoredRandom(t.act, n * c, seed + 1)),
        w(StoredRandom(t.param, c, seed + 2, -1.5, 1.5)),
        dw0(StoredRandom(t.grad, c, seed + 3)),
        db0(StoredRandom(t.grad, c, seed + 4)) {}
  std::vector<float> x, dy, w, dw0, db0;
};

TEST_F(CudaNormsTest, RmsNormForwardMatchesCpu) {
  const float eps = 1e-6f;
  ForEachNormCase([&](const NormDtypes& t, int64_t n, int64_t c) {
    const std::vector<float> xv = StoredRandom(t.act, n * c, 10, -2, 2);
    const std::vector<float> wv = StoredRandom(t.param, c, 11, -1.5, 1.5);
    Twin x = Make(t.act, {n, c}, "x", xv), w = Make(t.param, {c}, "w", wv);
    Twin y = Make(t.act, {n, c}, "y", std::vector<float>(size_t(n * c), 0.0f));
    Twin rstd = Make(kF32, {n}, "rstd", std::vector<float>(size_t(n), 0.0f));
    RunBoth<RmsNormForwardArgs>(&RmsNormForward, [&](bool g) {
      return RmsNormForwardArgs{x.On(g), w.On(g), y.On(g), rstd.On(g), eps};
    });
    // rstd: (b) for the sum of squares, n = C, then a sqrt and a division.
    const std::vector<float> want_rstd = rstd.Cpu();
    const std::vector<double> rscale(want_rstd.begin(), want_rstd.end());
    ExpectWithin(rstd.Gpu(), want_rstd,
                 Tolerance(kF32, want_rstd, rscale, 2.0 * double(c + 4) * kF32Unit), "rstd");
    // y = w round_x(x rstd): rstd's error (b), xhat's rounding (c), y's rounding (a).
    std::vector<double> yscale(static_cast<size_t>(n * c));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < c; ++j) {
        yscale[size_t(r * c + j)] =
            std::fabs(wv[size_t(j)] * xv[size_t(r * c + j)]) * want_rstd[size_t(r)] * 1.01;
      }
    }
    const std::vector<float> want_y = y.Cpu();
    ExpectWithin(y.Gpu(), want_y,
                 Tolerance(t.act, want_y, yscale, Spacing(t.act) + 2.0 * double(c + 4) * kF32Unit),
                 "y");
  });
}

TEST_F(CudaNormsTest, RmsNormBackwardMatchesCpuAndAccumulatesDweight) {
  ForEachNormCase([&](const NormDtypes& t, int64_t n, int64_t c) {
    const NormBackwardInputs in(t, n, c, 12);
    const std::vector<float>&xv = in.x, &dyv = in.dy, &wv = in.w, &dw0 = in.dw0;
    const std::vector<float> rs = RowRstd(xv, n, c, 1e-6);
    Twin x = Make(t.act, {n, c}, "x", xv), dy = Make(t.act, {n, c}, "dy", dyv),
         w = Make(t.param, {c}, "w", wv), rstd = Make(kF32, {n}, "rstd", rs),
         dw = Make(t.grad, {c}, "dw", dw0);
    Twin dx = Make(t.act, {n, c}, "dx", std::vector<float>(size_t(n * c), 0.0f));
    RunBoth<RmsNormBackwardArgs>(&RmsNormBackward, [&](bool g) {
      return RmsNormBackwardArgs{dy.On(g), x.On(g), w.On(g), rstd.On(g), dx.On(g), dw.On(g)};
    });
    // dx = rs (g - xhat mean(g xhat)): (b) over the row's C terms, scaled by the terms.
    std::vector<double> dxscale(static_cast<size_t>(n * c)), dwscale(static_cast<size_t>(c));
    for (int64_t j = 0; j < c; ++j) dwscale[size_t(j)] = std::fabs(dw0[size_t(j)]);
    for (int64_t r = 0; r < n; ++r) {
      double mean_abs = 0;
      for (int64_t j = 0; j < c; ++j) {
        const size_t i = size_t(r * c + j);
        mean_abs += std::fabs(dyv[i] * wv[size_t(j)] * xv[i]) * rs[size_t(r)];
        dwscale[size_t(j)] += std::fabs(dyv[i] * xv[i]) * rs[size_t(r)] * 1.01;
      }
      mean_abs /= double(c);
      for (int64_t j = 0; j < c; ++j) {
        const size_t i = size_t(r * c + j);
        dxscale[i] = rs[size_t(r)] * (std::fabs(dyv[i] * wv[size_t(j)]) +
                                      std::fabs(xv[i]) * rs[size_t(r)] * mean_abs);
      }
    }
    const std::vector<float> want_dx = dx.Cpu(), want_dw = dw.Cpu();
    ExpectWithin(dx.Gpu(), want_dx,
                 Tolerance(t.act, want_dx, dxscale, 4.0 * double(c + 4) * kF32Unit), "dx");
    // dw = dw0 + sum over rows: (b) over N terms, (c) for round_x(xhat), (a) for dw's rounding.
    ExpectWithin(
        dw.Gpu(), want_dw,
        Tolerance(t.grad, want_dw, dwscale, Spacing(t.act) + 2.0 * double(n + c + 4) * kF32Unit),
        "dweight");
  });
}

TEST_F(CudaNormsTest, RmsNormBackwardInPlaceEqualsOutOfPlace) {
  // dx over dy: dweight must read dy before dx overwrites it. The GPU's kernels are deterministic,
  // so in place and out of place must give the same bits.
  const int64_t n = 65, c = 257;
  const std::vector<float> xv = testing::RandomVector(size_t(n * c), 16, -2, 2),
                           dyv = testing::RandomVector(size_t(n * c), 17);
  Twin x = Make(kBF16, {n, c}, "x", xv),
       w = Make(kBF16, {c}, "w", testing::RandomVector(size_t(c), 18)),
       rstd = Make(kF32, {n}, "rstd", RowRstd(testing::Rounded(xv, kBF16), n, c, 1e-6));
  Twin dy = Make(kBF16, {n, c}, "dy", dyv), dx = Make(kBF16, {n, c}, "dx", dyv);
  Twin dw_in_place = Make(kF32, {c}, "dw", std::vector<float>(size_t(c), 0.0f)),
       dw = Make(kF32, {c}, "dw", std::vector<float>(size_t(c), 0.0f));
  ASSERT_TRUE(RmsNormBackward(*gpu_, {dy.On(true), x.On(true), w.On(true), rstd.On(true),
                                      dx.On(true), dw.On(true)})
                  .ok());
  ASSERT_TRUE(RmsNormBackward(*gpu_, {dy.On(true), x.On(true), w.On(true), rstd.On(true),
                                      dy.On(true), dw_in_place.On(true)})
                  .ok());
  ExpectExact(dw_in_place.Gpu(), dw.Gpu(), "dweight");
  ExpectExact(dy.Gpu(), dx.Gpu(), "dx");
}

TEST_F(CudaNormsTest, LayerNormForwardMatchesCpu) {
  const float eps = 1e-5f;
  ForEachNormCase([&](const NormDtypes& t, int64_t n, int64_t c) {
    const std::vector<float> xv = StoredRandom(t.act, n * c, 19, -1, 3);
    const std::vector<float> wv = StoredRandom(t.param, c, 20, -1.5, 1.5);
    const std::vector<float> bv = StoredRandom(t.param, c, 21);
    Twin x = Make(t.act, {n, c}, "x", xv), w = Make(t.param, {c}, "w", wv),
         b = Make(t.param, {c}, "b", bv);
    Twin y = Make(t.act, {n, c}, "y", std::vector<float>(size_t(n * c), 0.0f));
    Twin mean = Make(kF32, {n}, "mean", std::vector<float>(size_t(n), 0.0f));
    Twin rstd = Make(kF32, {n}, "rstd", std::vector<float>(size_t(n), 0.0f));
    RunBoth<LayerNormForwardArgs>(&LayerNormForward, [&](bool g) {
      return LayerNormForwardArgs{x.On(g), w.On(g), b.On(g), y.On(g), mean.On(g), rstd.On(g), eps};
    });
    // mean: (b) over C terms of |x| <= 3. rstd: (b) for the variance, then sqrt and division;
    // the mean's error cancels to first order in the variance (its terms sum to zero).
    const std::vector<float> want_mean = mean.Cpu(), want_rstd = rstd.Cpu();
    const double slack = 4.0 * double(c + 4) * kF32Unit;
    ExpectWithin(mean.Gpu(), want_mean,
                 Tolerance(kF32, want_mean, std::vector<double>(size_t(n), 3.0), slack), "mean");
    const std::vector<double> rscale(want_rstd.begin(), want_rstd.end());
    ExpectWithin(rstd.Gpu(), want_rstd, Tolerance(kF32, want_rstd, rscale, slack), "rstd");
    std::vector<double> yscale(static_cast<size_t>(n * c));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < c; ++j) {
        const size_t i = size_t(r * c + j);
        // The mean's error (|x| <= 3 terms), x - mean times rstd's error, b's addition.
        yscale[i] = (std::fabs(xv[i]) + 3.0) * want_rstd[size_t(r)] * std::fabs(wv[size_t(j)]) +
                    std::fabs(bv[size_t(j)]);
      }
    }
    const std::vector<float> want_y = y.Cpu();
    ExpectWithin(y.Gpu(), want_y, Tolerance(t.act, want_y, yscale, slack), "y");
  });
}

TEST_F(CudaNormsTest, LayerNormBackwardMatchesCpuAndAccumulatesDweightDbias) {
  ForEachNormCase([&](const NormDtypes& t, int64_t n, int64_t c) {
    const NormBackwardInputs in(t, n, c, 22);
    const std::vector<float>&xv = in.x, &dyv = in.dy, &wv = in.w, &dw0 = in.dw0, &db0 = in.db0;
    std::vector<float> mv(static_cast<size_t>(n));
    const std::vector<float> rs = RowRstd(xv, n, c, 1e-5, &mv);
    Twin x = Make(t.act, {n, c}, "x", xv), dy = Make(t.act, {n, c}, "dy", dyv),
         w = Make(t.param, {c}, "w", wv), mean = Make(kF32, {n}, "mean", mv),
         rstd = Make(kF32, {n}, "rstd", rs), dw = Make(t.grad, {c}, "dw", dw0),
         db = Make(t.grad, {c}, "db", db0);
    Twin dx = Make(t.act, {n, c}, "dx", std::vector<float>(size_t(n * c), 0.0f));
    RunBoth<LayerNormBackwardArgs>(&LayerNormBackward, [&](bool g) {
      return LayerNormBackwardArgs{dy.On(g),   x.On(g),  w.On(g),  mean.On(g),
                                   rstd.On(g), dx.On(g), dw.On(g), db.On(g)};
    });
    std::vector<double> dxscale(static_cast<size_t>(n * c)), dwscale(static_cast<size_t>(c)),
        dbscale(static_cast<size_t>(c));
    for (int64_t j = 0; j < c; ++j) {
      dwscale[size_t(j)] = std::fabs(dw0[size_t(j)]);
      dbscale[size_t(j)] = std::fabs(db0[size_t(j)]);
    }
    for (int64_t r = 0; r < n; ++r) {
      double mean_g = 0, mean_gx = 0;
      for (int64_t j = 0; j < c; ++j) {
        const size_t i = size_t(r * c + j);
        const double xhat = std::fabs(xv[i] - mv[size_t(r)]) * rs[size_t(r)];
        mean_g += std::fabs(dyv[i] * wv[size_t(j)]);
        mean_gx += std::fabs(dyv[i] * wv[size_t(j)]) * xhat;
        dwscale[size_t(j)] += std::fabs(dyv[i]) * xhat;
        dbscale[size_t(j)] += std::fabs(dyv[i]);
      }
      mean_g /= double(c);
      mean_gx /= double(c);
      for (int64_t j = 0; j < c; ++j) {
        const size_t i = size_t(r * c + j);
        const double xhat = std::fabs(xv[i] - mv[size_t(r)]) * rs[size_t(r)];
        dxscale[i] = rs[size_t(r)] * (std::fabs(dyv[i] * wv[size_t(j)]) + mean_g + xhat * mean_gx);
      }
    }
    const std::vector<float> want_dx = dx.Cpu(), want_dw = dw.Cpu(), want_db = db.Cpu();
    ExpectWithin(dx.Gpu(), want_dx,
                 Tolerance(t.act, want_dx, dxscale, 4.0 * double(c + 4) * kF32Unit), "dx");
    ExpectWithin(dw.Gpu(), want_dw,
                 Tolerance(t.grad, want_dw, dwscale, 4.0 * double(n + 4) * kF32Unit), "dweight");
    ExpectWithin(db.Gpu(), want_db,
                 Tolerance(t.grad, want_db, dbscale, 2.0 * double(n + 4) * kF32Unit), "dbias");
  });
}

TEST_F(CudaNormsTest, BiasGradMatchesCpuAndAccumulates) {
  const std::vector<RowShape> shapes = {{1, 1}, {3, 7}, {65, 33}, {3, 257}, {1000, 65}, {2, 1000}};
  for (DType tdy : {kF32, kBF16, kF16}) {
    for (DType tdb : {kF32, kBF16, kF16}) {
      for (const RowShape& s : shapes) {
        const int64_t n = s.rows, c = s.cols;
        SCOPED_TRACE(Name(tdy) + " -> " + Name(tdb) + " N=" + std::to_string(n) +
                     " C=" + std::to_string(c));
        const std::vector<float> dyv = StoredRandom(tdy, n * c, 27);
        const std::vector<float> db0 = StoredRandom(tdb, c, 28);
        Twin dy = Make(tdy, {n, c}, "dy", dyv), db = Make(tdb, {c}, "db", db0);
        RunBoth<BiasGradArgs>(&BiasGrad, [&](bool g) { return BiasGradArgs{dy.On(g), db.On(g)}; });
        std::vector<double> scale(static_cast<size_t>(c));
        for (int64_t j = 0; j < c; ++j) {
          scale[size_t(j)] = std::fabs(db0[size_t(j)]);
          for (int64_t r = 0; r < n; ++r) scale[size_t(j)] += std::fabs(dyv[size_t(r * c + j)]);
        }
        const std::vector<float> want = db.Cpu();
        ExpectWithin(db.Gpu(), want, Tolerance(tdb, want, scale, 2.0 * double(n + 4) * kF32Unit),
                     "db");
      }
    }
  }
}

TEST_F(CudaNormsTest, ColumnSumsAreDeterministic) {
  // The same inputs twice give the same bits (fixed summation order, no atomics).
  const int64_t n = 1000, c = 257;
  Twin dy = Make(kBF16, {n, c}, "dy", testing::RandomVector(size_t(n * c), 29));
  Twin db1 = Make(kF32, {c}, "db1", std::vector<float>(size_t(c), 0.0f)),
       db2 = Make(kF32, {c}, "db2", std::vector<float>(size_t(c), 0.0f));
  ASSERT_TRUE(BiasGrad(*gpu_, {dy.On(true), db1.On(true)}).ok());
  ASSERT_TRUE(BiasGrad(*gpu_, {dy.On(true), db2.On(true)}).ok());
  ExpectExact(db1.Gpu(), db2.Gpu(), "db");
}

}  // namespace
}  // namespace ferry::testing

#else  // !FERRY_WITH_CUDA

TEST(CudaNormsTest, NotBuilt) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // FERRY_WITH_CUDA
