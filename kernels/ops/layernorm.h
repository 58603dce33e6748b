// LayerNorm (GPT-2), forward and backward, over rows of (N, C) activations:
//   mean = mean(x), rstd = 1 / sqrt(mean((x - mean)^2) + eps)   (fp32, saved for backward)
//   y = (x - mean) * rstd * w + b
// Math is fp32 (two passes for the variance); y is rounded to its dtype once.
//
// Backward, with xhat = (x - mean) * rstd and g = dy * w:
//   dx  = rstd * (g - mean(g) - xhat * mean(g * xhat))   activation gradient: written (=)
//   dw += sum over rows of dy * xhat                     parameter gradients: accumulated (+=)
//   db += sum over rows of dy
// dw and db are summed in a fixed order (CPU: row order, whatever the thread count; CUDA:
// kernels/cuda/reduce.cuh's, set by the shape alone), so runs repeat bit for bit.
//
// Storage: x, y, dy, dx, w, b, dw, db each f32, bf16 or f16; mean and rstd f32. y may alias x in
// forward; dx may alias dy in backward. No scratch. Thread-safety: pure; the caller owns the
// tensors.
#pragma once

#include <cstddef>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct LayerNormForwardArgs {
  Tensor x;       // (N, C)
  Tensor weight;  // (C)
  Tensor bias;    // (C)
  Tensor y;       // (N, C)
  Tensor mean;    // (N) f32, written
  Tensor rstd;    // (N) f32, written
  float eps = 1e-5f;
};

struct LayerNormBackwardArgs {
  Tensor dy;       // (N, C)
  Tensor x;        // (N, C), as given to the forward
  Tensor weight;   // (C)
  Tensor mean;     // (N) f32, from the forward
  Tensor rstd;     // (N) f32, from the forward
  Tensor dx;       // (N, C), written (=)
  Tensor dweight;  // (C), accumulated (+=)
  Tensor dbias;    // (C), accumulated (+=)
};

Status ValidateLayerNormForward(const LayerNormForwardArgs& a);
Status ValidateLayerNormBackward(const LayerNormBackwardArgs& a);
inline size_t LayerNormScratchBytes(const Device&) { return 0; }  // for the planner's uniformity
// Validate, then enqueue on d's compute stream.
Status LayerNormForward(Device& d, const LayerNormForwardArgs& a);
Status LayerNormBackward(Device& d, const LayerNormBackwardArgs& a);

}  // namespace ferry
