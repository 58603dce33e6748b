// The CUDA residual add and accumulate (kernels/cuda/residual.cu, through the op dispatchers)
// against the CPU backend: every combination of f32, bf16 and f16 for the inputs and the output,
// in place too. Both sides round the same fp32 sum once: they must match exactly.
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/residual.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {
namespace {

using CudaResidualTest = CudaVsCpuTest;

TEST_F(CudaResidualTest, ResidualAddAndAccumulateMatchCpuExactlyInMixedDtypes) {
  for (DType ta : {kF32, kBF16, kF16}) {
    for (DType tb : {kF32, kBF16, kF16}) {
      for (DType ty : {kF32, kBF16, kF16}) {
        for (int64_t n : {1, 7, 1000, 4097}) {
          SCOPED_TRACE(Name(ta) + " + " + Name(tb) + " -> " + Name(ty) + " n=" + std::to_string(n));
          Twin a = Make(ta, {n}, "a", testing::RandomVector(size_t(n), 1, -4, 4));
          Twin b = Make(tb, {n}, "b", testing::RandomVector(size_t(n), 2, -4, 4));
          Twin y = Make(ty, {n}, "y", testing::RandomVector(size_t(n), 3));
          RunBoth<ResidualAddArgs>(&ResidualAdd, [&](bool g) {
            return ResidualAddArgs{a.On(g), b.On(g), y.On(g)};
          });
          ExpectExact(y.Gpu(), y.Cpu(), "y");
          // dx (ty) += dy (tb).
          RunBoth<ResidualAccumulateArgs>(&ResidualAccumulate, [&](bool g) {
            return ResidualAccumulateArgs{b.On(g), y.On(g)};
          });
          ExpectExact(y.Gpu(), y.Cpu(), "dx");
        }
      }
    }
  }
}

TEST_F(CudaResidualTest, ResidualAddInPlace) {
  const int64_t n = 257;
  Twin a = Make(kBF16, {n}, "a", testing::RandomVector(size_t(n), 4));
  Twin b = Make(kF32, {n}, "b", testing::RandomVector(size_t(n), 5));
  RunBoth<ResidualAddArgs>(&ResidualAdd, [&](bool g) {
    return ResidualAddArgs{a.On(g), b.On(g), a.On(g)};
  });
  ExpectExact(a.Gpu(), a.Cpu(), "y = a");
}

}  // namespace
}  // namespace ferry::testing

#else  // !FERRY_WITH_CUDA

TEST(CudaResidualTest, NotBuilt) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // FERRY_WITH_CUDA
