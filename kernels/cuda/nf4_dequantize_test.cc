// The CUDA NF4 dequantization (kernels/cuda/nf4_dequantize.cu, through the op dispatcher) against
// the CPU backend, bit for bit: both compute one fp32 product per element (and, nested, one product
// and one sum per block absmax, never an fma) and round it once, so any difference is a bug.
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops/nf4_dequantize.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/nf4_staging.h"

namespace ferry::testing {
namespace {

using CudaNf4Test = CudaVsCpuTest;

TEST_F(CudaNf4Test, DequantizeMatchesCpuBitForBit) {
  for (const Nf4Sample& s : Nf4Samples()) {
    const DeviceNf4 on_gpu(*gpu_, s.w), on_cpu(*cpu_, s.w);
    for (DType t : {kF32, kBF16, kF16}) {
      SCOPED_TRACE(s.name + " out " + Name(t));
      Twin out = Zeros(t, {s.w.numel()}, "out");
      RunBoth<Nf4DequantizeArgs>(&Nf4Dequantize,
                                 [&](bool g) { return (g ? on_gpu : on_cpu).Args(out.On(g)); });
      const std::vector<float> got = out.Gpu(), want = out.Cpu();
      ExpectExact(got, want, "out");
      int signs = 0;  // ExpectExact takes -0.0 for 0.0: the tree's zero blocks are -0.0
      for (size_t i = 0; i < got.size(); ++i)
        signs += std::signbit(got[i]) != std::signbit(want[i]);
      EXPECT_EQ(signs, 0);
    }
  }
}

}  // namespace
}  // namespace ferry::testing

#else  // !FERRY_WITH_CUDA

TEST(CudaNf4Test, NotBuilt) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // FERRY_WITH_CUDA
