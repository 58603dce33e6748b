// Reference LayerNorm (the obvious loops, real type R = float or double; semantics as
// kernels/ops/layernorm.h):
//   mean = mean(x), rstd = 1 / sqrt(mean((x - mean)^2) + eps), y = (x - mean) * rstd * w + b.
// Backward, with xhat = (x - mean) * rstd and g = dy * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (activation gradient: =)
//   dw += sum over rows of dy * xhat, db += sum over rows of dy   (parameter gradients: +=)
#pragma once

#include <cstdint>

namespace ferry::ref {

template <typename R>
void LayerNormForward(int64_t n, int64_t c, const R* x,  // (n, c)
                      const R* w, const R* b,            // (c) each
                      R eps, R* y,                       // (n, c)
                      R* mean, R* rstd);                 // (n) each

template <typename R>
void LayerNormBackward(int64_t n, int64_t c, const R* dy, const R* x,  // (n, c) each
                       const R* w, const R* mean, const R* rstd,       // (c), (n), (n)
                       R* dx,                                          // (n, c), =
                       R* dw, R* db);                                  // (c) each, +=

}  // namespace ferry::ref
