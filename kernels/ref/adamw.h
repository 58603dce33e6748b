// Reference AdamW and gradient sum of squares: plain loops over host arrays, templated on the real
// type R (float: torch's fp32 arithmetic, the target of the fast kernels, bit for bit; double:
// the same formula in double). The element formula lives here once; the fast kernels use it for
// their loop tails. See kernels/ops/adamw.h for the formula and why it is ordered so.
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/ops/adamw.h"

namespace ferry::ref {

// The per-step scalars: computed in double as torch computes them in Python, then rounded to R
// once (torch rounds a Python float to the tensor's dtype when it applies it).
template <typename R>
struct AdamWScalars {
  R grad_scale;
  bool decay_enabled;  // weight_decay != 0 (torch skips the multiply then)
  R decay;             // 1 - lr * weight_decay
  R one_minus_beta1;
  R beta2;
  R one_minus_beta2;
  R bc2_sqrt;  // sqrt(1 - beta2^t)
  R eps;
  R neg_step_size;  // -lr / (1 - beta1^t)
};

template <typename R>
AdamWScalars<R> MakeAdamWScalars(const AdamWHyperparameters& h) {
  const double t = double(h.step);
  const double bc1 = 1.0 - std::pow(h.beta1, t);
  const double bc2 = 1.0 - std::pow(h.beta2, t);
  return AdamWScalars<R>{R(h.grad_scale),
                         h.weight_decay != 0.0,
                         R(1.0 - h.lr * h.weight_decay),
                         R(1.0 - h.beta1),
                         R(h.beta2),
                         R(1.0 - h.beta2),
                         R(std::sqrt(bc2)),
                         R(h.eps),
                         R(-(h.lr / bc1))};
}

// One element's update, in torch's operation order (kernels/ops/adamw.h). `g` is already widened
// from its storage type. Compiled without floating-point contraction (ISO C++ mode), so only the
// explicit fma fuses.
template <typename R>
inline void AdamWElement(const AdamWScalars<R>& s, R& p, R g, R& m, R& v) {
  g = g * s.grad_scale;
  R pp = s.decay_enabled ? p * s.decay : p;
  m = std::fma(s.one_minus_beta1, g - m, m);
  v = v * s.beta2 + (s.one_minus_beta2 * g) * g;
  const R d = std::sqrt(v) / s.bc2_sqrt + s.eps;
  p = pp + (s.neg_step_size * m) / d;
}

// Updates n elements in place. p, m, v: (n); g: (n).
template <typename R>
void AdamWStep(const AdamWHyperparameters& h, R* p, const R* g, R* m, R* v, int64_t n);

// Sum of g[i]^2 accumulated in double (for global-norm clipping).
template <typename R>
double SumOfSquares(const R* g, int64_t n);

}  // namespace ferry::ref
