#include "kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>

#include "kernels/backend_access.h"
#include "kernels/cpu/cast.h"

namespace ferry::cpu {

Status LayerNormForward(ThreadPool& pool, const LayerNormForwardArgs& a) {
  const int64_t n = a.x.dim(0), c = a.x.dim(1);
  float* mean = BackendAccess::Data<float>(a.mean);
  float* rstd = BackendAccess::Data<float>(a.rstd);
  pool.ParallelFor(n, RowGrain(c), [&](int64_t begin, int64_t end, int) {
    float xs[kStageElems], ws[kStageElems], bs[kStageElems], ys[kStageElems];
    for (int64_t r = begin; r < end; ++r) {
      const float m = RowMoment(a.x, r, c, 0.0f, 1) / float(c);
      const float rs = 1.0f / std::sqrt(RowMoment(a.x, r, c, m, 2) / float(c) + a.eps);
      mean[r] = m;
      rstd[r] = rs;
      for (int64_t j0 = 0; j0 < c; j0 += kStageElems) {
        const int64_t len = std::min(kStageElems, c - j0);
        const float* x = LoadFloats(a.x, r * c + j0, len, xs);
        const float* w = LoadFloats(a.weight, j0, len, ws);
        const float* b = LoadFloats(a.bias, j0, len, bs);
        float* y = OutputFloats(a.y, r * c + j0, ys);
        for (int64_t j = 0; j < len; ++j) y[j] = (x[j] - m) * rs * w[j] + b[j];
        StoreFloats(y, a.y, r * c + j0, len);
      }
    }
  });
  return Status::Ok();
}

Status LayerNormBackward(ThreadPool& pool, const LayerNormBackwardArgs& a) {
  const int64_t n = a.x.dim(0), c = a.x.dim(1);
  const float* mean = BackendAccess::Data<float>(a.mean);
  const float* rstd = BackendAccess::Data<float>(a.rstd);
  // dw and db first: dx may alias dy. Column blocks in parallel, rows summed in order.
  pool.ParallelFor(c, 64, [&](int64_t begin, int64_t end, int) {
    float xs[kStageElems], dys[kStageElems], acc_w[kStageElems], acc_b[kStageElems];
    for (int64_t j0 = begin; j0 < end; j0 += kStageElems) {
      const int64_t len = std::min(kStageElems, end - j0);
      std::fill(acc_w, acc_w + len, 0.0f);
      std::fill(acc_b, acc_b + len, 0.0f);
      for (int64_t r = 0; r < n; ++r) {
        const float* x = LoadFloats(a.x, r * c + j0, len, xs);
        const float* dy = LoadFloats(a.dy, r * c + j0, len, dys);
        const float m = mean[r], rs = rstd[r];
        for (int64_t j = 0; j < len; ++j) {
          acc_w[j] += dy[j] * ((x[j] - m) * rs);
          acc_b[j] += dy[j];
        }
      }
      AccumulateFloats(acc_w, a.dweight, j0, len);
      AccumulateFloats(acc_b, a.dbias, j0, len);
    }
  });
  pool.ParallelFor(n, RowGrain(c), [&](int64_t begin, int64_t end, int) {
    float xs[kStageElems], dys[kStageElems], ws[kStageElems], dxs[kStageElems];
    for (int64_t r = begin; r < end; ++r) {
      const float m = mean[r], rs = rstd[r];
      float sum_g = 0, sum_gx = 0;  // sums of g and g * xhat
      for (int64_t j0 = 0; j0 < c; j0 += kStageElems) {
        const int64_t len = std::min(kStageElems, c - j0);
        const float* x = LoadFloats(a.x, r * c + j0, len, xs);
        const float* dy = LoadFloats(a.dy, r * c + j0, len, dys);
        const float* w = LoadFloats(a.weight, j0, len, ws);
        for (int64_t j = 0; j < len; ++j) {
          const float g = dy[j] * w[j];
          sum_g += g;
          sum_gx += g * ((x[j] - m) * rs);
        }
      }
      const float mean_g = sum_g / float(c), mean_gx = sum_gx / float(c);
      for (int64_t j0 = 0; j0 < c; j0 += kStageElems) {
        const int64_t len = std::min(kStageElems, c - j0);
        const float* x = LoadFloats(a.x, r * c + j0, len, xs);
        const float* dy = LoadFloats(a.dy, r * c + j0, len, dys);
        const float* w = LoadFloats(a.weight, j0, len, ws);
        float* dx = OutputFloats(a.dx, r * c + j0, dxs);
        for (int64_t j = 0; j < len; ++j) {
          dx[j] = rs * (dy[j] * w[j] - mean_g - (x[j] - m) * rs * mean_gx);
        }
        StoreFloats(dx, a.dx, r * c + j0, len);
      }
    }
  });
  return Status::Ok();
}

}  // namespace ferry::cpu
