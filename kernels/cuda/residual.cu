// Residual add on CUDA: y = a + b element-wise, math in fp32, stored rounded to nearest even.
// Writes its output (=). Its backward needs no kernel: dy flows unchanged to both inputs.
#include <cassert>

#include "kernels/backend_access.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"

namespace ferry::cuda {
namespace {

// No __restrict__: y may alias a or b (each element is read before it is written).
template <typename T>
__global__ void ResidualKernel(const T* a,  // (n)
                               const T* b,  // (n)
                               T* y,        // (n)
                               int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = StoreFloat<T>(LoadFloat(a[i]) + LoadFloat(b[i]));
  }
}

}  // namespace

Status Residual(CudaDevice& d, const Tensor& a, const Tensor& b, const Tensor& y) {
  assert(a.dtype == b.dtype && a.dtype == y.dtype);
  assert(a.numel() == b.numel() && a.numel() == y.numel());
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("residual", y.dtype));
  const int64_t n = y.numel();
  if (n == 0) return Status::Ok();
  return d.EnqueueCompute("residual", [&](const CudaContext& c) -> Status {
    WithStorageType(y.dtype, [&](auto t) {
      using T = decltype(t);
      ResidualKernel<T><<<ElementwiseBlocks(c, n), kElementwiseThreads, 0, c.compute>>>(
          BackendAccess::Data<T>(a), BackendAccess::Data<T>(b), BackendAccess::Data<T>(y), n);
    });
    return Status::Ok();
  });
}

}  // namespace ferry::cuda
