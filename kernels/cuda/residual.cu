// Residual add on CUDA: y = a + b element-wise, math in fp32, stored rounded to nearest even, each
// tensor in its own storage dtype (f32, bf16 or f16). Writes its output (=); ResidualAccumulate is
// the same kernel with y = a = dx (dx += dy, accumulated). Its backward needs no kernel: dy flows
// unchanged to both inputs.
#include <cassert>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"

namespace ferry::cuda {
namespace {

// y may alias a or b (each element is read before it is written).
__global__ void ResidualKernel(DeviceFloats a,  // (n)
                               DeviceFloats b,  // (n)
                               DeviceFloats y,  // (n)
                               int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y.Store(i, a.Load(i) + b.Load(i));
  }
}

}  // namespace

Status Residual(CudaDevice& d, const Tensor& a, const Tensor& b, const Tensor& y) {
  assert(a.numel() == b.numel() && a.numel() == y.numel());
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("residual", {a.dtype, b.dtype, y.dtype}));
  const int64_t n = y.numel();
  if (n == 0) return Status::Ok();
  return d.EnqueueCompute("residual", [&](const CudaContext& c) -> Status {
    ResidualKernel<<<ElementwiseBlocks(c, n), kElementwiseThreads, 0, c.compute>>>(
        Floats(a), Floats(b), Floats(y), n);
    return Status::Ok();
  });
}

}  // namespace ferry::cuda
