// AdamW on CUDA with its state (p, m, v) in device memory (kernels/ops/adamw.h). The per-step
// scalars are computed on the host exactly as the reference does (ref::MakeAdamWScalars: double,
// rounded to fp32 once); each element then runs torch's fp32 operation order with explicitly
// rounded intrinsics (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn and the one __fmaf_rn), which
// nvcc never contracts into fused multiply-adds, so the update equals the CPU kernel's bit for
// bit. p, m and v are updated in place; the gradient (f32 or bf16) is read only; the optional
// bf16 copy of p is written (=), rounded to nearest even.
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/ref/adamw.h"

namespace ferry::cuda {
namespace {

__global__ void AdamWKernel(ref::AdamWScalars<float> s,
                            float* __restrict__ p,               // (n)
                            DeviceFloats g,                      // (n) f32 | bf16
                            float* __restrict__ m,               // (n)
                            float* __restrict__ v,               // (n)
                            __nv_bfloat16* __restrict__ p_bf16,  // (n) or null
                            int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    // ref::AdamWElement, operation by operation.
    const float gi = __fmul_rn(g.Load(i), s.grad_scale);
    const float pi = s.decay_enabled ? __fmul_rn(p[i], s.decay) : p[i];
    const float mi = __fmaf_rn(s.one_minus_beta1, __fsub_rn(gi, m[i]), m[i]);
    const float vi =
        __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, gi), gi));
    const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
    const float pn = __fadd_rn(pi, __fdiv_rn(__fmul_rn(s.neg_step_size, mi), den));
    m[i] = mi;
    v[i] = vi;
    p[i] = pn;
    if (p_bf16 != nullptr) p_bf16[i] = __float2bfloat16_rn(pn);
  }
}

}  // namespace

Status AdamWStep(CudaDevice& d, const AdamWArgs& a) {
  FERRY_RETURN_IF_ERROR(RequireFloatStorage("adamw", a.g.dtype));
  const int64_t n = a.p.numel();
  if (n == 0) return Status::Ok();
  const ref::AdamWScalars<float> scalars = ref::MakeAdamWScalars<float>(a.hyper);
  __nv_bfloat16* p_bf16 =
      a.p_bf16.data.is_null() ? nullptr : BackendAccess::Data<__nv_bfloat16>(a.p_bf16);
  return d.EnqueueCompute("adamw", [&](const CudaContext& c) -> Status {
    AdamWKernel<<<ElementwiseBlocks(c, n), kElementwiseThreads, 0, c.compute>>>(
        scalars, BackendAccess::Data<float>(a.p), Floats(a.g), BackendAccess::Data<float>(a.m),
        BackendAccess::Data<float>(a.v), p_bf16, n);
    return Status::Ok();
  });
}

}  // namespace ferry::cuda
