#include "kernels/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace ferry {
namespace {

// Reference rounding by exhaustive neighbour search: the representable value nearest to x, ties
// to the even bit pattern. Independent of the bit tricks in dtype.h.
template <typename T, typename ToF>
uint16_t NearestByScan(float x, ToF to_float, uint16_t guess) {
  uint16_t best = guess;
  double best_err = std::fabs(double(to_float(T{guess})) - double(x));
  for (int d = -2; d <= 2; ++d) {
    const uint16_t c = uint16_t(guess + d);
    const float v = to_float(T{c});
    if (std::isnan(v)) continue;
    if (std::signbit(v) != std::signbit(x) && v != 0.0f) continue;
    const double err = std::fabs(double(v) - double(x));
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

TEST(DType, Sizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(ParseDType("bf16").value(), DType::kBF16);
  EXPECT_EQ(ParseDType("u8").value(), DType::kU8);
  EXPECT_EQ(DTypeName(DType::kU8), "u8");
  EXPECT_FALSE(ParseDType("int8").ok());
}

// The stored side of a bulk conversion may start at any byte (a safetensors file's tensors do):
// at every offset 0-3 the values equal the aligned conversion's, bit for bit, both ways (UBSan's
// alignment check runs this in the sanitizer build).
TEST(DType, BulkConversionsTakeStoredArraysAtAnyByte) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  constexpr size_t n = 37;
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  for (DType t : {DType::kBF16, DType::kF16, DType::kI32, DType::kU8, DType::kF32}) {
    const size_t es = DTypeSize(t);
    std::vector<std::byte> aligned(n * es);
    ConvertFromFloat(values.data(), t, aligned.data(), n);
    std::vector<float> want(n);
    ConvertToFloat(t, aligned.data(), want.data(), n);
    for (size_t offset = 0; offset < 4; ++offset) {
      std::vector<std::byte> buffer(n * es + 8);
      ConvertFromFloat(values.data(), t, buffer.data() + offset, n);
      EXPECT_EQ(std::memcmp(buffer.data() + offset, aligned.data(), n * es), 0)
          << DTypeName(t) << " stored at +" << offset;
      std::vector<float> got(n);
      ConvertToFloat(t, buffer.data() + offset, got.data(), n);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
          << DTypeName(t) << " loaded from +" << offset;
    }
  }
}

// u8 is byte storage (packed NF4 codes), not a float format: the conversions carry its values
// exactly, as they do i32's.
TEST(DType, U8ConvertsItsValuesExactly) {
  const uint8_t bytes[4] = {0, 1, 127, 255};
  float f[4];
  ConvertToFloat(DType::kU8, bytes, f, 4);
  EXPECT_EQ(f[0], 0.0f);
  EXPECT_EQ(f[1], 1.0f);
  EXPECT_EQ(f[2], 127.0f);
  EXPECT_EQ(f[3], 255.0f);
  uint8_t back[4] = {9, 9, 9, 9};
  ConvertFromFloat(f, DType::kU8, back, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], bytes[i]) << i;
  EXPECT_EQ(RoundTo(DType::kU8, 200.0f), 200.0f);
  EXPECT_EQ(DTypeEpsilon(DType::kU8), 0.0f);
}

TEST(DType, BF16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f).bits, FloatToBF16(1.0f).bits);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): goes up.
  EXPECT_EQ(BF16ToFloat(FloatToBF16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(BF16ToFloat(FloatToBF16(std::numeric_limits<float>::infinity()))));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = u(rng) * std::ldexp(1.0f, int(rng() % 60) - 30);
    const uint16_t got = FloatToBF16(x).bits;
    EXPECT_EQ(got, NearestByScan<bf16>(x, BF16ToFloat, got)) << x;
  }
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float v = F16ToFloat(f16{uint16_t(b)});
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(v))));
      continue;
    }
    EXPECT_EQ(FloatToF16(v).bits, b) << b;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  EXPECT_EQ(F16ToFloat(FloatToF16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(F16ToFloat(FloatToF16(65520.0f))));
  EXPECT_EQ(F16ToFloat(FloatToF16(65519.0f)), 65504.0f);
  EXPECT_EQ(F16ToFloat(FloatToF16(0x1p-24f)), 0x1p-24f);    // smallest subnormal
  EXPECT_EQ(F16ToFloat(FloatToF16(0x1p-25f)), 0.0f);        // tie with zero: to even (zero)
  EXPECT_EQ(F16ToFloat(FloatToF16(0x1.8p-25f)), 0x1p-24f);  // above the tie: up
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = u(rng) * std::ldexp(1.0f, int(rng() % 40) - 26);
    const uint16_t got = FloatToF16(x).bits;
    EXPECT_EQ(got, NearestByScan<f16>(x, F16ToFloat, got)) << x;
  }
}

}  // namespace
}  // namespace ferry
