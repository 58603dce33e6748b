// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ computes it on fp32
// gradients:
//   norm = sqrt(sum over every trainable parameter of sum(g^2))     (an fp32 value in torch)
//   coef = min(1, max_norm / (norm + 1e-6))                          (fp32 arithmetic in torch;
//          Python's float / tensor is tensor.reciprocal() * float: (1 / (norm + 1e-6)) * max_norm)
// (max_norm = 0: no clipping, coef = 1). ferry sums the squares in double (deterministic blocks,
// cpu::AdamWKernel::SumOfSquares), rounds the norm to fp32 and then follows torch's fp32
// arithmetic, so the coefficient is torch's bit for bit whenever the two norms round to the same
// fp32 value. The coefficient is applied as AdamW's grad_scale; gradients are never rewritten.
#pragma once

#include <algorithm>
#include <cmath>

namespace ferry {

// `sum_of_squares` over all trainable gradients of the step (partial sums added as they land).
inline double ClipCoefficient(double sum_of_squares, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const float norm = float(std::sqrt(sum_of_squares));
  const float coef = (1.0f / (norm + 1e-6f)) * float(max_norm);
  return std::min(1.0, double(coef));
}

}  // namespace ferry
