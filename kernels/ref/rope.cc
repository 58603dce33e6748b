#include "kernels/ref/rope.h"

#include <cmath>

#include "kernels/ops/rope_math.h"

namespace ferry::ref {

template <typename R>
void RopeForward(const R *x, const int32_t *pos, const float *inv_freq, const RopeDims &dims,
                 R *y) {
  const int64_t d = dims.head_dim, half = dims.rotary_dim / 2;
  for (int64_t n = 0; n < dims.tokens; ++n) {
    for (int64_t h = 0; h < dims.num_heads; ++h) {
      const R *xh = x + (n * dims.num_heads + h) * d;
      R *yh = y + (n * dims.num_heads + h) * d;
      for (int64_t j = 0; j < d; ++j) {
        if (j >= 2 * half) {
          yh[j] = xh[j];
          continue;
        }
        const int64_t i = j % half;  // frequency index: emb = cat(freqs, freqs)
        const R angle = R(RopeAngle(pos[n], inv_freq[i]));
        const R rotated = j < half ? -xh[j + half] : xh[j - half];  // rotate_half(x)[j]
        yh[j] = xh[j] * std::cos(angle) + rotated * std::sin(angle);
      }
    }
  }
}

template <typename R>
void RopeBackward(const R *dy, const int32_t *pos, const float *inv_freq, const RopeDims &dims,
                  R *dx) {
  // y_j = x_j cos_j + s_j x_{j±half} sin_j  =>  dx_j = dy_j cos_j + sum over
  // the partner.
  const int64_t d = dims.head_dim, half = dims.rotary_dim / 2;
  for (int64_t n = 0; n < dims.tokens; ++n) {
    for (int64_t h = 0; h < dims.num_heads; ++h) {
      const R *g = dy + (n * dims.num_heads + h) * d;
      R *gx = dx + (n * dims.num_heads + h) * d;
      for (int64_t j = 0; j < d; ++j) {
        if (j >= 2 * half) {
          gx[j] = g[j];
          continue;
        }
        const int64_t i = j % half;
        const R angle = R(RopeAngle(pos[n], inv_freq[i]));
        // x_j (j < half) feeds y_{j+half} with +sin; x_j (j >= half) feeds
        // y_{j-half} with -sin.
        const R partner = j < half ? g[j + half] : -g[j - half];
        gx[j] = g[j] * std::cos(angle) + partner * std::sin(angle);
      }
    }
  }
}

template void RopeForward<float>(const float *, const int32_t *, const float *, const RopeDims &,
                                 float *);
template void RopeForward<double>(const double *, const int32_t *, const float *, const RopeDims &,
                                  double *);
template void RopeBackward<float>(const float *, const int32_t *, const float *, const RopeDims &,
                                  float *);
template void RopeBackward<double>(const double *, const int32_t *, const float *, const RopeDims &,
                                   double *);

}  // namespace ferry::ref
