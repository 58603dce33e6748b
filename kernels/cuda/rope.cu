// RoPE on CUDA, forward (+angle) and backward (-angle), Hugging Face's rotate-half convention
// (kernels/ops/rope.h). Bit-compatible with the CPU kernel (kernels/cpu/rope.cc) up to the last
// bit of cos/sin: the inverse frequencies are the host's fp32 values (ferry::RopeInverseFrequency,
// passed by value, or the caller's table), the angle is the same fp32 product, cos and sin are
// evaluated in double and rounded to fp32, and the rotation's products and sums are rounded one
// by one (__fmul_rn, __fadd_rn: never contracted into an fma). Storage f32 or bf16 (f16 compiles
// too, for when the op accepts it), math fp32. Writes `out` (=); out may alias in (each thread
// reads both halves of its pair before writing them).
//
// A block per token; thread i handles pair i of every head, so cos/sin (double precision, slow on
// consumer GPUs) is evaluated once per (token, pair), not per head.
#include <string>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops/rope_math.h"

namespace ferry::cuda {
namespace {

// The inverse frequencies computed from theta, by value (2 KiB of kernel parameters, under the
// 4 KiB limit every architecture has).
struct RopeFrequencies {
  float f[kRopeMaxHeadDim / 2];
};

template <typename T>
__global__ void RopeKernel(const T* in,  // (N, H*D)
                           T* out,       // (N, H*D), written; may alias in
                           const int32_t* __restrict__ positions,  // (N)
                           const float* __restrict__ table,        // (R/2) or null: use freqs
                           RopeFrequencies freqs, int64_t heads, int64_t head_dim,
                           int64_t half,  // R/2
                           float sign) {  // +1 forward, -1 backward
  const int64_t token = blockIdx.x, row = token * heads * head_dim;
  const float p = float(positions[token]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = p * (table != nullptr ? table[i] : freqs.f[i]);  // RopeAngle
    double s, c;
    sincos(double(angle), &s, &c);
    const float cs = float(c), sn = sign * float(s);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t at = row + h * head_dim + i;
      const float x1 = LoadFloat(in[at]), x2 = LoadFloat(in[at + half]);
      out[at] = StoreFloat<T>(__fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn)));
      out[at + half] = StoreFloat<T>(__fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn)));
    }
  }
  if (out == in) return;
  const int64_t pass = head_dim - 2 * half;  // dims R..D-1 pass through
  for (int64_t k = threadIdx.x; k < heads * pass; k += blockDim.x) {
    const int64_t at = row + (k / pass) * head_dim + 2 * half + k % pass;
    out[at] = in[at];
  }
}

Status Rotate(CudaDevice& d, std::string_view op, const RopeArgs& a, float sign) {
  FERRY_RETURN_IF_ERROR(RequireFloatStorage(op, a.in.dtype));
  const int64_t tokens = a.in.dim(0), half = a.rotary() / 2;
  FERRY_RETURN_IF_ERROR(CheckGridRows(op, tokens));
  if (tokens == 0 || a.num_heads == 0 || a.head_dim == 0) return Status::Ok();
  RopeFrequencies freqs{};
  const float* table = nullptr;
  if (a.inv_freq.data.is_null()) {
    for (int64_t i = 0; i < half; ++i) freqs.f[i] = RopeInverseFrequency(a.theta, i, a.rotary());
  } else {
    table = BackendAccess::Data<const float>(a.inv_freq);
  }
  return d.EnqueueCompute(op, [&](const CudaContext& c) -> Status {
    WithStorageType(a.in.dtype, [&](auto t) {
      using T = decltype(t);
      RopeKernel<T>
          <<<unsigned(tokens), RowThreads(std::max(half, a.head_dim - 2 * half)), 0, c.compute>>>(
              BackendAccess::Data<const T>(a.in), BackendAccess::Data<T>(a.out),
              BackendAccess::Data<const int32_t>(a.positions), table, freqs, a.num_heads,
              a.head_dim, half, sign);
    });
    return Status::Ok();
  });
}

}  // namespace

Status RopeForward(CudaDevice& d, const RopeArgs& a) { return Rotate(d, "rope_forward", a, 1.0f); }
Status RopeBackward(CudaDevice& d, const RopeArgs& a) {
  return Rotate(d, "rope_backward", a, -1.0f);
}

}  // namespace ferry::cuda
