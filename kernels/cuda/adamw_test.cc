// The CUDA AdamW (kernels/cuda/adamw.cu, through the op dispatcher) against the CPU backend: f32
// and bf16 gradients, with and without weight decay and the bf16 copy of the weights. Both run
// torch's fp32 operation order with the same rounded scalars: the results must match bit for
// bit.
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/adamw.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {
namespace {

using CudaAdamWTest = CudaVsCpuTest;

TEST_F(CudaAdamWTest, AdamWMatchesCpuBitForBit) {
  for (DType tg : {kF32, kBF16}) {
    for (bool with_copy : {false, true}) {
      for (bool decay : {false, true}) {
        for (int64_t n : {1, 7, 1000, 4099}) {
          SCOPED_TRACE("g " + Name(tg) + (with_copy ? " +bf16 copy" : "") +
                       (decay ? " decay" : "") + " n=" + std::to_string(n));
          Twin p = Make(kF32, {n}, "p", testing::RandomVector(size_t(n), 31));
          Twin g = Make(tg, {n}, "g", testing::RandomVector(size_t(n), 32, -0.1f, 0.1f));
          Twin m = Make(kF32, {n}, "m", testing::RandomVector(size_t(n), 33, -0.01f, 0.01f));
          Twin v = Make(kF32, {n}, "v", testing::RandomVector(size_t(n), 34, 0.0f, 1e-4f));
          Twin pb = Make(kBF16, {n}, "p_bf16", std::vector<float>(size_t(n), 0.0f));
          AdamWHyperparameters hyper;
          hyper.lr = 3e-4;
          hyper.weight_decay = decay ? 0.1 : 0.0;
          hyper.step = 7;
          hyper.grad_scale = 0.5;
          RunBoth<AdamWArgs>(&AdamWStep, [&](bool on_gpu) {
            return AdamWArgs{p.On(on_gpu),
                             g.On(on_gpu),
                             m.On(on_gpu),
                             v.On(on_gpu),
                             with_copy ? pb.On(on_gpu) : Tensor{},
                             hyper};
          });
          ExpectExact(p.Gpu(), p.Cpu(), "p");
          ExpectExact(m.Gpu(), m.Cpu(), "m");
          ExpectExact(v.Gpu(), v.Cpu(), "v");
          ExpectExact(pb.Gpu(), pb.Cpu(), "p_bf16");
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry::testing

#else  // !FERRY_WITH_CUDA

TEST(CudaAdamWTest, NotBuilt) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // FERRY_WITH_CUDA
