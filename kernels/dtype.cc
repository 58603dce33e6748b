#include "kernels/dtype.h"

#include <cstring>
#include <string>

namespace ferry {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "F32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::kBF16;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "F16") return DType::kF16;
  if (name == "i32" || name == "int32" || name == "I32") return DType::kI32;
  if (name == "u8" || name == "uint8" || name == "U8") return DType::kU8;
  return Status::InvalidArgument("unknown dtype '" + std::string(name) +
                                 "': use f32, bf16, f16, i32 or u8");
}

float F16ToFloat(f16 v) {
  const uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
  } else if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

f16 FloatToF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};   // NaN
  if (absu >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // >= 65520 rounds to inf
  const int32_t exp = int32_t(absu >> 23) - 127;
  if (exp >= -14) {  // normal f16
    uint32_t mant = absu & 0x7fffffu;
    uint32_t h = (uint32_t(exp + 15) << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carries into exponent correctly
    return f16{uint16_t(sign | h)};
  }
  if (exp < -25) return f16{sign};  // below half the smallest subnormal
  // Subnormal: value = mant_full * 2^(exp-23); f16 subnormal unit is 2^-24.
  const uint32_t mant_full = (absu & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 1;  // 14..24: bits to drop so the unit becomes 2^-24
  uint32_t h = mant_full >> shift;
  const uint32_t rem = mant_full & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return f16{uint16_t(sign | h)};
}

namespace {

// One element at byte address p, and its store: memcpy, which compiles to a plain load or store,
// so the arrays need no alignment (a safetensors file's tensors start at any byte).
template <typename T>
T LoadAt(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void StoreAt(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

}  // namespace

void ConvertToFloat(DType src_type, const void* src, float* dst, size_t n) {
  if (n == 0) return;
  const auto* s = static_cast<const std::byte*>(src);
  switch (src_type) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(LoadAt<bf16>(s + 2 * i));
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToFloat(LoadAt<f16>(s + 2 * i));
      return;
    case DType::kI32:
      for (size_t i = 0; i < n; ++i) dst[i] = float(LoadAt<int32_t>(s + 4 * i));
      return;
    case DType::kU8:
      for (size_t i = 0; i < n; ++i) dst[i] = float(uint8_t(s[i]));
      return;
  }
}

void ConvertFromFloat(const float* src, DType dst_type, void* dst, size_t n) {
  if (n == 0) return;
  auto* d = static_cast<std::byte*>(dst);
  switch (dst_type) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) StoreAt(d + 2 * i, FloatToBF16(src[i]));
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) StoreAt(d + 2 * i, FloatToF16(src[i]));
      return;
    case DType::kI32:
      for (size_t i = 0; i < n; ++i) StoreAt(d + 4 * i, int32_t(src[i]));
      return;
    case DType::kU8:
      for (size_t i = 0; i < n; ++i) StoreAt(d + i, uint8_t(int32_t(src[i])));
      return;
  }
}

}  // namespace ferry
