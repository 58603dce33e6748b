#include "kernels/ref/residual.h"

namespace ferry::ref {

template <typename R>
void ResidualAdd(int64_t n, const R* a, const R* b, R* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

template <typename R>
void Accumulate(int64_t n, const R* dy, R* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] += dy[i];
}

template void ResidualAdd<float>(int64_t, const float*, const float*, float*);
template void ResidualAdd<double>(int64_t, const double*, const double*, double*);
template void Accumulate<float>(int64_t, const float*, float*);
template void Accumulate<double>(int64_t, const double*, double*);

}  // namespace ferry::ref
