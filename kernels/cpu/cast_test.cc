// CPU cast between f32, bf16 and f16: every pair against dtype.h's scalar conversions
// (round to nearest even), including ties, NaN, infinities and fp16 overflow.
#include "kernels/cpu/cast.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/testing/op_testing.h"

namespace ferry {
namespace {

using testing::HostTensor;

std::vector<float> Values(size_t n) {
  std::vector<float> v = testing::RandomVector(n, 1, -70000, 70000);  // past fp16's range
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            1.00390625f /* bf16 tie */,
                            1.01171875f,
                            65504.0f,
                            65520.0f /* f16 overflow tie */,
                            1e-8f /* f16 subnormal */,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < std::size(specials) && i < n; ++i) v[i] = specials[i];
  return v;
}

bool SameValue(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(CpuCast, EveryPairMatchesScalarConversion) {
  const DType all[] = {DType::kF32, DType::kBF16, DType::kF16};
  ThreadPool pool(3);
  for (int64_t n : {int64_t(1), int64_t(13), int64_t(40013)}) {
    const auto v = Values(size_t(n));
    for (DType from : all) {
      for (DType to : all) {
        HostTensor src(from, {n}, v), dst(to, {n});
        CastArgs a{src.tensor(), dst.tensor()};
        ASSERT_TRUE(ValidateCast(a).ok());
        ASSERT_TRUE(cpu::Cast(pool, a).ok());
        const auto in = src.Get(), out = dst.Get();
        int bad = 0;
        for (size_t i = 0; i < in.size(); ++i) {
          // Exact: the kernel must round exactly as the scalar conversion does.
          if (!SameValue(out[i], RoundTo(to, in[i])) && bad++ < 5) {
            ADD_FAILURE() << DTypeName(from) << "->" << DTypeName(to) << " [" << i << "] " << in[i]
                          << " -> " << out[i] << ", want " << RoundTo(to, in[i]);
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

TEST(CpuCast, RejectsInPlaceDTypeChangeAndCountMismatch) {
  HostTensor a(DType::kF32, {8}), b(DType::kBF16, {7});
  EXPECT_EQ(ValidateCast({a.tensor(), b.tensor()}).code(), StatusCode::kInvalidArgument);
  Tensor alias = a.tensor();
  alias.dtype = DType::kBF16;
  EXPECT_EQ(ValidateCast({a.tensor(), alias}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
