// Test helper (header-only; tests only, built with CUDA): runs one op through its dispatcher on a
// CudaDevice and on a CpuDevice with the same stored inputs, and compares the results element by
// element with tolerances derived from the dtypes (kernels/cuda/*_test.cc).
//
// How the tolerances are derived. Both sides compute in fp32 from the same stored values and
// round each output once, so they differ by
//   (a) one spacing of the output's dtype at the value, when two fp32 results that close round to
//       neighbours: Spacing(out) * |want| (Tolerance adds it);
//   (b) for sums, the order of summation: an fp32 sum of n terms is within n * 2^-24 * sum|terms|
//       of the exact sum (the recursive summation bound), so two orders differ by twice that;
//   (c) where a kernel rounds an intermediate to a storage dtype (RMSNorm's xhat), one spacing of
//       that dtype times the intermediate's magnitude;
//   (d) for exp/erf/cos/sin, the libraries' few-ulp differences: kLibrary (32 fp32 ulps, far
//       below any formula error) times the magnitude of the terms.
// f16's subnormal spacing 2^-24 bounds tiny values (Floor). Where both sides round identical fp32
// operations in the same order (residual adds, AdamW), the results must match exactly.
#pragma once

#ifdef FERRY_WITH_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_device.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/testing/device_staging.h"
#include "kernels/testing/gpu_testing.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {

inline constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16, kF16 = DType::kF16;
inline constexpr double kF32Unit = 0x1p-24;  // fp32 unit roundoff, for (b)
inline constexpr double kLibrary = 0x1p-18;  // (d)

// Spacing of a dtype's values relative to the value (twice the unit roundoff): (a) and (c).
inline double Spacing(DType t) { return 2.0 * double(DTypeEpsilon(t)); }
// Absolute floor: f16's subnormal spacing; nothing for the others.
inline double Floor(DType t) { return t == DType::kF16 ? 0x1p-24 : 0.0; }

inline std::string Name(DType t) { return std::string(DTypeName(t)); }

// n random values in [lo, hi), as stored in dtype t.
inline std::vector<float> StoredRandom(DType t, int64_t n, uint64_t seed, float lo = -1,
                                       float hi = 1) {
  return Rounded(RandomVector(size_t(n), seed, lo, hi), t);
}

// Rows x hidden sizes for the row ops: single row and column, odd sizes below and above a warp,
// a block and a column tile.
struct RowShape {
  int64_t rows, cols;
};
inline const std::vector<RowShape> kRowShapes = {{1, 1},   {3, 7},    {65, 33},
                                                 {3, 257}, {2, 1000}, {65, 1000}};

// One tensor on both devices, filled with the same values (rounded to its dtype).
class Twin {
 public:
  Twin(Device& gpu, Device& cpu, DType t, Shape shape, const std::string& name,
       const std::vector<float>& values)
      : gpu_(gpu, t, shape, name), cpu_(cpu, t, shape, name) {
    gpu_.Upload(values);
    cpu_.Upload(values);
  }
  Tensor On(bool gpu) const { return gpu ? gpu_.tensor() : cpu_.tensor(); }
  std::vector<float> Gpu() { return gpu_.Download(); }
  std::vector<float> Cpu() { return cpu_.Download(); }

 private:
  DeviceTensor gpu_, cpu_;
};

// Expects |got - want| <= tol[i] element by element (NaN fails); reports the first few misses.
inline void ExpectWithin(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(tol.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    if (!(err <= tol[i]) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i] << " (err "
                    << err << " > " << tol[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements off";
}

inline void ExpectExact(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what) {
  ExpectWithin(got, want, std::vector<double>(want.size(), 0.0), what);
}

// Per element: (a) Spacing(out) |want| + slack * scale[i] + Floor(out), where slack * scale
// bounds (b), (c) and (d) for that element.
inline std::vector<double> Tolerance(DType out, const std::vector<float>& want,
                                     const std::vector<double>& scale, double slack) {
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    tol[i] = Spacing(out) * std::fabs(double(want[i])) + slack * scale[i] + Floor(out);
  }
  return tol;
}

// Fixture: a GPU device and a CPU device (skipped without a GPU).
class CudaVsCpuTest : public ::testing::Test {
 protected:
  static constexpr size_t kMiB = size_t(1) << 20;

  void SetUp() override {
    FERRY_SKIP_WITHOUT_GPU();
    gpu_ = CreateTestCudaDevice(64 * kMiB, 4 * kMiB);
    ASSERT_NE(gpu_, nullptr);
    CpuDeviceOptions c;
    c.memory_bytes = 64 * kMiB;
    c.compute_threads = 2;
    auto cpu = CpuDevice::Create(c);
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
    cpu_ = std::move(cpu).value();
  }

  Twin Make(DType t, Shape shape, const std::string& name, const std::vector<float>& values) {
    return Twin(*gpu_, *cpu_, t, shape, name, values);
  }
  Twin Zeros(DType t, Shape shape, const std::string& name) {
    return Make(t, shape, name, std::vector<float>(size_t(shape.numel()), 0.0f));
  }

  // Runs `op` on both devices with the arguments args(true) (GPU) and args(false) (CPU), and
  // waits for both.
  template <typename Args>
  void RunBoth(Status (*op)(Device&, const Args&), const std::function<Args(bool)>& args) {
    const Status g = op(*gpu_, args(true));
    ASSERT_TRUE(g.ok()) << g.ToString();
    const Status c = op(*cpu_, args(false));
    ASSERT_TRUE(c.ok()) << c.ToString();
    const Status gs = gpu_->Synchronize();
    ASSERT_TRUE(gs.ok()) << gs.ToString();
    const Status cs = cpu_->Synchronize();
    ASSERT_TRUE(cs.ok()) << cs.ToString();
  }

  std::unique_ptr<CudaDevice> gpu_;
  std::unique_ptr<CpuDevice> cpu_;
};

}  // namespace ferry::testing

#endif  // FERRY_WITH_CUDA
