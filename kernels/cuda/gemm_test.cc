// The CUDA GEMM (kernels/cuda/gemm.cu, through the Gemm op's dispatcher) against the CPU GEMM,
// element by element: f32/bf16/f16 storage, every transpose, beta 0 and 1, with and without bias,
// mixed dtypes (the converted path with scratch), and the fp16-accumulate variant the probe uses.
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops/gemm.h"
#include "kernels/testing/device_staging.h"
#include "kernels/testing/gpu_testing.h"
#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr int64_t kM = 67, kN = 45, kK = 130;  // odd sizes: no tile or alignment fits exactly

struct Case {
  DType a, b, c, bias;
  bool trans_a, trans_b, with_bias;
  float beta;
  int64_t k = kK;
  std::string Name() const {
    return std::string(DTypeName(a)) + "/" + std::string(DTypeName(b)) + "->" +
           std::string(DTypeName(c)) + (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") +
           " beta=" + std::to_string(int(beta)) +
           (with_bias ? " bias " + std::string(DTypeName(bias)) : "") + " K=" + std::to_string(k);
  }
};

// Relative spacing of a dtype's values (one ulp at 1.0): the error of one rounding to it.
float Ulp(DType t) {
  switch (t) {
    case DType::kBF16:
      return 0x1p-7f;
    case DType::kF16:
      return 0x1p-10f;
    default:
      return 0.0f;  // f32 output: cuBLAS writes the fp32 sum itself, no further rounding
  }
}

class CudaGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FERRY_SKIP_WITHOUT_GPU();
    device_ = testing::CreateTestCudaDevice(64 * kMiB, 4 * kMiB);
    ASSERT_NE(device_, nullptr);
  }

  // Runs one case on the GPU (through `run`, the Gemm op unless given) and on the CPU GEMM, and
  // compares. `accumulate_ulp` is the relative error of one accumulation step (2^-24 for fp32).
  void Check(const Case& t, float accumulate_ulp = 0x1p-24f,
             Status (*run)(CudaDevice&, const GemmArgs&) = nullptr) {
    SCOPED_TRACE(t.Name());
    const Shape sa = t.trans_a ? Shape{t.k, kM} : Shape{kM, t.k};
    const Shape sb = t.trans_b ? Shape{kN, t.k} : Shape{t.k, kN};
    const std::vector<float> a = testing::RandomVector(size_t(kM * t.k), 1),
                             b = testing::RandomVector(size_t(t.k * kN), 2),
                             bias = testing::RandomVector(size_t(kN), 3);
    std::vector<float> c = testing::RandomVector(size_t(kM * kN), 4);
    // beta == 0 must not read C: NaNs there would show in the output.
    if (t.beta == 0) c.assign(c.size(), std::numeric_limits<float>::quiet_NaN());

    testing::DeviceTensor da(*device_, t.a, sa, "a"), db(*device_, t.b, sb, "b"),
        dc(*device_, t.c, {kM, kN}, "c"), dbias(*device_, t.bias, {kN}, "bias");
    da.Upload(a);
    db.Upload(b);
    dc.Upload(c);
    dbias.Upload(bias);
    const size_t scratch_bytes = GemmScratchBytes(*device_, kM, kN, t.k, {t.a, t.b, t.c});
    testing::DeviceTensor ds(*device_, DType::kF32,
                             {int64_t(std::max<size_t>(scratch_bytes, 4) / 4)}, "scratch");
    GemmArgs g{da.tensor(),
               db.tensor(),
               dc.tensor(),
               t.with_bias ? dbias.tensor() : Tensor{},
               scratch_bytes > 0 ? ds.tensor() : Tensor{},
               t.trans_a,
               t.trans_b,
               1.0f,
               t.beta};
    const Status s = run != nullptr ? run(*device_, g) : Gemm(*device_, g);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const std::vector<float> got = dc.Download();

    // The CPU GEMM on the same stored values.
    testing::HostTensor ha(t.a, sa, a), hb(t.b, sb, b), hc(t.c, {kM, kN}, c),
        hbias(t.bias, {kN}, bias);
    const size_t cpu_scratch = cpu::GemmScratchBytes(1, kM, kN, t.k, {t.a, t.b, t.c});
    testing::HostTensor hs(DType::kF32, {int64_t(std::max<size_t>(cpu_scratch, 4) / 4)});
    ThreadPool pool(1);
    ASSERT_TRUE(
        cpu::Gemm(pool,
                  {ha.tensor(), hb.tensor(), hc.tensor(), t.with_bias ? hbias.tensor() : Tensor{},
                   cpu_scratch > 0 ? hs.tensor() : Tensor{}, t.trans_a, t.trans_b, 1.0f, t.beta})
            .ok());
    const std::vector<float> want = hc.Get();

    // Tolerance, per element. Both sides sum the same exact products of the stored inputs in
    // fp32, in different orders: each result is within K * u * sum|a_ik b_kj| of the exact sum
    // (the classic bound for recursive summation, u the unit roundoff), so they differ by at most
    // twice that. Then C is rounded to its dtype: two fp32 values that close may round to
    // neighbouring values, one ulp apart (Ulp(c) * |want|). On CUDA's direct path with a bias,
    // beta * C + bias is rounded to C's dtype once more first (kernels/ops/gemm.h): one more
    // Ulp(c) * (|beta c| + |bias|). f16's subnormal spacing (2^-24) bounds tiny values.
    const std::vector<float> sa_v = testing::Rounded(a, t.a), sb_v = testing::Rounded(b, t.b),
                             sc_v = testing::Rounded(c, t.c),
                             sbias = testing::Rounded(bias, t.bias);
    int bad = 0;
    for (int64_t i = 0; i < kM; ++i) {
      for (int64_t j = 0; j < kN; ++j) {
        double abs_sum = 0;
        for (int64_t k = 0; k < t.k; ++k) {
          const float x = t.trans_a ? sa_v[size_t(k * kM + i)] : sa_v[size_t(i * t.k + k)];
          const float y = t.trans_b ? sb_v[size_t(j * t.k + k)] : sb_v[size_t(k * kN + j)];
          abs_sum += std::fabs(double(x) * double(y));
        }
        const double side = (t.beta != 0 ? std::fabs(sc_v[size_t(i * kN + j)]) : 0.0) +
                            (t.with_bias ? std::fabs(sbias[size_t(j)]) : 0.0);
        const double w = want[size_t(i * kN + j)];
        const double lim = 2.0 * double(t.k) * accumulate_ulp * (abs_sum + side) +
                           Ulp(t.c) * (std::fabs(w) + side) + (t.c == DType::kF16 ? 0x1p-24 : 0.0);
        const double err = std::fabs(double(got[size_t(i * kN + j)]) - w);
        if (!(err <= lim) && bad++ < 5) {
          ADD_FAILURE() << "C[" << i << ", " << j << "]: got " << got[size_t(i * kN + j)]
                        << " want " << w << " (err " << err << " > " << lim << ")";
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }

  std::unique_ptr<CudaDevice> device_;
};

TEST_F(CudaGemmTest, SameDtypeMatchesCpuForEveryTransposeBetaAndBias) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    EXPECT_EQ(GemmScratchBytes(*device_, kM, kN, kK, {t, t, t}), 0u);
    for (int mask = 0; mask < 4; ++mask) {
      for (float beta : {0.0f, 1.0f}) {
        for (bool with_bias : {false, true}) {
          Check({t, t, t, t, bool(mask & 1), bool(mask & 2), with_bias, beta});
        }
      }
    }
  }
}

TEST_F(CudaGemmTest, MixedDtypesMatchCpu) {
  const DType f32 = DType::kF32, bf = DType::kBF16, f16 = DType::kF16;
  // Direct: bf16 inputs into an f32 C (the parameter-gradient GEMM), bias added in fp32.
  EXPECT_EQ(GemmScratchBytes(*device_, kM, kN, kK, {bf, bf, f32}), 0u);
  Check({bf, bf, f32, f32, true, false, true, 1.0f});
  Check({f16, f16, f32, bf, false, true, false, 0.0f});
  // Direct with a bias of another dtype than C: the extra rounding the tolerance allows.
  Check({bf, bf, bf, f32, false, true, true, 0.0f});
  // Converted (scratch): A and B differ, or C is neither f32 nor the inputs' dtype.
  EXPECT_GT(GemmScratchBytes(*device_, kM, kN, kK, {bf, f32, f16}), 0u);
  Check({bf, f32, f16, bf, false, true, true, 1.0f});
  Check({f16, f16, bf, f32, true, true, true, 0.0f});
  Check({f32, f32, bf, bf, false, false, false, 1.0f});
}

TEST_F(CudaGemmTest, EmptyInnerDimensionGivesBetaCPlusBias) {
  const DType f32 = DType::kF32, bf = DType::kBF16;
  Check({f32, f32, f32, f32, false, false, true, 1.0f, 0});
  Check({bf, bf, bf, bf, true, false, true, 0.0f, 0});
  Check({bf, f32, bf, f32, false, true, false, 1.0f, 0});
}

TEST_F(CudaGemmTest, MissingScratchForConvertedPathIsRejected) {
  testing::DeviceTensor da(*device_, DType::kBF16, {kM, kK}, "a"),
      db(*device_, DType::kF32, {kK, kN}, "b"), dc(*device_, DType::kF32, {kM, kN}, "c");
  const Status s = Gemm(*device_, {da.tensor(), db.tensor(), dc.tensor()});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("scratch"), std::string::npos) << s.ToString();
  EXPECT_TRUE(device_->Synchronize().ok());
}

TEST_F(CudaGemmTest, Fp16AccumulateMatchesCpuWithinFp16Sums) {
  // fp16 accumulation: each step rounds to fp16 (u = 2^-11), so the same summation bound holds
  // with 2^-11 in place of fp32's 2^-24; a short K (8) keeps that bound far below the values'
  // spread, so a wrong operand or transpose would still show.
  const DType f16 = DType::kF16;
  for (int mask = 0; mask < 4; ++mask) {
    Check({f16, f16, f16, f16, bool(mask & 1), bool(mask & 2), false, 0.0f, 8}, 0x1p-11f,
          cuda::GemmF16Accumulate);
  }
  testing::DeviceTensor da(*device_, DType::kBF16, {kM, kK}, "a"),
      db(*device_, DType::kBF16, {kK, kN}, "b"), dc(*device_, DType::kBF16, {kM, kN}, "c");
  EXPECT_EQ(cuda::GemmF16Accumulate(*device_, {da.tensor(), db.tensor(), dc.tensor()}).code(),
            StatusCode::kInvalidArgument);
}

// A device made for `--dtype fp16acc` runs the Gemm op's all-f16 products with fp16 accumulation
// (within the fp16 summation bound, short K as above), bias and beta included; a product into an
// f32 C keeps fp32 accumulation (the fp32 bound holds at the full K).
TEST_F(CudaGemmTest, Fp16AccumulateDeviceAccumulatesAllF16GemmsInFp16) {
  CudaDeviceOptions o;
  o.memory_bytes = 64 * kMiB;
  o.cublas_workspace_bytes = 4 * kMiB;
  o.gemm_f16_accumulate = true;
  Result<std::unique_ptr<CudaDevice>> d = CudaDevice::Create(o);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  device_ = std::move(d).value();
  ASSERT_TRUE(device_->gemm_f16_accumulate());
  const DType f16 = DType::kF16, f32 = DType::kF32;
  for (int mask = 0; mask < 4; ++mask) {
    Check({f16, f16, f16, f16, bool(mask & 1), bool(mask & 2), false, 0.0f, 8}, 0x1p-11f);
  }
  Check({f16, f16, f16, f16, false, true, true, 1.0f, 8}, 0x1p-11f);
  Check({f16, f16, f32, f32, true, false, false, 1.0f, kK});
}

}  // namespace
}  // namespace ferry

#else  // !FERRY_WITH_CUDA

TEST(CudaGemmTest, NotBuilt) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // FERRY_WITH_CUDA
