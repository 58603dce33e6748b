// Cast between storage dtypes on CUDA: dst = src, rounded to nearest even (__float2bfloat16_rn,
// __float2half_rn). Every element goes through fp32, which holds bf16 and f16 exactly, so each
// conversion rounds once. Forward only; writes its output (=), accumulates nothing.
#include <cassert>

#include "kernels/backend_access.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise.cuh"

namespace ferry::cuda {
namespace {

template <typename Src, typename Dst>
__global__ void CastKernel(const Src* __restrict__ src,  // (n)
                           Dst* __restrict__ dst,        // (n)
                           int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = StoreFloat<Dst>(LoadFloat(src[i]));
  }
}

}  // namespace

Status Cast(CudaDevice& d, const Tensor& src, const Tensor& dst) {
  assert(src.numel() == dst.numel());
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("cast", src.dtype));
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("cast", dst.dtype));
  const int64_t n = src.numel();
  if (n == 0 || (src.dtype == dst.dtype && src.data == dst.data)) return Status::Ok();
  return d.EnqueueCompute("cast", [&](const CudaContext& c) -> Status {
    if (src.dtype == dst.dtype) {
      return CudaStatus(cudaMemcpyAsync(BackendAccess::Raw(dst.data), BackendAccess::Raw(src.data),
                                        src.bytes(), cudaMemcpyDeviceToDevice, c.compute),
                        "cudaMemcpyAsync (same-dtype cast)");
    }
    WithStorageType(src.dtype, [&](auto s) {
      using Src = decltype(s);
      WithStorageType(dst.dtype, [&](auto t) {
        using Dst = decltype(t);
        CastKernel<Src, Dst><<<ElementwiseBlocks(c, n), kElementwiseThreads, 0, c.compute>>>(
            BackendAccess::Data<Src>(src), BackendAccess::Data<Dst>(dst), n);
      });
    });
    return Status::Ok();
  });
}

}  // namespace ferry::cuda
