#include "kernels/ref/swiglu.h"

#include <cmath>

namespace ferry::ref {

template <typename R>
void SwiGluForward(int64_t n, int64_t i, const R* gu, R* h) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < i; ++j) {
      const R g = gu[r * 2 * i + j];
      const R u = gu[r * 2 * i + i + j];
      h[r * i + j] = g / (R(1) + std::exp(-g)) * u;
    }
  }
}

template <typename R>
void SwiGluBackward(int64_t n, int64_t i, const R* gu, const R* dh, R* dgu) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < i; ++j) {
      const R g = gu[r * 2 * i + j];
      const R u = gu[r * 2 * i + i + j];
      const R s = R(1) / (R(1) + std::exp(-g));
      const R d = dh[r * i + j];
      dgu[r * 2 * i + j] = d * u * s * (R(1) + g * (R(1) - s));
      dgu[r * 2 * i + i + j] = d * g * s;
    }
  }
}

template void SwiGluForward<float>(int64_t, int64_t, const float*, float*);
template void SwiGluForward<double>(int64_t, int64_t, const double*, double*);
template void SwiGluBackward<float>(int64_t, int64_t, const float*, const float*, float*);
template void SwiGluBackward<double>(int64_t, int64_t, const double*, const double*, double*);

}  // namespace ferry::ref
