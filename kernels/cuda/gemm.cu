// GEMM on CUDA (semantics: kernels/ops/gemm.h) through cublasGemmEx with fp32 compute
// (CUBLAS_COMPUTE_32F: neither TF32 nor fp16 accumulation), on the device's compute stream and
// cuBLAS workspace. On a device made with CudaDeviceOptions::gemm_f16_accumulate (`--dtype
// fp16acc`), a direct GEMM whose A, B and C are all f16 accumulates in fp16 instead
// (CUBLAS_COMPUTE_16F, half scalars): each partial sum is rounded to fp16 (u = 2^-11), so its error
// grows with K as the summation bound says, against fp32's 2^-24; a bias is added first, as below.
//
// Row-major tensors are handed to cuBLAS (column-major) as their transposes:
// C^T (N x M) = op(B)^T (N x K) op(A)^T (K x M), so B is cuBLAS's first operand.
// Paths:
//  - direct: A and B share a dtype and C has it too or is f32 (what cublasGemmEx takes). With a
//    bias, C = beta * C + bias is written first (stored in C's dtype) and the product is added
//    with beta 1, then rounded to C's dtype. For an f32 C, or a bias of C's dtype with beta 0
//    (the linear layers' forward), the bias reaches C unrounded and C is rounded once, as on the
//    CPU; otherwise beta * C + bias is rounded to C's dtype once more before the product is added.
//  - converted: any other mix. The non-f32 operands are widened to fp32 in scratch, the product
//    accumulates in an fp32 C (scratch when C is not f32) and is rounded to C's dtype once.
//  - K == 0: C = beta * C + bias, in one kernel.
// Writes C (=, or += through beta); accumulates nothing else.
#include <cassert>
#include <climits>
#include <string>

#include "kernels/backend_access.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise.cuh"

namespace ferry::cuda {
namespace {

// The scratch layout of CudaGemmScratchBytes (kernels/ops/gemm.h).
size_t AlignUp(size_t v) {
  return (v + kCudaGemmScratchAlign - 1) / kCudaGemmScratchAlign * kCudaGemmScratchAlign;
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF32:
    case DType::kI32:  // excluded by ValidateGemm
    case DType::kU8:
      break;
  }
  return CUDA_R_32F;
}

// out[i, j] = (beta != 0 ? beta * c[i, j] : 0) + (bias ? bias[j] : 0), math in fp32, stored
// rounded to out's dtype. c is not read when beta == 0. out may be c itself (each element is read
// before it is written).
template <typename C, typename Bias, typename Out>
__global__ void GemmPrologueKernel(const C* c,                     // (m, n)
                                   const Bias* __restrict__ bias,  // (n) or null
                                   Out* out,                       // (m, n)
                                   float beta, int64_t n, int64_t total) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    float v = beta != 0.0f ? beta * LoadFloat(c[i]) : 0.0f;
    if (bias != nullptr) v += LoadFloat(bias[i % n]);
    out[i] = StoreFloat<Out>(v);
  }
}

// Enqueues the prologue writing `out` (f32 or C's dtype) from C and the bias.
Status Prologue(CudaDevice& d, const GemmArgs& g, const Tensor& out) {
  const int64_t total = out.numel(), n = out.dim(1);
  if (total == 0) return Status::Ok();
  const bool has_bias = !g.bias.data.is_null();
  return d.EnqueueCompute("gemm (bias)", [&](const CudaContext& ctx) -> Status {
    WithStorageType(g.c.dtype, [&](auto c_tag) {
      using C = decltype(c_tag);
      WithStorageType(has_bias ? g.bias.dtype : DType::kF32, [&](auto bias_tag) {
        using Bias = decltype(bias_tag);
        WithStorageType(out.dtype, [&](auto out_tag) {
          using Out = decltype(out_tag);
          GemmPrologueKernel<C, Bias, Out>
              <<<ElementwiseBlocks(ctx, total), kElementwiseThreads, 0, ctx.compute>>>(
                  BackendAccess::Data<C>(g.c),
                  has_bias ? BackendAccess::Data<Bias>(g.bias) : nullptr,
                  BackendAccess::Data<Out>(out), g.beta, n, total);
        });
      });
    });
    return Status::Ok();
  });
}

Status CheckInt(int64_t v, const char* what) {
  if (v <= INT_MAX) return Status::Ok();
  return Status::InvalidArgument(std::string("gemm on CUDA: ") + what + " = " + std::to_string(v) +
                                 " exceeds cuBLAS's 32-bit limit");
}

// C = alpha op(A) op(B) + beta C through cublasGemmEx, with `compute` CUBLAS_COMPUTE_32F or (all
// f16) CUBLAS_COMPUTE_16F, whose scalars are half.
Status GemmEx(const CudaContext& ctx, const StridedGemm& g, cublasComputeType_t compute) {
  FERRY_RETURN_IF_ERROR(CheckInt(g.m, "M"));
  FERRY_RETURN_IF_ERROR(CheckInt(g.n, "N"));
  FERRY_RETURN_IF_ERROR(CheckInt(g.k, "K"));
  FERRY_RETURN_IF_ERROR(CheckInt(g.lda, "lda"));
  FERRY_RETURN_IF_ERROR(CheckInt(g.ldb, "ldb"));
  FERRY_RETURN_IF_ERROR(CheckInt(g.ldc, "ldc"));
  const __half alpha_h = __float2half(g.alpha), beta_h = __float2half(g.beta);
  const bool half_scale = compute == CUBLAS_COMPUTE_16F;
  const void* alpha_p = half_scale ? static_cast<const void*>(&alpha_h) : &g.alpha;
  const void* beta_p = half_scale ? static_cast<const void*>(&beta_h) : &g.beta;
  return CublasStatus(
      cublasGemmEx(ctx.cublas, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                   g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(g.n), int(g.m), int(g.k), alpha_p,
                   g.b, CudaType(g.b_dtype), int(g.ldb), g.a, CudaType(g.a_dtype), int(g.lda),
                   beta_p, g.c, CudaType(g.c_dtype), int(g.ldc), compute, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx (" + std::to_string(g.m) + " x " + std::to_string(g.n) + " x " +
          std::to_string(g.k) + ")");
}

// The same on whole tensors: the row strides are the tensors' widths.
Status CublasGemm(CudaDevice& d, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                  const Tensor& c, float alpha, float beta, cublasComputeType_t compute) {
  const StridedGemm g{.a = BackendAccess::Raw(a.data),
                      .a_dtype = a.dtype,
                      .lda = a.dim(1),
                      .trans_a = trans_a,
                      .b = BackendAccess::Raw(b.data),
                      .b_dtype = b.dtype,
                      .ldb = b.dim(1),
                      .trans_b = trans_b,
                      .c = BackendAccess::Raw(c.data),
                      .c_dtype = c.dtype,
                      .ldc = c.dim(1),
                      .m = c.dim(0),
                      .n = c.dim(1),
                      .k = trans_a ? a.dim(0) : a.dim(1),
                      .alpha = alpha,
                      .beta = beta};
  return d.EnqueueCompute("gemm", [&](const CudaContext& ctx) { return GemmEx(ctx, g, compute); });
}

// A view of `like`'s shape in fp32 at `offset` bytes into the scratch.
Tensor ScratchF32(const GemmArgs& g, size_t offset, const Tensor& like) {
  return Tensor{g.scratch.data + std::ptrdiff_t(offset), DType::kF32, like.shape};
}

}  // namespace

Status CublasStridedGemm(const CudaContext& ctx, const StridedGemm& g) {
  return GemmEx(ctx, g, CUBLAS_COMPUTE_32F);
}

Status Gemm(CudaDevice& d, const GemmArgs& g) {
  const GemmDims dims = GemmDimsOf(g);
  if (dims.m == 0 || dims.n == 0) return Status::Ok();
  // An empty product: C = beta * C + bias, rounded once (cuBLAS would reject the zero leading
  // dimensions of empty operands).
  if (dims.k == 0) return Prologue(d, g, g.c);
  const bool has_bias = !g.bias.data.is_null();
  if (CudaGemmTakesDirectly({g.a.dtype, g.b.dtype, g.c.dtype})) {
    float beta = g.beta;
    if (has_bias) {
      FERRY_RETURN_IF_ERROR(Prologue(d, g, g.c));
      beta = 1.0f;
    }
    const bool f16_accumulate = d.gemm_f16_accumulate() && g.a.dtype == DType::kF16 &&
                                g.b.dtype == DType::kF16 && g.c.dtype == DType::kF16;
    return CublasGemm(d, g.a, g.trans_a, g.b, g.trans_b, g.c, g.alpha, beta,
                      f16_accumulate ? CUBLAS_COMPUTE_16F : CUBLAS_COMPUTE_32F);
  }
  // Converted path: fp32 copies of the non-f32 operands, an fp32 accumulator for C.
  size_t offset = 0;
  Tensor a = g.a, b = g.b, acc = g.c;
  if (g.a.dtype != DType::kF32) {
    a = ScratchF32(g, offset, g.a);
    offset += AlignUp(g.a.bytes() / DTypeSize(g.a.dtype) * 4);
    FERRY_RETURN_IF_ERROR(Cast(d, g.a, a));
  }
  if (g.b.dtype != DType::kF32) {
    b = ScratchF32(g, offset, g.b);
    offset += AlignUp(g.b.bytes() / DTypeSize(g.b.dtype) * 4);
    FERRY_RETURN_IF_ERROR(Cast(d, g.b, b));
  }
  float beta = g.beta;
  if (g.c.dtype != DType::kF32) {
    acc = ScratchF32(g, offset, g.c);
    // The accumulator starts as beta * C + bias (C read only when beta != 0), in fp32.
    FERRY_RETURN_IF_ERROR(Prologue(d, g, acc));
    beta = 1.0f;
  } else if (has_bias) {
    FERRY_RETURN_IF_ERROR(Prologue(d, g, acc));
    beta = 1.0f;
  }
  FERRY_RETURN_IF_ERROR(
      CublasGemm(d, a, g.trans_a, b, g.trans_b, acc, g.alpha, beta, CUBLAS_COMPUTE_32F));
  if (g.c.dtype != DType::kF32) FERRY_RETURN_IF_ERROR(Cast(d, acc, g.c));
  return Status::Ok();
}

Status GemmF16Accumulate(CudaDevice& d, const GemmArgs& g) {
  if (g.a.dtype != DType::kF16 || g.b.dtype != DType::kF16 || g.c.dtype != DType::kF16 ||
      !g.bias.data.is_null()) {
    return Status::InvalidArgument(
        "gemm with fp16 accumulation: a, b and c must be f16 and no bias is given, got a " +
        g.a.ToString() + ", b " + g.b.ToString() + ", c " + g.c.ToString());
  }
  if (g.c.numel() == 0) return Status::Ok();
  if (GemmDimsOf(g).k == 0) {
    return Status::InvalidArgument("gemm with fp16 accumulation: K is 0 (nothing to measure)");
  }
  return CublasGemm(d, g.a, g.trans_a, g.b, g.trans_b, g.c, g.alpha, g.beta, CUBLAS_COMPUTE_16F);
}

}  // namespace ferry::cuda
