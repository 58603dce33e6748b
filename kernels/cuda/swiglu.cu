// SwiGLU on CUDA, forward and backward (kernels/ops/swiglu.h), over (N, 2I) rows [gate | up]:
//   h = silu(g) u = g / (1 + e^-g) * u
//   dgate = dh u s (1 + g (1 - s)),  dup = dh g s,  with s = sigmoid(g)
// the CPU kernel's formulas (kernels/cpu/swiglu.cc). Math fp32 (expf, not the fast intrinsic), one
// rounding per output; both directions write their outputs (=). One thread per element of the
// (N, I) output; outputs do not overlap inputs (the op's rule).
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"

namespace ferry::cuda {
namespace {

__global__ void SwiGluForwardKernel(DeviceFloats gate_up,  // (N, 2I)
                                    DeviceFloats h,        // (N, I), written
                                    int64_t n,             // N * I
                                    int64_t inter) {       // I
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    const int64_t r = p / inter, j = p - r * inter;
    const float g = gate_up.Load(r * 2 * inter + j), u = gate_up.Load(r * 2 * inter + inter + j);
    h.Store(p, g / (1.0f + expf(-g)) * u);
  }
}

__global__ void SwiGluBackwardKernel(DeviceFloats gate_up,   // (N, 2I)
                                     DeviceFloats dh,        // (N, I)
                                     DeviceFloats dgate_up,  // (N, 2I), written
                                     int64_t n,              // N * I
                                     int64_t inter) {        // I
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    const int64_t r = p / inter, j = p - r * inter;
    const int64_t gate_at = r * 2 * inter + j, up_at = gate_at + inter;
    const float g = gate_up.Load(gate_at), u = gate_up.Load(up_at), d = dh.Load(p);
    const float s = 1.0f / (1.0f + expf(-g));
    dgate_up.Store(gate_at, d * u * s * (1.0f + g * (1.0f - s)));
    dgate_up.Store(up_at, d * g * s);
  }
}

}  // namespace

Status SwiGluForward(CudaDevice& d, const SwiGluForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("swiglu_forward", {a.gate_up.dtype, a.h.dtype}));
  const int64_t n = a.h.numel(), inter = a.h.dim(1);
  if (n == 0) return Status::Ok();
  return d.EnqueueCompute("swiglu_forward", [&](const CudaContext& c) -> Status {
    SwiGluForwardKernel<<<ElementwiseBlocks(c, n), kElementwiseThreads, 0, c.compute>>>(
        Floats(a.gate_up), Floats(a.h), n, inter);
    return Status::Ok();
  });
}

Status SwiGluBackward(CudaDevice& d, const SwiGluBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(
      RequireFloatStorage("swiglu_backward", {a.gate_up.dtype, a.dh.dtype, a.dgate_up.dtype}));
  const int64_t n = a.dh.numel(), inter = a.dh.dim(1);
  if (n == 0) return Status::Ok();
  return d.EnqueueCompute("swiglu_backward", [&](const CudaContext& c) -> Status {
    SwiGluBackwardKernel<<<ElementwiseBlocks(c, n), kElementwiseThreads, 0, c.compute>>>(
        Floats(a.gate_up), Floats(a.dh), Floats(a.dgate_up), n, inter);
    return Status::Ok();
  });
}

}  // namespace ferry::cuda
