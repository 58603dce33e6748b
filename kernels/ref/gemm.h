// Reference GEMM and bias gradient: the obvious loops, in the real type R (float or double), over
// host row-major arrays. Tests compare the fast kernels against these and run finite-difference
// checks in double. Semantics as kernels/ops/gemm.h.
#pragma once

#include <cstdint>

namespace ferry::ref {

// c = alpha * op(a) op(b) + beta * c + bias (broadcast over rows; bias may be null).
// beta == 0 does not read c.
template <typename R>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, R alpha,
          const R* a,      // (m, k), or (k, m) when trans_a
          const R* b,      // (k, n), or (n, k) when trans_b
          R beta, R* c,    // (m, n)
          const R* bias);  // (n) or null

// db += column sums of dy (parameter gradient: +=).
template <typename R>
void BiasGrad(int64_t n, int64_t c, const R* dy,  // (n, c)
              R* db);                             // (c)

}  // namespace ferry::ref
