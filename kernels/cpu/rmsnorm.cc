#include "kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "kernels/backend_access.h"
#include "kernels/cpu/cast.h"

namespace ferry::cpu {
namespace {

// xhat rounded to the activations' dtype (the Hugging Face cast), in place on n values.
void RoundLikeInput(DType t, float* v, int64_t n) {
  if (t == DType::kF32) return;
  for (int64_t j = 0; j < n; ++j) v[j] = RoundTo(t, v[j]);
}

}  // namespace

Status RmsNormForward(ThreadPool& pool, const RmsNormForwardArgs& a) {
  const int64_t n = a.x.dim(0), c = a.x.dim(1);
  float* rstd = BackendAccess::Data<float>(a.rstd);
  pool.ParallelFor(n, RowGrain(c), [&](int64_t begin, int64_t end, int) {
    float xs[kStageElems], ws[kStageElems], ys[kStageElems], xhat[kStageElems];
    for (int64_t r = begin; r < end; ++r) {
      const float rs = 1.0f / std::sqrt(RowMoment(a.x, r, c, 0.0f, 2) / float(c) + a.eps);
      rstd[r] = rs;
      for (int64_t j0 = 0; j0 < c; j0 += kStageElems) {
        const int64_t len = std::min(kStageElems, c - j0);
        const float* x = LoadFloats(a.x, r * c + j0, len, xs);
        const float* w = LoadFloats(a.weight, j0, len, ws);
        for (int64_t j = 0; j < len; ++j) xhat[j] = x[j] * rs;
        RoundLikeInput(a.x.dtype, xhat, len);
        float* y = OutputFloats(a.y, r * c + j0, ys);
        for (int64_t j = 0; j < len; ++j) y[j] = w[j] * xhat[j];
        StoreFloats(y, a.y, r * c + j0, len);
      }
    }
  });
  return Status::Ok();
}

Status RmsNormBackward(ThreadPool& pool, const RmsNormBackwardArgs& a) {
  const int64_t n = a.x.dim(0), c = a.x.dim(1);
  const float* rstd = BackendAccess::Data<float>(a.rstd);
  // dw first: dx may alias dy. Column blocks in parallel, rows summed in order.
  pool.ParallelFor(c, 64, [&](int64_t begin, int64_t end, int) {
    float xs[kStageElems], dys[kStageElems], acc[kStageElems], xhat[kStageElems];
    for (int64_t j0 = begin; j0 < end; j0 += kStageElems) {
      const int64_t len = std::min(kStageElems, end - j0);
      std::fill(acc, acc + len, 0.0f);
      for (int64_t r = 0; r < n; ++r) {
        const float* x = LoadFloats(a.x, r * c + j0, len, xs);
        const float* dy = LoadFloats(a.dy, r * c + j0, len, dys);
        for (int64_t j = 0; j < len; ++j) xhat[j] = x[j] * rstd[r];
        RoundLikeInput(a.x.dtype, xhat, len);
        for (int64_t j = 0; j < len; ++j) acc[j] += dy[j] * xhat[j];
      }
      AccumulateFloats(acc, a.dweight, j0, len);
    }
  });
  pool.ParallelFor(n, RowGrain(c), [&](int64_t begin, int64_t end, int) {
    float xs[kStageElems], dys[kStageElems], ws[kStageElems], dxs[kStageElems];
    for (int64_t r = begin; r < end; ++r) {
      const float rs = rstd[r];
      float dot = 0;  // sum of g * xhat
      for (int64_t j0 = 0; j0 < c; j0 += kStageElems) {
        const int64_t len = std::min(kStageElems, c - j0);
        const float* x = LoadFloats(a.x, r * c + j0, len, xs);
        const float* dy = LoadFloats(a.dy, r * c + j0, len, dys);
        const float* w = LoadFloats(a.weight, j0, len, ws);
        for (int64_t j = 0; j < len; ++j) dot += dy[j] * w[j] * x[j];
      }
      const float mean_dot = dot * rs / float(c);
      for (int64_t j0 = 0; j0 < c; j0 += kStageElems) {
        const int64_t len = std::min(kStageElems, c - j0);
        const float* x = LoadFloats(a.x, r * c + j0, len, xs);
        const float* dy = LoadFloats(a.dy, r * c + j0, len, dys);
        const float* w = LoadFloats(a.weight, j0, len, ws);
        float* dx = OutputFloats(a.dx, r * c + j0, dxs);
        for (int64_t j = 0; j < len; ++j) dx[j] = rs * (dy[j] * w[j] - x[j] * rs * mean_dot);
        StoreFloats(dx, a.dx, r * c + j0, len);
      }
    }
  });
  return Status::Ok();
}

}  // namespace ferry::cpu
