// BiasGrad: db += sum over rows of dy, the bias gradient of a linear layer y = x W^T + b.
// db is a parameter gradient: accumulated (+=) across micro-batches. Storage f32, bf16 or f16;
// the column sums run in fp32 in a fixed order (CPU: row order, whatever the thread count; CUDA:
// reduce.cuh's, set by the shape alone), so runs repeat bit for bit, and db is rounded to its
// dtype once. No scratch. Thread-safety: pure; the caller owns the
// tensors.
#pragma once

#include <cstddef>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct BiasGradArgs {
  Tensor dy;  // (N, C)
  Tensor db;  // (C), accumulated (+=)
};

Status ValidateBiasGrad(const BiasGradArgs& a);
inline size_t BiasGradScratchBytes(const Device&) { return 0; }  // for the planner's uniformity
// Validates, then enqueues on d's compute stream.
Status BiasGrad(Device& d, const BiasGradArgs& a);

}  // namespace ferry
