#include "kernels/ref/rmsnorm.h"

#include <cmath>

namespace ferry::ref {

template <typename R>
void RmsNormForward(int64_t n, int64_t c, const R* x, const R* w, R eps, R* y, R* rstd) {
  for (int64_t i = 0; i < n; ++i) {
    const R* xr = x + i * c;
    R ss = 0;
    for (int64_t j = 0; j < c; ++j) ss += xr[j] * xr[j];
    const R r = R(1) / std::sqrt(ss / R(c) + eps);
    for (int64_t j = 0; j < c; ++j) y[i * c + j] = w[j] * (xr[j] * r);
    rstd[i] = r;
  }
}

template <typename R>
void RmsNormBackward(int64_t n, int64_t c, const R* dy, const R* x, const R* w, const R* rstd,
                     R* dx, R* dw) {
  for (int64_t i = 0; i < n; ++i) {
    const R* xr = x + i * c;
    const R* dyr = dy + i * c;
    const R r = rstd[i];
    R dot = 0;  // sum of g * xhat
    for (int64_t j = 0; j < c; ++j) dot += dyr[j] * w[j] * xr[j] * r;
    const R mean_dot = dot / R(c);
    for (int64_t j = 0; j < c; ++j) {
      const R xhat = xr[j] * r;
      dx[i * c + j] = r * (dyr[j] * w[j] - xhat * mean_dot);
      dw[j] += dyr[j] * xhat;
    }
  }
}

template void RmsNormForward<float>(int64_t, int64_t, const float*, const float*, float, float*,
                                    float*);
template void RmsNormForward<double>(int64_t, int64_t, const double*, const double*, double,
                                     double*, double*);
template void RmsNormBackward<float>(int64_t, int64_t, const float*, const float*, const float*,
                                     const float*, float*, float*);
template void RmsNormBackward<double>(int64_t, int64_t, const double*, const double*, const double*,
                                      const double*, double*, double*);

}  // namespace ferry::ref
