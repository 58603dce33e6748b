// CUDA implementations of the ops, reached through the CUDA backend's table
// (kernels/cuda/cuda_backend.cc) after the op files (kernels/ops/<op>.cc) have validated the
// arguments. Each enqueues on the device's compute stream and returns launch errors; faults
// during the run come back from the next synchronize (kernels/device.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_device.h"
#include "kernels/ops/adamw.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/decode_attention.h"
#include "kernels/ops/gelu.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/gemm_bias_grad.h"
#include "kernels/ops/layernorm.h"
#include "kernels/ops/lm_head_loss.h"
#include "kernels/ops/nf4_dequantize.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry::cuda {

// dst = src converted to dst.dtype, rounding to nearest even (f32 <-> bf16 <-> f16; the same
// dtype copies; a same-dtype cast onto itself does nothing). REQUIRES: src.numel() ==
// dst.numel(); both on `d`; no overlap unless dst is src itself.
Status Cast(CudaDevice& d, const Tensor& src, const Tensor& dst);

// y = a + b element-wise, math in fp32, stored rounded to nearest even; each tensor f32, bf16 or
// f16 of its own. y may alias a or b (y = a = dx is the residual gradient's dx += dy).
// REQUIRES: a, b and y have one element count; all on `d`.
Status Residual(CudaDevice& d, const Tensor& a, const Tensor& b, const Tensor& y);

// C = alpha op(A) op(B) + beta C (+ bias) with fp32 math on cuBLAS (kernels/cuda/gemm.cu says
// where C is rounded). REQUIRES: ValidateGemm(g) is ok, the scratch holds CudaGemmScratchBytes; all
// tensors on `d`.
Status Gemm(CudaDevice& d, const GemmArgs& g);

// One cuBLAS product C = alpha op(A) op(B) + beta C on row-major blocks with explicit row strides
// (elements from one row to the next), fp32 compute, mapped to cuBLAS as Gemm maps its tensors:
// for ops that multiply column blocks of their tensors (lm_head_loss.cu). A is (m, k) or (k, m)
// when trans_a, B is (k, n) or (n, k) when trans_b, C is (m, n). InvalidArgument when a dimension
// or stride exceeds cuBLAS's int. REQUIRES: A and B of one dtype, C of it or f32; m, n, k >= 1;
// called inside an EnqueueCompute launch on ctx.
struct StridedGemm {
  const void* a = nullptr;
  DType a_dtype = DType::kF32;
  int64_t lda = 0;
  bool trans_a = false;
  const void* b = nullptr;
  DType b_dtype = DType::kF32;
  int64_t ldb = 0;
  bool trans_b = false;
  void* c = nullptr;
  DType c_dtype = DType::kF32;
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
};
Status CublasStridedGemm(const CudaContext& ctx, const StridedGemm& g);

// The same product with fp16 inputs, output and accumulation (CUBLAS_COMPUTE_16F): for measuring
// that rate only (`ferry probe`), never for training (fp16 sums lose precision quickly).
// InvalidArgument unless a, b and c are f16 and no bias is given.
Status GemmF16Accumulate(CudaDevice& d, const GemmArgs& g);

// The ops below follow their op headers (kernels/ops/<op>.h) exactly: the same formulas, the same
// rounding points, the same accumulate (+=) vs write (=) rule; math in fp32 whatever the storage.
// REQUIRES: the op's Validate* is ok; all tensors on `d`.

// GELU forward and backward (exact and tanh), elementwise (kernels/cuda/gelu.cu).
Status GeluForward(CudaDevice& d, const GeluForwardArgs& a);
Status GeluBackward(CudaDevice& d, const GeluBackwardArgs& a);

// SwiGLU forward and backward over [gate | up] rows (kernels/cuda/swiglu.cu).
Status SwiGluForward(CudaDevice& d, const SwiGluForwardArgs& a);
Status SwiGluBackward(CudaDevice& d, const SwiGluBackwardArgs& a);

// Row norms, a block per row; parameter gradients and BiasGrad reduce columns in a fixed order
// inside one block per column tile, so they need no scratch and are deterministic
// (kernels/cuda/norms.cu).
Status RmsNormForward(CudaDevice& d, const RmsNormForwardArgs& a);
Status RmsNormBackward(CudaDevice& d, const RmsNormBackwardArgs& a);
Status LayerNormForward(CudaDevice& d, const LayerNormForwardArgs& a);
Status LayerNormBackward(CudaDevice& d, const LayerNormBackwardArgs& a);
Status BiasGrad(CudaDevice& d, const BiasGradArgs& a);

// RoPE: rotate by +angle (forward) or -angle (backward) (kernels/cuda/rope.cu).
Status RopeForward(CudaDevice& d, const RopeArgs& a);
Status RopeBackward(CudaDevice& d, const RopeArgs& a);

// Fused LM head + cross-entropy, chunk by chunk: cuBLAS products around a row kernel for the
// softmax (kernels/cuda/lm_head_loss.cu). Bad targets fail the stream (EnqueueComputeCheck).
Status LmHeadLossForward(CudaDevice& d, const LmHeadLossArgs& a);
Status LmHeadLossForwardBackward(CudaDevice& d, const LmHeadLossArgs& a);

// Causal attention forward and backward through cuDNN's fused SDPA, bf16/f16 only; packed
// documents as ragged sequences; the backward is not deterministic
// (kernels/cuda/attention_cudnn.h).
Status AttentionForward(CudaDevice& d, const AttentionForwardArgs& a);
Status AttentionBackward(CudaDevice& d, const AttentionBackwardArgs& a);

// Decode attention over a KV cache, f32: the new rows written into the cache, then a block per
// (new token, query head) with an online softmax per warp, merged in warp order
// (kernels/cuda/decode_attention.cu).
Status DecodeAttention(CudaDevice& d, const DecodeAttentionArgs& a);

// One AdamW update with its state in device memory, bit for bit torch's fp32 order
// (kernels/cuda/adamw.cu).
Status AdamWStep(CudaDevice& d, const AdamWArgs& a);

// NF4 dequantization, a thread per packed byte, the CPU kernel's fp32 products
// (kernels/cuda/nf4_dequantize.cu).
Status Nf4Dequantize(CudaDevice& d, const Nf4DequantizeArgs& a);

}  // namespace ferry::cuda
