// Dense ops through the dispatcher on a CpuDevice: GEMM (bf16, with scratch and bias) and
// RMSNorm forward/backward run as stream work, with random stream delays on, and must give
// bit-identical results to the CPU kernels called directly with the same pool size (same code,
// same tiling); validation errors come back at enqueue time.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/testing/device_staging.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::ExpectClose;
using testing::HostTensor;
using testing::RandomVector;

constexpr int kThreads = 2;

std::unique_ptr<CpuDevice> MakeDevice() {
  CpuDeviceOptions o;
  o.name = "dense-ops";
  o.memory_bytes = size_t(16) << 20;
  o.compute_threads = kThreads;
  o.max_random_delay_us = 200;
  auto d = CpuDevice::Create(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

// A device tensor holding `values` (rounded to its dtype), or uninitialized when none are given.
testing::DeviceTensor Staged(Device& d, DType t, Shape s, const std::vector<float>& values = {}) {
  testing::DeviceTensor x(d, t, s, "test tensor");
  if (!values.empty()) x.Upload(values);
  return x;
}

TEST(DenseOpsOnCpuDevice, GemmMatchesDirectKernel) {
  auto dev = MakeDevice();
  const int64_t m = 67, n = 530, k = 300;  // several bf16 tiles and K panels
  const DType bf = DType::kBF16;
  const auto x = RandomVector(size_t(m * k), 1), w = RandomVector(size_t(n * k), 2),
             b = RandomVector(size_t(n), 3);
  const GemmDTypes dt{bf, bf, bf};
  const size_t scratch_bytes = GemmScratchBytes(*dev, m, n, k, dt);
  ASSERT_EQ(scratch_bytes, cpu::GemmScratchBytes(kThreads, m, n, k, dt));
  ASSERT_GT(scratch_bytes, 0u);
  auto dx = Staged(*dev, bf, {m, k}, x);
  auto dw = Staged(*dev, bf, {n, k}, w);
  auto db = Staged(*dev, bf, {n}, b);
  auto dy = Staged(*dev, bf, {m, n});
  auto ds = Staged(*dev, DType::kF32, {int64_t(scratch_bytes / 4)});
  GemmArgs g{dx.tensor(), dw.tensor(), dy.tensor(), db.tensor(), ds.tensor(), false, true};
  ASSERT_TRUE(Gemm(*dev, g).ok());
  ASSERT_TRUE(dev->Synchronize().ok());

  HostTensor hx(bf, {m, k}, x), hw(bf, {n, k}, w), hb(bf, {n}, b), hy(bf, {m, n}),
      hs(DType::kF32, {int64_t(scratch_bytes / 4)});
  ThreadPool pool(kThreads);
  ASSERT_TRUE(cpu::Gemm(pool, {hx.tensor(), hw.tensor(), hy.tensor(), hb.tensor(), hs.tensor(),
                               false, true})
                  .ok());
  ExpectClose(dy.Download(), hy.Get(), 0, 0, "y");  // same code and tiling: bit-identical

  // Errors at enqueue: scratch too small, then a shape mismatch naming the tensor.
  g.scratch = Tensor{};
  EXPECT_EQ(Gemm(*dev, g).code(), StatusCode::kInvalidArgument);
  g.scratch = ds.tensor();
  g.bias = dx.tensor();
  const Status s = Gemm(*dev, g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bias"), std::string::npos) << s.ToString();
  EXPECT_TRUE(dev->Synchronize().ok());
}

TEST(DenseOpsOnCpuDevice, RmsNormMatchesDirectKernel) {
  auto dev = MakeDevice();
  const int64_t n = 37, c = 700;
  const DType bf = DType::kBF16;
  const auto x = RandomVector(size_t(n * c), 4, -2, 2), w = RandomVector(size_t(c), 5),
             dyv = RandomVector(size_t(n * c), 6), dw0 = RandomVector(size_t(c), 7);
  auto dx = Staged(*dev, bf, {n, c}, x);
  auto dw = Staged(*dev, bf, {c}, w);
  auto dy = Staged(*dev, bf, {n, c});
  auto drstd = Staged(*dev, DType::kF32, {n});
  auto dgrad = Staged(*dev, bf, {n, c}, dyv);
  auto ddx = Staged(*dev, bf, {n, c});
  auto ddw = Staged(*dev, DType::kF32, {c}, dw0);
  ASSERT_TRUE(RmsNormForward(*dev, {dx.tensor(), dw.tensor(), dy.tensor(), drstd.tensor()}).ok());
  ASSERT_TRUE(RmsNormBackward(*dev, {dgrad.tensor(), dx.tensor(), dw.tensor(), drstd.tensor(),
                                     ddx.tensor(), ddw.tensor()})
                  .ok());
  ASSERT_TRUE(dev->Synchronize().ok());

  HostTensor hx(bf, {n, c}, x), hw(bf, {c}, w), hy(bf, {n, c}), hrstd(DType::kF32, {n}),
      hgrad(bf, {n, c}, dyv), hdx(bf, {n, c}), hdw(DType::kF32, {c}, dw0);
  ThreadPool pool(kThreads);
  ASSERT_TRUE(
      cpu::RmsNormForward(pool, {hx.tensor(), hw.tensor(), hy.tensor(), hrstd.tensor()}).ok());
  ASSERT_TRUE(cpu::RmsNormBackward(pool, {hgrad.tensor(), hx.tensor(), hw.tensor(), hrstd.tensor(),
                                          hdx.tensor(), hdw.tensor()})
                  .ok());
  ExpectClose(dy.Download(), hy.Get(), 0, 0, "y");
  ExpectClose(drstd.Download(), hrstd.Get(), 0, 0, "rstd");
  ExpectClose(ddx.Download(), hdx.Get(), 0, 0, "dx");
  ExpectClose(ddw.Download(), hdw.Get(), 0, 0, "dweight");

  // rstd must be f32: the error names it.
  const Status s = RmsNormForward(
      *dev, {dx.tensor(), dw.tensor(), dy.tensor(), dx.tensor().Reshape({n * c}).Rows(0, n)});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rstd"), std::string::npos) << s.ToString();
}

// The CUDA GEMM's scratch, sized without a device: what the planner reserves on GPUs.
TEST(CudaGemmScratch, ZeroForWhatCublasTakesAndAlignedFp32CopiesOtherwise) {
  const DType f32 = DType::kF32, bf = DType::kBF16, f16 = DType::kF16;
  for (const GemmDTypes t :
       {GemmDTypes{f32, f32, f32}, GemmDTypes{bf, bf, bf}, GemmDTypes{bf, bf, f32},
        GemmDTypes{f16, f16, f16}, GemmDTypes{f16, f16, f32}}) {
    EXPECT_TRUE(CudaGemmTakesDirectly(t));
    EXPECT_EQ(CudaGemmScratchBytes(3, 5, 7, t), 0u);
  }
  // A (3 x 7) and C (3 x 5) as fp32: 84 and 60 bytes, each rounded up to 256.
  EXPECT_FALSE(CudaGemmTakesDirectly({bf, f32, f16}));
  EXPECT_EQ(CudaGemmScratchBytes(3, 5, 7, {bf, f32, f16}), 512u);
  // A and B of different dtypes, C f32: fp32 copies of A (1000 x 1000) and B (1000 x 24).
  EXPECT_EQ(CudaGemmScratchBytes(1000, 24, 1000, {f16, bf, f32}), 4000000u + 96000u);
  // C of A's dtype but B f32: fp32 copies of A (2 x 64: 512 bytes) and C (2 x 2: 16 -> 256).
  EXPECT_EQ(CudaGemmScratchBytes(2, 2, 64, {bf, f32, bf}), 512u + 256u);
}

}  // namespace
}  // namespace ferry
