// Residual connections:
//   ResidualAdd:         y = a + b     (the forward of x + f(x); y may alias a or b)
//   ResidualAccumulate:  dx += dy      (backward: adds a branch's gradient into the residual
//                                       stream's; dx is accumulated, +=)
// The backward of y = a + b passes dy to both inputs unchanged, so it needs no op of its own.
// Elementwise over tensors of equal element count; storage f32, bf16 or f16 per tensor, math
// fp32, one rounding per output. No scratch. Thread-safety: pure; the caller owns the tensors.
#pragma once

#include <cstddef>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct ResidualAddArgs {
  Tensor a;  // (any shape)
  Tensor b;  // (same shape)
  Tensor y;  // (same shape), written
};

struct ResidualAccumulateArgs {
  Tensor dy;  // (any shape)
  Tensor dx;  // (same shape), accumulated (+=)
};

Status ValidateResidualAdd(const ResidualAddArgs& a);
Status ValidateResidualAccumulate(const ResidualAccumulateArgs& a);
inline size_t ResidualScratchBytes(const Device&) { return 0; }  // for the planner's uniformity
// Validate, then enqueue on d's compute stream.
Status ResidualAdd(Device& d, const ResidualAddArgs& a);
Status ResidualAccumulate(Device& d, const ResidualAccumulateArgs& a);

}  // namespace ferry
