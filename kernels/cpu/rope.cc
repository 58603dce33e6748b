#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>

#include "kernels/backend_access.h"
#include "kernels/ops/rope_math.h"

namespace ferry::cpu {
namespace {

// Rotates every head of tokens [begin, end) by +angle (sign = 1) or -angle
// (sign = -1).
template <typename T>
void RotateTokens(const RopeArgs& a, float sign, int64_t begin, int64_t end) {
  const T* in = BackendAccess::Data<const T>(a.in);                      // (N, H*D)
  T* out = BackendAccess::Data<T>(a.out);                                // (N, H*D)
  const int32_t* pos = BackendAccess::Data<const int32_t>(a.positions);  // (N)
  const float* table =
      a.inv_freq.data.is_null() ? nullptr : BackendAccess::Data<const float>(a.inv_freq);
  const int64_t d = a.head_dim, half = a.rotary() / 2, row = a.num_heads * d;
  float inv_freq[kRopeMaxHeadDim / 2];
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = table ? table[i] : RopeInverseFrequency(a.theta, i, a.rotary());
  }
  float cos_t[kRopeMaxHeadDim / 2], sin_t[kRopeMaxHeadDim / 2];
  for (int64_t n = begin; n < end; ++n) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = RopeAngle(pos[n], inv_freq[i]);
      cos_t[i] = float(std::cos(angle));
      sin_t[i] = sign * float(std::sin(angle));
    }
    for (int64_t h = 0; h < a.num_heads; ++h) {
      const T* x = in + n * row + h * d;
      T* y = out + n * row + h * d;
      for (int64_t i = 0; i < half; ++i) {  // reads both halves before writing: in place is safe
        const float x1 = ToFloat(x[i]), x2 = ToFloat(x[i + half]);
        y[i] = FromFloat<T>(x1 * cos_t[i] - x2 * sin_t[i]);
        y[i + half] = FromFloat<T>(x2 * cos_t[i] + x1 * sin_t[i]);
      }
      if (y != x) {
        for (int64_t i = 2 * half; i < d; ++i) y[i] = x[i];
      }
    }
  }
}

template <typename T>
Status Rotate(ThreadPool& pool, const RopeArgs& a, float sign) {
  const int64_t n = a.in.dim(0);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, a.num_heads * a.head_dim));
  pool.ParallelFor(n, grain,
                   [&](int64_t begin, int64_t end, int) { RotateTokens<T>(a, sign, begin, end); });
  return Status::Ok();
}

Status RotateAny(ThreadPool& pool, const RopeArgs& a, float sign) {
  switch (a.in.dtype) {
    case DType::kF32:
      return Rotate<float>(pool, a, sign);
    case DType::kBF16:
      return Rotate<bf16>(pool, a, sign);
    case DType::kF16:
      return Rotate<f16>(pool, a, sign);
    default:
      return Status::InvalidArgument("rope: unsupported dtype " + a.in.ToString());
  }
}

}  // namespace

Status RopeForward(ThreadPool& pool, const RopeArgs& a) { return RotateAny(pool, a, 1.0f); }
Status RopeBackward(ThreadPool& pool, const RopeArgs& a) { return RotateAny(pool, a, -1.0f); }

}  // namespace ferry::cpu
