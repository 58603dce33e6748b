// GELU, forward and backward, elementwise:
//   kErf:  y = 0.5 x (1 + erf(x / sqrt 2))                          (PyTorch's default, "gelu")
//   kTanh: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))      (GPT-2's "gelu_new")
// Backward: dx = dy * gelu'(x), an activation gradient: written (=).
// Storage f32, bf16 or f16 per tensor, math fp32, one rounding per output. y may alias x; dx may
// alias dy. No scratch. Thread-safety: pure; the caller owns the tensors.
#pragma once

#include <cstddef>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

enum class GeluApprox { kErf, kTanh };

// The formulas' constants, shared by the CPU and CUDA kernels.
inline constexpr float kGeluSqrtHalf = 0.70710678118654752f;     // 1 / sqrt(2)
inline constexpr float kGeluInvSqrt2Pi = 0.39894228040143268f;   // 1 / sqrt(2 pi)
inline constexpr float kGeluSqrt2OverPi = 0.79788456080286536f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;

struct GeluForwardArgs {
  Tensor x;  // (any shape)
  Tensor y;  // (same shape), written
  GeluApprox approx = GeluApprox::kErf;
};

struct GeluBackwardArgs {
  Tensor x;   // (any shape), the forward's input
  Tensor dy;  // (same shape)
  Tensor dx;  // (same shape), written (=)
  GeluApprox approx = GeluApprox::kErf;
};

Status ValidateGeluForward(const GeluForwardArgs& a);
Status ValidateGeluBackward(const GeluBackwardArgs& a);
inline size_t GeluScratchBytes(const Device&) { return 0; }  // for the planner's uniformity
// Validate, then enqueue on d's compute stream.
Status GeluForward(Device& d, const GeluForwardArgs& a);
Status GeluBackward(Device& d, const GeluBackwardArgs& a);

}  // namespace ferry
