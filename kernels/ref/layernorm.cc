#include "kernels/ref/layernorm.h"

#include <cmath>

namespace ferry::ref {

template <typename R>
void LayerNormForward(int64_t n, int64_t c, const R* x, const R* w, const R* b, R eps, R* y,
                      R* mean, R* rstd) {
  for (int64_t i = 0; i < n; ++i) {
    const R* xr = x + i * c;
    R m = 0;
    for (int64_t j = 0; j < c; ++j) m += xr[j];
    m /= R(c);
    R var = 0;
    for (int64_t j = 0; j < c; ++j) var += (xr[j] - m) * (xr[j] - m);
    const R r = R(1) / std::sqrt(var / R(c) + eps);
    for (int64_t j = 0; j < c; ++j) y[i * c + j] = (xr[j] - m) * r * w[j] + b[j];
    mean[i] = m;
    rstd[i] = r;
  }
}

template <typename R>
void LayerNormBackward(int64_t n, int64_t c, const R* dy, const R* x, const R* w, const R* mean,
                       const R* rstd, R* dx, R* dw, R* db) {
  for (int64_t i = 0; i < n; ++i) {
    const R* xr = x + i * c;
    const R* dyr = dy + i * c;
    R sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < c; ++j) {
      const R xhat = (xr[j] - mean[i]) * rstd[i];
      sum_g += dyr[j] * w[j];
      sum_gx += dyr[j] * w[j] * xhat;
    }
    for (int64_t j = 0; j < c; ++j) {
      const R xhat = (xr[j] - mean[i]) * rstd[i];
      dx[i * c + j] = rstd[i] * (dyr[j] * w[j] - sum_g / R(c) - xhat * sum_gx / R(c));
      dw[j] += dyr[j] * xhat;
      db[j] += dyr[j];
    }
  }
}

template void LayerNormForward<float>(int64_t, int64_t, const float*, const float*, const float*,
                                      float, float*, float*, float*);
template void LayerNormForward<double>(int64_t, int64_t, const double*, const double*,
                                       const double*, double, double*, double*, double*);
template void LayerNormBackward<float>(int64_t, int64_t, const float*, const float*, const float*,
                                       const float*, const float*, float*, float*, float*);
template void LayerNormBackward<double>(int64_t, int64_t, const double*, const double*,
                                        const double*, const double*, const double*, double*,
                                        double*, double*);

}  // namespace ferry::ref
