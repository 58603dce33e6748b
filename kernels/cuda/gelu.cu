// GELU on CUDA, forward and backward, elementwise (kernels/ops/gelu.h), with the CPU kernel's
// formulas (kernels/cpu/gelu.cc) so both round the same fp32 values:
//   erf:  y = 0.5 x (1 + erf(x / sqrt 2)),  gelu' = 0.5 (1 + erf(x / sqrt 2)) + x phi(x)
//   tanh: y = x / (1 + e^-2u) with u = sqrt(2/pi) (x + 0.044715 x^3) (no cancellation for x << 0),
//         gelu' = s + 2 x s (1 - s) u'(x) with s = sigmoid(2u)
// Math fp32 (erff, expf: CUDA's accurate versions, not the fast intrinsics), one rounding per
// output. Forward writes y (=); backward writes dx (=), an activation gradient. y may alias x and
// dx may alias dy (each element is read before it is written).
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"

namespace ferry::cuda {
namespace {

// 1 + e^-2u(v), u(v) = sqrt(2/pi) (v + 0.044715 v^3): sigmoid(2u) = (1 + tanh u) / 2 is its
// reciprocal.
__device__ __forceinline__ float TanhDenominator(float v) {
  const float u = kGeluSqrt2OverPi * (v + kGeluCubic * v * v * v);
  return 1.0f + expf(u * -2.0f);
}

template <GeluApprox kApprox>
__global__ void GeluForwardKernel(DeviceFloats x,  // (n)
                                  DeviceFloats y,  // (n), written
                                  int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = x.Load(i);
    if constexpr (kApprox == GeluApprox::kTanh) {
      y.Store(i, v / TanhDenominator(v));  // the CPU's one division
    } else {
      y.Store(i, 0.5f * v * (1.0f + erff(v * kGeluSqrtHalf)));
    }
  }
}

template <GeluApprox kApprox>
__global__ void GeluBackwardKernel(DeviceFloats x,   // (n)
                                   DeviceFloats dy,  // (n)
                                   DeviceFloats dx,  // (n), written
                                   int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = x.Load(i), g = dy.Load(i);
    float grad;
    if constexpr (kApprox == GeluApprox::kTanh) {
      const float s = 1.0f / TanhDenominator(v);
      const float du = kGeluSqrt2OverPi * (1.0f + (3.0f * kGeluCubic) * v * v);
      grad = s + 2.0f * v * s * (1.0f - s) * du;
    } else {
      grad = 0.5f * (1.0f + erff(v * kGeluSqrtHalf)) + v * expf(-0.5f * v * v) * kGeluInvSqrt2Pi;
    }
    dx.Store(i, g * grad);
  }
}

}  // namespace

Status GeluForward(CudaDevice& d, const GeluForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("gelu_forward", {a.x.dtype, a.y.dtype}));
  const int64_t n = a.x.numel();
  if (n == 0) return Status::Ok();
  return d.EnqueueCompute("gelu_forward", [&](const CudaContext& c) -> Status {
    auto kernel = a.approx == GeluApprox::kTanh ? &GeluForwardKernel<GeluApprox::kTanh>
                                                : &GeluForwardKernel<GeluApprox::kErf>;
    kernel<<<ElementwiseBlocks(c, n), kElementwiseThreads, 0, c.compute>>>(Floats(a.x), Floats(a.y),
                                                                           n);
    return Status::Ok();
  });
}

Status GeluBackward(CudaDevice& d, const GeluBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("gelu_backward", {a.x.dtype, a.dy.dtype, a.dx.dtype}));
  const int64_t n = a.x.numel();
  if (n == 0) return Status::Ok();
  return d.EnqueueCompute("gelu_backward", [&](const CudaContext& c) -> Status {
    auto kernel = a.approx == GeluApprox::kTanh ? &GeluBackwardKernel<GeluApprox::kTanh>
                                                : &GeluBackwardKernel<GeluApprox::kErf>;
    kernel<<<ElementwiseBlocks(c, n), kElementwiseThreads, 0, c.compute>>>(
        Floats(a.x), Floats(a.dy), Floats(a.dx), n);
    return Status::Ok();
  });
}

}  // namespace ferry::cuda
