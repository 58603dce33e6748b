// Reference GELU, exact (erf) and tanh approximation (real type R = float or double):
//   exact: y = 0.5 x (1 + erf(x / sqrt 2))
//   tanh:  y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// Backward: dx = dy * gelu'(x) (activation gradient: =).
#pragma once

#include <cstdint>

namespace ferry::ref {

template <typename R>
R Gelu(R x, bool tanh_approx);
template <typename R>
R GeluDerivative(R x, bool tanh_approx);

template <typename R>
void GeluForward(int64_t n, const R* x, R* y, bool tanh_approx);  // (n) each
template <typename R>
void GeluBackward(int64_t n, const R* x, const R* dy, R* dx, bool tanh_approx);  // (n) each

}  // namespace ferry::ref
