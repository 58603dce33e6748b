#include "kernels/ref/gelu.h"

#include <cmath>

namespace ferry::ref {

template <typename R>
R Gelu(R x, bool tanh_approx) {
  if (tanh_approx) {
    const R k = std::sqrt(R(2) / R(M_PI));
    return R(0.5) * x * (R(1) + std::tanh(k * (x + R(0.044715) * x * x * x)));
  }
  return R(0.5) * x * (R(1) + std::erf(x / std::sqrt(R(2))));
}

template <typename R>
R GeluDerivative(R x, bool tanh_approx) {
  if (tanh_approx) {
    const R k = std::sqrt(R(2) / R(M_PI));
    const R t = std::tanh(k * (x + R(0.044715) * x * x * x));
    return R(0.5) * (R(1) + t) + R(0.5) * x * (R(1) - t * t) * k * (R(1) + R(3 * 0.044715) * x * x);
  }
  return R(0.5) * (R(1) + std::erf(x / std::sqrt(R(2)))) +
         x * std::exp(-R(0.5) * x * x) / std::sqrt(R(2) * R(M_PI));
}

template <typename R>
void GeluForward(int64_t n, const R* x, R* y, bool tanh_approx) {
  for (int64_t i = 0; i < n; ++i) y[i] = Gelu(x[i], tanh_approx);
}

template <typename R>
void GeluBackward(int64_t n, const R* x, const R* dy, R* dx, bool tanh_approx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * GeluDerivative(x[i], tanh_approx);
}

template float Gelu<float>(float, bool);
template double Gelu<double>(double, bool);
template float GeluDerivative<float>(float, bool);
template double GeluDerivative<double>(double, bool);
template void GeluForward<float>(int64_t, const float*, float*, bool);
template void GeluForward<double>(int64_t, const double*, double*, bool);
template void GeluBackward<float>(int64_t, const float*, const float*, float*, bool);
template void GeluBackward<double>(int64_t, const double*, const double*, double*, bool);

}  // namespace ferry::ref
