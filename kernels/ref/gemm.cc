#include "kernels/ref/gemm.h"

namespace ferry::ref {

template <typename R>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, R alpha, const R* a,
          const R* b, R beta, R* c, const R* bias) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      R sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const R av = trans_a ? a[p * m + i] : a[i * k + p];
        const R bv = trans_b ? b[j * k + p] : b[p * n + j];
        sum += av * bv;
      }
      R out = alpha * sum;
      if (beta != R(0)) out += beta * c[i * n + j];
      if (bias != nullptr) out += bias[j];
      c[i * n + j] = out;
    }
  }
}

template <typename R>
void BiasGrad(int64_t n, int64_t c, const R* dy, R* db) {
  for (int64_t j = 0; j < c; ++j) {
    R sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += dy[i * c + j];
    db[j] += sum;
  }
}

template void Gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, const float*,
                          float, float*, const float*);
template void Gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                           const double*, double, double*, const double*);
template void BiasGrad<float>(int64_t, int64_t, const float*, float*);
template void BiasGrad<double>(int64_t, int64_t, const double*, double*);

}  // namespace ferry::ref
