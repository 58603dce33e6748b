// The CUDA RoPE (kernels/cuda/rope.cu, through the op dispatchers), forward and backward,
// against the CPU backend: f32 and bf16 (the op takes no f16), full and partial rotary, computed
// and given frequency tables, in place and not, head_dim up to the maximum. Tolerances:
// kernels/testing/cuda_vs_cpu.h, (a) and (d) (cos and sin in their last fp32 bit).
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/rope.h"
#include "kernels/ops/rope_math.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {
namespace {

using CudaRopeTest = CudaVsCpuTest;

struct RopeCase {
  int64_t tokens, heads, head_dim, rotary_dim;
  bool table, in_place;
  std::string Name() const {
    return "N=" + std::to_string(tokens) + " H=" + std::to_string(heads) +
           " D=" + std::to_string(head_dim) + " R=" + std::to_string(rotary_dim) +
           (table ? " table" : " theta") + (in_place ? " in place" : "");
  }
};

TEST_F(CudaRopeTest, RopeForwardAndBackwardMatchCpu) {
  const std::vector<RopeCase> cases = {{1, 1, 2, 0, false, false},   {3, 2, 8, 0, false, true},
                                       {65, 3, 66, 0, true, false},  {7, 2, 10, 4, false, false},
                                       {33, 4, 130, 64, true, true}, {5, 1, 1024, 0, false, false}};
  for (DType t : {kF32, kBF16}) {
    for (const RopeCase& rc : cases) {
      for (bool forward : {true, false}) {
        SCOPED_TRACE(Name(t) + " " + rc.Name() + (forward ? " forward" : " backward"));
        const int64_t row = rc.heads * rc.head_dim, n = rc.tokens;
        const int64_t rot = rc.rotary_dim == 0 ? rc.head_dim : rc.rotary_dim;
        const std::vector<float> xv = StoredRandom(t, n * row, 30, -3, 3);
        Twin in = Make(t, {n, row}, "in", xv);
        Twin out = Make(t, {n, row}, "out", std::vector<float>(size_t(n * row), 0.0f));
        std::vector<int32_t> pos(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t((i * 977 + 13) % 8192);
        testing::DeviceTensor gpos(*gpu_, DType::kI32, {n}, "pos"),
            cpos(*cpu_, DType::kI32, {n}, "pos");
        gpos.UploadBytes(pos.data(), pos.size() * 4);
        cpos.UploadBytes(pos.data(), pos.size() * 4);
        std::vector<float> freq = RopeInverseFrequencies(500000.0f, rot);
        for (float& f : freq) f *= 0.75f;  // a table unlike theta's
        Twin inv_freq = Make(kF32, {rot / 2}, "inv_freq", freq);
        auto args = [&](bool g) {
          const Tensor src = in.On(g);
          return RopeArgs{src,
                          rc.in_place ? src : out.On(g),
                          g ? gpos.tensor() : cpos.tensor(),
                          rc.table ? inv_freq.On(g) : Tensor{},
                          rc.heads,
                          rc.head_dim,
                          rc.rotary_dim,
                          10000.0f};
        };
        RunBoth<RopeArgs>(forward ? &RopeForward : &RopeBackward, args);
        // One rotation per pair: (a), and cos/sin may differ in their last fp32 bit (d).
        std::vector<double> scale(size_t(n * row), 0.0);
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t h = 0; h < rc.heads; ++h) {
            for (int64_t i = 0; i < rot / 2; ++i) {
              const size_t a = size_t(r * row + h * rc.head_dim + i), b = a + size_t(rot / 2);
              scale[a] = scale[b] = std::fabs(xv[a]) + std::fabs(xv[b]);
            }
          }
        }
        Twin& result = rc.in_place ? in : out;
        const std::vector<float> want = result.Cpu();
        ExpectWithin(result.Gpu(), want, Tolerance(t, want, scale, 0x1p-21), "out");
      }
    }
  }
}

}  // namespace
}  // namespace ferry::testing

#else  // !FERRY_WITH_CUDA

TEST(CudaRopeTest, NotBuilt) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // FERRY_WITH_CUDA
