#include "kernels/ref/rope.h"

#include <cmath>

#include "kernels/ops/rope_math.h"

namespace ferry::ref {

namespace {

// y = x*cos + sign * rotate_half(x)*sin on the first R dims of each head; the rest copied.
// sign = -1 is the transpose (= inverse) rotation: y_j = x_j cos_j + rotate_half(x)_j sin_j is
// linear in x, and the coefficient of x_{j±half} in y_j is the negative of that of x_j in
// y_{j±half}.
template <typename R>
void Rotate(const R* x, const int32_t* pos, const float* inv_freq, const RopeDims& dims, R sign,
            R* y) {
  const int64_t d = dims.head_dim, half = dims.rotary_dim / 2;
  for (int64_t n = 0; n < dims.tokens; ++n) {
    for (int64_t h = 0; h < dims.num_heads; ++h) {
      const R* xh = x + (n * dims.num_heads + h) * d;
      R* yh = y + (n * dims.num_heads + h) * d;
      for (int64_t j = 0; j < d; ++j) {
        if (j >= 2 * half) {
          yh[j] = xh[j];
          continue;
        }
        const int64_t i = j % half;  // frequency index: emb = cat(freqs, freqs)
        const R angle = R(RopeAngle(pos[n], inv_freq[i]));
        const R rotated = j < half ? -xh[j + half] : xh[j - half];  // rotate_half(x)[j]
        yh[j] = xh[j] * std::cos(angle) + sign * rotated * std::sin(angle);
      }
    }
  }
}

}  // namespace

template <typename R>
void RopeForward(const R* x, const int32_t* pos, const float* inv_freq, const RopeDims& dims,
                 R* y) {
  Rotate(x, pos, inv_freq, dims, R(1), y);
}

template <typename R>
void RopeBackward(const R* dy, const int32_t* pos, const float* inv_freq, const RopeDims& dims,
                  R* dx) {
  Rotate(dy, pos, inv_freq, dims, R(-1), dx);
}

template void RopeForward<float>(const float*, const int32_t*, const float*, const RopeDims&,
                                 float*);
template void RopeForward<double>(const double*, const int32_t*, const float*, const RopeDims&,
                                  double*);
template void RopeBackward<float>(const float*, const int32_t*, const float*, const RopeDims&,
                                  float*);
template void RopeBackward<double>(const double*, const int32_t*, const float*, const RopeDims&,
                                   double*);

}  // namespace ferry::ref
