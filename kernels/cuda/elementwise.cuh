// Shared pieces of the element-wise CUDA kernels (cast.cu, residual.cu, gelu.cu, ...): the CUDA
// type of each storage dtype, fp32 loads and round-to-nearest-even stores (compile-time typed, and
// DeviceFloats for tensors whose dtype is only known at run time), and the grid of a grid-stride
// loop. Device code only; included by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "kernels/backend_access.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/dtype.h"
#include "kernels/status.h"

namespace ferry::cuda {

__device__ __forceinline__ float LoadFloat(float v) { return v; }
__device__ __forceinline__ float LoadFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float LoadFloat(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T StoreFloat(float v);
template <>
__device__ __forceinline__ float StoreFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 StoreFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half StoreFloat<__half>(float v) {
  return __float2half_rn(v);
}

// A tensor's elements with their storage dtype chosen at run time (f32, bf16 or f16): the ops take
// a dtype per tensor, and one kernel per combination would be hundreds of instantiations. The
// switch is uniform across a launch (no divergence); loads widen to fp32 exactly, stores round to
// nearest even once. REQUIRES (host side, see Floats): the dtype is a float storage dtype.
struct DeviceFloats {
  void* data = nullptr;
  DType dtype = DType::kF32;

  __device__ __forceinline__ float Load(int64_t i) const {
    switch (dtype) {
      case DType::kBF16:
        return LoadFloat(static_cast<const __nv_bfloat16*>(data)[i]);
      case DType::kF16:
        return LoadFloat(static_cast<const __half*>(data)[i]);
      default:
        return static_cast<const float*>(data)[i];
    }
  }
  __device__ __forceinline__ void Store(int64_t i, float v) const {
    switch (dtype) {
      case DType::kBF16:
        static_cast<__nv_bfloat16*>(data)[i] = StoreFloat<__nv_bfloat16>(v);
        return;
      case DType::kF16:
        static_cast<__half*>(data)[i] = StoreFloat<__half>(v);
        return;
      default:
        static_cast<float*>(data)[i] = v;
    }
  }
  // v rounded to this dtype and widened back (what storing it here would keep).
  __device__ __forceinline__ float Round(float v) const {
    switch (dtype) {
      case DType::kBF16:
        return LoadFloat(StoreFloat<__nv_bfloat16>(v));
      case DType::kF16:
        return LoadFloat(StoreFloat<__half>(v));
      default:
        return v;
    }
  }
};
inline DeviceFloats Floats(const Tensor& t) {
  return DeviceFloats{BackendAccess::Raw(t.data), t.dtype};
}

// The dtypes these kernels store (floating point; index dtypes are not element-wise data).
inline bool IsFloatStorage(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}
inline Status RequireFloatStorage(std::string_view op, DType t) {
  if (IsFloatStorage(t)) return Status::Ok();
  return Status::InvalidArgument(std::string(op) + ": dtype " + std::string(DTypeName(t)) +
                                 " is not a floating-point storage dtype");
}
inline Status RequireFloatStorage(std::string_view op, std::initializer_list<DType> ts) {
  for (DType t : ts) FERRY_RETURN_IF_ERROR(RequireFloatStorage(op, t));
  return Status::Ok();
}

// Calls fn(T{}) with T the CUDA storage type of `t`. REQUIRES: IsFloatStorage(t).
template <typename Fn>
decltype(auto) WithStorageType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kBF16:
      return fn(__nv_bfloat16{});
    case DType::kF16:
      return fn(__half{});
    case DType::kF32:
    case DType::kI32:  // excluded by the REQUIRES above
    case DType::kU8:
      break;
  }
  return fn(float{});
}

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, no more.
inline constexpr int kElementwiseThreads = 256;
inline unsigned ElementwiseBlocks(const CudaContext& c, int64_t n) {
  const int64_t needed = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  const int64_t fill = int64_t(std::max(c.multiprocessors, 1)) * 8;
  return unsigned(std::max<int64_t>(1, std::min(needed, fill)));
}

}  // namespace ferry::cuda
