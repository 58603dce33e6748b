// The CUDA GELU (kernels/cuda/gelu.cu, through the op dispatchers), exact and tanh, forward and
// backward, against the CPU backend: f32, bf16 and f16, sizes that fit no block or warp.
// Tolerances: kernels/testing/cuda_vs_cpu.h, (a) and (d).
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/gelu.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {
namespace {

using CudaGeluTest = CudaVsCpuTest;

TEST_F(CudaGeluTest, GeluForwardAndBackwardMatchCpu) {
  for (GeluApprox approx : {GeluApprox::kErf, GeluApprox::kTanh}) {
    for (DType t : {kF32, kBF16, kF16}) {
      for (int64_t n : {1, 7, 33, 1000, 4099}) {
        SCOPED_TRACE(Name(t) + (approx == GeluApprox::kTanh ? " tanh" : " erf") +
                     " n=" + std::to_string(n));
        const std::vector<float> xv = StoredRandom(t, n, 6, -6, 6), dyv = StoredRandom(t, n, 7);
        Twin x = Make(t, {n}, "x", xv), dy = Make(t, {n}, "dy", dyv);
        Twin y = Make(t, {n}, "y", std::vector<float>(size_t(n), 0.0f));
        Twin dx = Make(t, {n}, "dx", std::vector<float>(size_t(n), 0.0f));
        RunBoth<GeluForwardArgs>(&GeluForward, [&](bool g) {
          return GeluForwardArgs{x.On(g), y.On(g), approx};
        });
        RunBoth<GeluBackwardArgs>(&GeluBackward, [&](bool g) {
          return GeluBackwardArgs{x.On(g), dy.On(g), dx.On(g), approx};
        });
        std::vector<double> fscale(static_cast<size_t>(n)), bscale(static_cast<size_t>(n));
        for (size_t i = 0; i < size_t(n); ++i) {
          fscale[i] = std::fabs(xv[i]) + 1.0;  // |x| (1 + |erf|) / 2 <= |x|; +1: tails near 0
          bscale[i] = std::fabs(dyv[i]) * (2.0 + std::fabs(xv[i]));  // |dy| |gelu'|, gelu' < 1.2
        }
        const std::vector<float> want_y = y.Cpu(), want_dx = dx.Cpu();
        ExpectWithin(y.Gpu(), want_y, Tolerance(t, want_y, fscale, kLibrary), "y");
        ExpectWithin(dx.Gpu(), want_dx, Tolerance(t, want_dx, bscale, kLibrary), "dx");
      }
    }
  }
}

}  // namespace
}  // namespace ferry::testing

#else  // !FERRY_WITH_CUDA

TEST(CudaGeluTest, NotBuilt) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // FERRY_WITH_CUDA
