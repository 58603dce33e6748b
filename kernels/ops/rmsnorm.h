// RMSNorm (Llama, Qwen, Mistral), forward and backward, over rows of (N, C) activations:
//   rstd = 1 / sqrt(mean(x^2) + eps)   (fp32, saved for backward)
//   y    = w * round_x(x * rstd)
// Math is fp32. round_x rounds to x's storage dtype: for bf16/f16 activations this matches
// Hugging Face's LlamaRMSNorm / Qwen3RMSNorm, `weight * hidden_states.to(input_dtype)`, which
// casts the normalized value back to the input dtype before the weight multiply (a no-op for f32).
// y is then rounded to its own dtype.
//
// Backward, with xhat = x * rstd and g = dy * w:
//   dx  = rstd * (g - xhat * mean(g * xhat))      activation gradient: written (=)
//   dw += sum over rows of dy * round_x(xhat)     parameter gradient: accumulated (+=)
// (dw uses the rounded xhat the forward multiplied by, as PyTorch's autograd does; dx treats the
// rounding as identity, as the cast's backward does.) dw is summed in a fixed order (CPU: row
// order, whatever the thread count; CUDA: kernels/cuda/reduce.cuh's, set by the shape alone), so
// runs repeat bit for bit.
//
// Storage: x, y, dy, dx, w, dw each f32, bf16 or f16; rstd f32. y may alias x in forward; dx may
// alias dy in backward. No scratch. Thread-safety: pure; the caller owns the tensors.
#pragma once

#include <cstddef>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct RmsNormForwardArgs {
  Tensor x;       // (N, C)
  Tensor weight;  // (C)
  Tensor y;       // (N, C)
  Tensor rstd;    // (N) f32, written
  float eps = 1e-6f;
};

struct RmsNormBackwardArgs {
  Tensor dy;       // (N, C)
  Tensor x;        // (N, C), as given to the forward
  Tensor weight;   // (C)
  Tensor rstd;     // (N) f32, from the forward
  Tensor dx;       // (N, C), written (=)
  Tensor dweight;  // (C), accumulated (+=)
};

Status ValidateRmsNormForward(const RmsNormForwardArgs& a);
Status ValidateRmsNormBackward(const RmsNormBackwardArgs& a);
inline size_t RmsNormScratchBytes(const Device&) { return 0; }  // for the planner's uniformity
// Validate, then enqueue on d's compute stream.
Status RmsNormForward(Device& d, const RmsNormForwardArgs& a);
Status RmsNormBackward(Device& d, const RmsNormBackwardArgs& a);

}  // namespace ferry
