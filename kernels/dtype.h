// Storage dtypes and their conversions. Math is always fp32; bf16 and fp16 are storage formats.
// Narrowing casts round to nearest, ties to even; NaN stays NaN (quiet), infinities stay infinite,
// fp16 overflow becomes infinity and fp16 underflow goes through subnormals to signed zero.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kernels/status.h"

namespace ferry {

// kI32 is index storage (token ids, position ids, document ids) and kU8 byte storage (packed 4-bit
// codes and 8-bit indices of quantized weights, kernels/nf4.h); neither is a float format: the
// float conversions below convert their values exactly (i32 up to 2^24; u8 always, narrowing
// truncates toward zero and wraps like a C cast; tests stage values through them).
enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kI32 = 3, kU8 = 4 };

constexpr size_t DTypeSize(DType t) {
  return t == DType::kF32 || t == DType::kI32 ? 4 : t == DType::kU8 ? 1 : 2;
}
std::string_view DTypeName(DType t);              // "f32", "bf16", "f16", "i32", "u8"
Result<DType> ParseDType(std::string_view name);  // accepts the names above and "fp32"/"fp16"/...

// Unit roundoff (half an ulp at 1.0) of a storage dtype: tolerances are derived from it.
// (0 for kI32 and kU8.)
constexpr float DTypeEpsilon(DType t) {
  return t == DType::kF32    ? 5.96e-8f
         : t == DType::kBF16 ? 3.90625e-3f
         : t == DType::kF16  ? 4.8828125e-4f
                             : 0.0f;
}

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float BF16ToFloat(bf16 v) { return std::bit_cast<float>(uint32_t(v.bits) << 16); }

inline bf16 FloatToBF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16{uint16_t(u >> 16)};
}

float F16ToFloat(f16 v);
f16 FloatToF16(float f);

// Storage-generic loads and stores for kernels that are written once for all dtypes.
inline float ToFloat(float v) { return v; }
inline float ToFloat(bf16 v) { return BF16ToFloat(v); }
inline float ToFloat(f16 v) { return F16ToFloat(v); }
template <typename T>
T FromFloat(float v);
template <>
inline float FromFloat<float>(float v) {
  return v;
}
template <>
inline bf16 FromFloat<bf16>(float v) {
  return FloatToBF16(v);
}
template <>
inline f16 FromFloat<f16>(float v) {
  return FloatToF16(v);
}

// Rounds an fp32 value through a storage dtype and back (what storing it would keep).
inline float RoundTo(DType t, float v) {
  switch (t) {
    case DType::kF32:
      return v;
    case DType::kBF16:
      return BF16ToFloat(FloatToBF16(v));
    case DType::kF16:
      return F16ToFloat(FloatToF16(v));
    case DType::kI32:
      return float(int32_t(v));
    case DType::kU8:
      return float(uint8_t(int32_t(v)));
  }
  return v;
}

// Bulk conversions between host arrays (n elements). The stored side (src of ConvertToFloat,
// dst of ConvertFromFloat) may start at any byte: its elements are loaded and stored through
// memcpy, which compiles to the same plain loads and stores (bf16 to f32 measured no slower).
void ConvertToFloat(DType src_type, const void* src, float* dst, size_t n);
void ConvertFromFloat(const float* src, DType dst_type, void* dst, size_t n);

}  // namespace ferry
