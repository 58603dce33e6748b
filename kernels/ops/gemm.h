// GEMM: C = alpha * op(A) op(B) + beta * C (+ bias broadcast over rows), op(X) = X or X^T.
//
// The matrix product of the linear layers, with weights stored (out, in) as in PyTorch:
//   forward      y  = x W^T (+ b):  A = x (N, in), B = W (out, in), trans_b, beta = 0
//   backward dx  dx = dy W:         A = dy (N, out), B = W (out, in), beta = 0    (activation: =)
//   backward dW  dW += dy^T x:      A = dy (N, out), B = x (N, in), trans_a, beta = 1 (param: +=)
// The bias gradient (db += column sums of dy) is BiasGrad (kernels/ops/gemm_bias_grad.h).
//
// Storage: each of A, B, C and bias may be f32, bf16 or f16; math is fp32 (OpenBLAS sgemm) and
// C is rounded to its dtype once, at the end (round to nearest even). When beta == 0, C is not
// read (NaNs in it do not propagate). When A, B and C are all f32 the kernel reads and writes the
// tensors in place; otherwise it converts panels into `scratch`, whose size GemmScratchBytes
// reports for a device (0 when no conversion is needed).
// On CUDA (kernels/cuda/gemm.cu) the product is cuBLAS with fp32 compute; scratch is needed only
// for dtype mixes cuBLAS does not take (A and B of different dtypes, or C neither f32 nor A's
// dtype). One difference: with a bias and a non-f32 C, C is rounded once more (beta * C + bias
// goes into C before the product) unless beta == 0 and the bias has C's dtype.
//
// Thread-safety: pure; the caller owns the tensors. C must not overlap A, B or bias.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device.h"
#include "kernels/ops/op_target.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct GemmArgs {
  Tensor a;          // (M, K), or (K, M) when trans_a
  Tensor b;          // (K, N), or (N, K) when trans_b
  Tensor c;          // (M, N): read when beta != 0, then written
  Tensor bias{};     // (N) or not given (null data): added to every row of C
  Tensor scratch{};  // >= GemmScratchBytes(device, M, N, K, dtypes) bytes, any dtype; may be absent
                     // when that is 0
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// The storage dtypes of a GEMM's operands (what its scratch size depends on).
struct GemmDTypes {
  DType a = DType::kF32;
  DType b = DType::kF32;
  DType c = DType::kF32;
};

// Product dimensions implied by the arguments' shapes (valid after ValidateGemm).
struct GemmDims {
  int64_t m = 0, n = 0, k = 0;
};
inline GemmDims GemmDimsOf(const GemmArgs& g) {
  return {g.trans_a ? g.a.dim(1) : g.a.dim(0), g.trans_b ? g.b.dim(0) : g.b.dim(1),
          g.trans_a ? g.a.dim(0) : g.a.dim(1)};
}

// Shapes, dtypes, transposes; InvalidArgument naming the tensor and expected vs actual shape.
Status ValidateGemm(const GemmArgs& g);

// Scratch bytes a GEMM of these dimensions and dtypes needs on a device of target `t` (the
// planner's question) or on `d` (its target).
size_t GemmScratchBytes(OpTarget t, int64_t m, int64_t n, int64_t k, GemmDTypes dtypes);
size_t GemmScratchBytes(const Device& d, int64_t m, int64_t n, int64_t k, GemmDTypes dtypes);

// The CUDA GEMM, sized without a device (the planner sizes GPU plans on machines without CUDA):
// whether cuBLAS multiplies the operands as stored (A and B of one dtype, C of that dtype or f32),
// and otherwise the scratch for fp32 copies of the non-f32 operands, in this order: A (M x K),
// B (K x N), C (M x N), each rounded up to kCudaGemmScratchAlign bytes.
inline constexpr size_t kCudaGemmScratchAlign = 256;
bool CudaGemmTakesDirectly(GemmDTypes dtypes);
size_t CudaGemmScratchBytes(int64_t m, int64_t n, int64_t k, GemmDTypes dtypes);

// Validates (including the scratch size), then enqueues on d's compute stream.
Status Gemm(Device& d, const GemmArgs& g);

}  // namespace ferry
