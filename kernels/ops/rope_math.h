// RoPE's angle arithmetic, shared by the reference (kernels/ref/rope.h) and the
// kernels so that both rotate by bit-identical fp32 angles. It follows Hugging
// Face's LlamaRotaryEmbedding:
//   inv_freq[i] = 1 / theta^(2i / R)    in fp32: (2i as fp32) / R, powf,
//   then 1.0f / that angle(p, i) = float(p) * inv_freq[i] in fp32 (HF's fp32
//   matmul of inv_freq by position ids)
// where R is the rotary dimension (head_dim unless partial rotary). cos/sin of
// that fp32 angle are taken by the caller (kernels: fp32 results of a double
// evaluation; HF then casts cos/sin to the activation dtype, ferry keeps them
// fp32, which is the more accurate of the two). Header-only, no state.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace ferry {

inline float RopeInverseFrequency(float theta, int64_t i, int64_t rotary_dim) {
  const float exponent = float(2 * i) / float(rotary_dim);
  return 1.0f / std::pow(theta, exponent);  // float overload: powf, as torch's fp32 pow
}

// The rotary_dim/2 inverse frequencies HF computes for a plain (unscaled) RoPE.
inline std::vector<float> RopeInverseFrequencies(float theta, int64_t rotary_dim) {
  std::vector<float> f(size_t(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i)
    f[size_t(i)] = RopeInverseFrequency(theta, i, rotary_dim);
  return f;
}

inline float RopeAngle(int32_t position, float inv_freq) { return float(position) * inv_freq; }

}  // namespace ferry
