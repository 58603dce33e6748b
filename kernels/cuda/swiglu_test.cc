// The CUDA SwiGLU (kernels/cuda/swiglu.cu, through the op dispatchers), forward and backward,
// against the CPU backend: f32, bf16 and f16, odd rows and widths. Tolerances:
// kernels/testing/cuda_vs_cpu.h, (a) and (d).
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/swiglu.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {
namespace {

using CudaSwiGluTest = CudaVsCpuTest;

TEST_F(CudaSwiGluTest, SwiGluForwardAndBackwardMatchCpu) {
  const std::vector<RowShape> shapes = {{1, 1}, {3, 7}, {65, 33}, {2, 1000}};
  for (DType t : {kF32, kBF16, kF16}) {
    for (const RowShape& s : shapes) {
      const int64_t n = s.rows, inter = s.cols;
      SCOPED_TRACE(Name(t) + " N=" + std::to_string(n) + " I=" + std::to_string(inter));
      const std::vector<float> gu = StoredRandom(t, n * 2 * inter, 8, -5, 5);
      const std::vector<float> dhv = StoredRandom(t, n * inter, 9);
      Twin gate_up = Make(t, {n, 2 * inter}, "gate_up", gu), dh = Make(t, {n, inter}, "dh", dhv);
      Twin h = Make(t, {n, inter}, "h", std::vector<float>(size_t(n * inter), 0.0f));
      Twin dgu = Make(t, {n, 2 * inter}, "dgate_up", std::vector<float>(size_t(n * 2 * inter), 0));
      RunBoth<SwiGluForwardArgs>(&SwiGluForward, [&](bool g) {
        return SwiGluForwardArgs{gate_up.On(g), h.On(g)};
      });
      RunBoth<SwiGluBackwardArgs>(&SwiGluBackward, [&](bool g) {
        return SwiGluBackwardArgs{gate_up.On(g), dh.On(g), dgu.On(g)};
      });
      std::vector<double> hscale(static_cast<size_t>(n * inter)),
          dscale(static_cast<size_t>(n * 2 * inter));
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < inter; ++j) {
          const double g = std::fabs(gu[size_t(r * 2 * inter + j)]),
                       u = std::fabs(gu[size_t(r * 2 * inter + inter + j)]),
                       d = std::fabs(dhv[size_t(r * inter + j)]);
          hscale[size_t(r * inter + j)] = (g + 1.0) * u;
          dscale[size_t(r * 2 * inter + j)] = d * u * (2.0 + g);  // |dgate| terms
          dscale[size_t(r * 2 * inter + inter + j)] = d * (g + 1.0);
        }
      }
      const std::vector<float> want_h = h.Cpu(), want_d = dgu.Cpu();
      ExpectWithin(h.Gpu(), want_h, Tolerance(t, want_h, hscale, kLibrary), "h");
      ExpectWithin(dgu.Gpu(), want_d, Tolerance(t, want_d, dscale, kLibrary), "dgate_up");
    }
  }
}

}  // namespace
}  // namespace ferry::testing

#else  // !FERRY_WITH_CUDA

TEST(CudaSwiGluTest, NotBuilt) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // FERRY_WITH_CUDA
