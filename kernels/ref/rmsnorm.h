// Reference RMSNorm (the obvious loops, real type R = float or double; semantics as
// kernels/ops/rmsnorm.h but without the storage rounding of the normalized value):
//   rstd = 1 / sqrt(mean(x^2) + eps),  y = w * (x * rstd).
// Backward: dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * rstd (activation
// gradient: =); dw += sum over rows of dy * xhat (parameter gradient: +=).
#pragma once

#include <cstdint>

namespace ferry::ref {

template <typename R>
void RmsNormForward(int64_t n, int64_t c, const R* x,  // (n, c)
                    const R* w,                        // (c)
                    R eps, R* y,                       // (n, c)
                    R* rstd);                          // (n)

template <typename R>
void RmsNormBackward(int64_t n, int64_t c, const R* dy, const R* x,  // (n, c) each
                     const R* w, const R* rstd,                      // (c), (n)
                     R* dx,                                          // (n, c), =
                     R* dw);                                         // (c), +=

}  // namespace ferry::ref
