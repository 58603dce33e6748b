#include "kernels/ref/adamw.h"

namespace ferry::ref {

template <typename R>
void AdamWStep(const AdamWHyperparameters& h, R* p, const R* g, R* m, R* v, int64_t n) {
  const AdamWScalars<R> s = MakeAdamWScalars<R>(h);
  for (int64_t i = 0; i < n; ++i) AdamWElement(s, p[i], g[i], m[i], v[i]);
}

template <typename R>
double SumOfSquares(const R* g, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(g[i]) * double(g[i]);
  return sum;
}

template void AdamWStep<float>(const AdamWHyperparameters&, float*, const float*, float*, float*,
                               int64_t);
template void AdamWStep<double>(const AdamWHyperparameters&, double*, const double*, double*,
                                double*, int64_t);
template double SumOfSquares<float>(const float*, int64_t);
template double SumOfSquares<double>(const double*, int64_t);

}  // namespace ferry::ref
