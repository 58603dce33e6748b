#include "kernels/cpu/gelu.h"

#include <cmath>

#include "kernels/cpu/cast.h"
#include "kernels/cpu/vec_math.h"

namespace ferry::cpu {
namespace {

// u(v) = sqrt(2 / pi) (v + 0.044715 v^3), the argument of tanh in the tanh approximation.
inline VecF4 TanhArgument(VecF4 v) { return kGeluSqrt2OverPi * (v + kGeluCubic * v * v * v); }

void ForwardPiece(GeluApprox approx, const float* x, float* y, int64_t n) {
  if (approx == GeluApprox::kTanh) {
    // 0.5 v (1 + tanh u) = v sigmoid(2u) = v / (1 + e^-2u): no cancellation for v << 0.
    MapF4(
        n, y, [](VecF4 v, VecF4) { return v / (1.0f + ExpF4(TanhArgument(v) * -2.0f)); }, x);
  } else {
    for (int64_t j = 0; j < n; ++j) y[j] = 0.5f * x[j] * (1.0f + std::erf(x[j] * kGeluSqrtHalf));
  }
}

void BackwardPiece(GeluApprox approx, const float* x, const float* dy, float* dx, int64_t n) {
  if (approx == GeluApprox::kTanh) {
    // With s = sigmoid(2u) = (1 + tanh u) / 2: 1 - tanh^2 u = 4 s (1 - s), so
    // d/dv [0.5 v (1 + tanh u)] = s + 2 v s (1 - s) u'(v).
    auto grad = [](VecF4 v, VecF4 g) {
      const VecF4 s = 1.0f / (1.0f + ExpF4(TanhArgument(v) * -2.0f));
      const VecF4 du = kGeluSqrt2OverPi * (1.0f + (3.0f * kGeluCubic) * v * v);
      return g * (s + 2.0f * v * s * (1.0f - s) * du);
    };
    MapF4(n, dx, grad, x, dy);
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const float v = x[j];
      const float d = 0.5f * (1.0f + std::erf(v * kGeluSqrtHalf)) +
                      v * std::exp(-0.5f * v * v) * kGeluInvSqrt2Pi;
      dx[j] = dy[j] * d;
    }
  }
}

}  // namespace

Status GeluForward(ThreadPool& pool, const GeluForwardArgs& a) {
  ParallelPieces(pool, a.x.numel(), [&](int64_t i, int64_t len) {
    float xs[kStageElems], ys[kStageElems];
    const float* x = LoadFloats(a.x, i, len, xs);
    float* y = OutputFloats(a.y, i, ys);
    ForwardPiece(a.approx, x, y, len);
    StoreFloats(y, a.y, i, len);
  });
  return Status::Ok();
}

Status GeluBackward(ThreadPool& pool, const GeluBackwardArgs& a) {
  ParallelPieces(pool, a.x.numel(), [&](int64_t i, int64_t len) {
    float xs[kStageElems], dys[kStageElems], dxs[kStageElems];
    const float* x = LoadFloats(a.x, i, len, xs);
    const float* dy = LoadFloats(a.dy, i, len, dys);
    float* dx = OutputFloats(a.dx, i, dxs);
    BackwardPiece(a.approx, x, dy, dx, len);
    StoreFloats(dx, a.dx, i, len);
  });
  return Status::Ok();
}

}  // namespace ferry::cpu
