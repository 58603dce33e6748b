// Reference residual add and gradient accumulation (real type R = float or double):
//   ResidualAdd:  y = a + b            (forward of x + f(x); its backward passes dy to both)
//   Accumulate:   dx += dy             (adds a branch's gradient into the residual stream's)
#pragma once

#include <cstdint>

namespace ferry::ref {

template <typename R>
void ResidualAdd(int64_t n, const R* a, const R* b, R* y);  // (n) each
template <typename R>
void Accumulate(int64_t n, const R* dy, R* dx);  // (n) each, dx +=

}  // namespace ferry::ref
