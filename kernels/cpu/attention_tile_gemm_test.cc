// The attention tile products: each block kernel against a plain double product, with strided
// (transposed) A operands and partial k ranges, and the selected kernel against the portable one.
#include "kernels/cpu/attention_tile_gemm.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/testing/op_testing.h"

namespace ferry::cpu {
namespace {

// out (rows x cols) = init + A B over [k0, k1) with A given by strides, checked against double.
void CheckBlockKernel(TileGemmBlock block, bool transposed_a) {
  const int64_t rows = 12, cols = 24, kdim = 37, k0 = 3, k1 = 31, os = 40, bs = 29;
  const std::vector<float> a = testing::RandomVector(size_t(rows * kdim), 1);
  const std::vector<float> b = testing::RandomVector(size_t(kdim * bs), 2);
  const std::vector<float> init = testing::RandomVector(size_t(rows * os), 3);
  const int64_t ars = transposed_a ? 1 : kdim, aks = transposed_a ? rows : 1;
  std::vector<float> out = init;
  TileGemm(block, rows, cols, a.data(), ars, aks, b.data(), bs, k0, k1, out.data(), os);
  std::vector<float> got, want;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < os; ++c) {
      double acc = init[size_t(r * os + c)];
      if (c < cols) {
        for (int64_t k = k0; k < k1; ++k)
          acc += double(a[size_t(r * ars + k * aks)]) * b[size_t(k * bs + c)];
      }
      got.push_back(out[size_t(r * os + c)]);
      want.push_back(float(acc));
    }
  }
  // An fp32 sum of 28 products of |x| <= 1 plus |init| <= 1: at most 29 roundings of partial
  // sums <= 29, i.e. 29 * 29 units of 2^-24; columns past `cols` must be untouched (exact).
  testing::ExpectClose(got, want, 29 * 29 * DTypeEpsilon(DType::kF32), 0, "tile gemm");
}

TEST(AttentionTileGemmTest, BlockKernelsMatchDoubleProducts) {
  for (bool transposed : {false, true}) {
    CheckBlockKernel(PortableTileGemmBlock(), transposed);
    CheckBlockKernel(SelectTileGemmBlock(), transposed);
  }
}

// Same multiply-then-add per lane in the same order: the selected (possibly AVX2) kernel and the
// portable one agree bit for bit, so results do not depend on the CPU.
TEST(AttentionTileGemmTest, SelectedKernelEqualsPortableBitForBit) {
  const std::vector<float> a = testing::RandomVector(64 * 80, 4),
                           b = testing::RandomVector(80 * 64, 5);
  std::vector<float> x(64 * 64, 0.0f), y(64 * 64, 0.0f);
  TileGemm(PortableTileGemmBlock(), 64, 64, a.data(), 80, 1, b.data(), 64, 0, 80, x.data(), 64);
  TileGemm(SelectTileGemmBlock(), 64, 64, a.data(), 80, 1, b.data(), 64, 0, 80, y.data(), 64);
  testing::ExpectClose(y, x, 0, 0, "selected vs portable");
}

}  // namespace
}  // namespace ferry::cpu
