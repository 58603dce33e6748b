// Fused LM head + cross-entropy: logits = h W^T, loss = -log softmax(logits)[target], computed a
// chunk of tokens at a time so the (N, V) logits never exist: only a (chunk, V) fp32 block does,
// in scratch. The head is the model's tail, so the training variant runs forward and backward in
// the same pass and returns dh and dW with the loss; without a dw tensor (a frozen head: LoRA) it
// skips the weight-gradient products altogether and returns dh alone.
//
// Semantics (PyTorch's cross_entropy with reduction='sum', divided by a caller-given count):
//   token_loss[i] = -log softmax(h_i W^T)[t_i]          (0 where t_i == kIgnoreIndex)
//   loss_sum      = sum_i token_loss[i] / normalizer
// `normalizer` is the number of non-ignored targets of the whole global batch (known before the
// step), so accumulating dW over micro-batches gives exactly the gradient of one big batch.
// Gradients are of loss_sum * loss_scale (loss_scale: fp16 dynamic loss scaling; 1 otherwise):
//   dh = (P - Y) W * s       written (`=`), activation gradient
//   dW += (P - Y)^T h * s    accumulated (`+=`), parameter gradient
// with P the softmax, Y the one-hot targets (zero rows for ignored tokens), s = loss_scale /
// normalizer. Math is fp32 (log-sum-exp sums in double); h, W, dh are stored f32 or bf16; dW is
// f32 or W's dtype (bf16 dW is rounded once per chunk of tokens). dh does not depend on whether dW
// is computed: the same chunking gives the same bits with or without it.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/device.h"
#include "kernels/ops/op_target.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

// Targets equal to this are masked (PyTorch's default ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

struct LmHeadLossArgs {
  Tensor h;                          // (N, C) f32 | bf16 hidden states (after the final norm)
  Tensor w;                          // (V, C) head weight, h's dtype
  DevicePtr<const int32_t> targets;  // (N) ids in [0, V) or kIgnoreIndex
  double normalizer = 1;             // > 0: non-ignored targets of the global batch
  double loss_scale = 1;             // > 0: multiplies the gradients only
  int64_t chunk_tokens = 256;        // tokens per logits block; scratch grows with it
  Tensor token_loss;                 // (N) f32, optional (null data): unscaled -log p, 0 if ignored
  Tensor loss_sum;                   // (1) f32, optional: sum of token_loss / normalizer, `=`
  Tensor dh;                         // (N, C) h's dtype, written `=` (forward-backward only)
  Tensor dw;                         // (V, C) f32 | w's dtype, accumulated `+=` (fwd-bwd only);
                                     // optional (null data): no weight gradient (frozen head)
  Tensor scratch;                    // >= LmHeadLossScratchBytes bytes, any dtype
};

// Shapes and dtypes (InvalidArgument naming the tensor, the expected and the actual shape).
// `backward`: dh is required; dw is optional (null data: no weight gradient). Target values are
// device data: the kernel checks them and fails the stream with InvalidArgument naming the first
// bad one.
Status ValidateLmHeadLoss(const LmHeadLossArgs& a, bool backward);

// Scratch bytes for chunks of `chunk_tokens` tokens: O(chunk_tokens * V) plus per-worker panels
// of O(C * (chunk_tokens + 128)), independent of N. On a CPU device it depends on the device's
// thread count; on CUDA it is CudaLmHeadLossLayout's total. `dw_dtype`: dW's
// storage, or nullopt when the pass computes no dW (forward only, or a frozen head); never more
// than with a dW. For a device of target `t` (the planner's question) or for `d` (its target).
size_t LmHeadLossScratchBytes(OpTarget t, int64_t chunk_tokens, int64_t V, int64_t C, DType h_dtype,
                              std::optional<DType> dw_dtype, bool backward);
size_t LmHeadLossScratchBytes(const Device& d, int64_t chunk_tokens, int64_t V, int64_t C,
                              DType h_dtype, std::optional<DType> dw_dtype, bool backward);

// The CUDA kernel's scratch (kernels/cuda/lm_head_loss.cu), computed without CUDA (the planner
// sizes GPU plans anywhere): byte offsets of its pieces, each rounded up to kCudaLmHeadLossAlign.
// Panels exist only for bf16 h in the backward (cuBLAS multiplies no fp32 x bf16 mix: W is
// widened panel_rows rows at a time); an absent piece has offset 0 and no bytes.
inline constexpr size_t kCudaLmHeadLossAlign = 256;
inline constexpr int64_t kCudaLmHeadLossPanelRows = 1024;  // W rows widened per product
inline constexpr size_t kCudaLmHeadLossStateBytes = 256;   // loss sum and first bad target
struct CudaLmHeadLossLayout {
  size_t logits = 0;       // (chunk, V) f32: logits, then (P - Y) s in place (backward)
  size_t chunk_loss = 0;   // (chunk) f32: token losses when a.token_loss is not given
  size_t state = 0;        // the loss sum (double), the first bad target's index and value
  size_t h_panel = 0;      // (chunk, C) f32: h widened, for dW (bf16 h with a dW)
  size_t w_panel = 0;      // (panel_rows, C) f32: W rows widened, or a dW block (bf16 h, backward)
  size_t dh_acc = 0;       // (chunk, C) f32: dh before its rounding (bf16 h, backward)
  int64_t panel_rows = 0;  // min(V, kCudaLmHeadLossPanelRows) where there are panels
  size_t total = 0;
};
CudaLmHeadLossLayout MakeCudaLmHeadLossLayout(int64_t chunk_tokens, int64_t V, int64_t C,
                                              DType h_dtype, std::optional<DType> dw_dtype,
                                              bool backward);

// dW's storage dtype for a pass over `a`: nullopt when the pass computes no dW (forward only, or
// no a.dw). What LmHeadLossScratchBytes takes for that pass.
inline std::optional<DType> LmHeadLossWeightGradDType(const LmHeadLossArgs& a, bool backward) {
  if (!backward || a.dw.data.is_null()) return std::nullopt;
  return a.dw.dtype;
}

// Loss only (evaluation): token_loss and/or loss_sum. dh, dw are not touched.
Status LmHeadLossForward(Device& d, const LmHeadLossArgs& a);
// Loss, dh (`=`) and, when a.dw is given, dW (`+=`) in one pass over the tokens.
Status LmHeadLossForwardBackward(Device& d, const LmHeadLossArgs& a);

}  // namespace ferry
