// Element-wise math on 4-float vectors (GCC/Clang vector extensions: SSE2 on x86-64, NEON on
// arm64, the baseline of every build, so no run-time dispatch), for the CPU kernels' activation
// functions, where a scalar libm call per element costs more than the rest of the pass.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

namespace ferry::cpu {

typedef float VecF4 __attribute__((vector_size(16)));
typedef int32_t VecI4 __attribute__((vector_size(16)));

inline VecF4 SplatF4(float x) { return VecF4{} + x; }

// e^x per lane, relative error below 2.3e-7 for x in [-87, 88] (Cephes' expf:
// x = n ln2 + r with |r| <= ln2 / 2, a degree-7 polynomial for e^r, then the exponent bits of
// 2^n). Inputs are clamped to [-87.3, 88], so the result stays finite and normal: e^x for
// smaller x is returned as ~1.2e-38 instead of a subnormal or zero.
inline VecF4 ExpF4(VecF4 x) {
  const VecF4 hi = SplatF4(88.0f), lo = SplatF4(-87.3f);
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  // n = floor(x log2(e) + 1/2), from truncation corrected downwards for negative values.
  const VecF4 fx = x * 1.44269504088896341f + 0.5f;
  VecI4 n = __builtin_convertvector(fx, VecI4);
  VecF4 fn = __builtin_convertvector(n, VecF4);
  const VecI4 over = fn > fx;  // -1 where truncation rounded up
  n += over;
  fn = __builtin_convertvector(n, VecF4);
  // r = x - n ln2, with ln2 split in two so n * C1 is exact.
  const VecF4 r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
  VecF4 p = SplatF4(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const VecI4 bits = (n + 127) << 23;  // 2^n, n in [-126, 127]
  VecF4 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// out[i] = fn(a[i], b[i]) (b[i] = 0 without b) for i < n, computed in groups of 4 lanes; the last
// partial group is padded with zeros and only its n % 4 results are stored. out may alias a or b.
template <typename Fn>
void MapF4(int64_t n, float* out, const Fn& fn, const float* a, const float* b = nullptr) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    VecF4 va, vb{};
    std::memcpy(&va, a + i, sizeof(va));
    if (b != nullptr) std::memcpy(&vb, b + i, sizeof(vb));
    const VecF4 r = fn(va, vb);
    std::memcpy(out + i, &r, sizeof(r));
  }
  if (i < n) {
    const size_t rest = size_t(n - i) * sizeof(float);
    VecF4 va{}, vb{};
    std::memcpy(&va, a + i, rest);
    if (b != nullptr) std::memcpy(&vb, b + i, rest);
    const VecF4 r = fn(va, vb);
    std::memcpy(out + i, &r, rest);
  }
}

}  // namespace ferry::cpu
