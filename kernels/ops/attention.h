// Causal self-attention with grouped KV heads, packed-document boundaries and an optional sliding
// window, forward and backward, in the memory-efficient (tiled, online-softmax) form: extra
// memory grows with T, never T^2.
//
// Layout: B sequences of T tokens, N = B*T rows; token t of sequence b is row b*T + t.
//   q (N, Hq*D), k and v (N, Hkv*D), o (N, Hq*D): head h occupies columns [h*D, (h+1)*D).
//   Query head h reads KV head h / (Hq/Hkv) (grouped-query attention; Hq = Hkv is plain MHA,
//   Hkv = 1 is MQA). o_i = sum_j softmax_j(scale * q_i . k_j) v_j over the allowed keys j.
//
// The mask. Query t may attend to key s of the same sequence iff
//   (1) s <= t                                  (causal),
//   (2) t - W < s      when window W > 0        (sliding window: W keys, itself included), and
//   (3) s and t lie in one document: doc_ids[b*T + u] is the same for every u in [s, t].
// (2) is Hugging Face's `sliding_window` exactly as transformers' masking_utils builds it for
// Mistral/Qwen2 (sliding_window_overlay: kv_idx > q_idx - sliding_window); W = 0 means no window.
// (3) takes documents to be contiguous runs of equal ids (a packed batch: the id changes at each
// document start); an id that reappears after a different one starts a new document. This equals
// HF's packed-sequence mask (equal ids) whenever ids increase from document to document, as HF
// derives them from position-id resets. Without doc_ids each sequence is one document.
// Every query sees at least itself, so no row of the softmax is empty.
//
// Saved for backward: o and the per-(token, head) log-sum-exp lse_i = log sum_j exp(scale q_i.k_j)
// (fp32, (N, Hq)). Backward recomputes the probabilities tile by tile from q, k, v, lse and dO
// (after Delta_i = rowsum(dO_i * o_i)) and writes dq, dk, dv: activation gradients, written (=),
// never accumulated; with GQA, dk/dv of a KV head sum over the query heads that share it.
//
// Storage: q, k, v, o, dO, dq, dk, dv share one dtype, f32 or bf16; math is fp32. Scratch: one
// byte tensor of at least AttentionScratchBytes(d, shape) (per-worker tiles plus O(N*Hq) fp32
// rows; no T x T buffer). Thread-safety: the functions are pure; the caller owns the tensors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device.h"
#include "kernels/ops/op_target.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct AttentionShape {
  int64_t batch = 0;     // B
  int64_t seq_len = 0;   // T
  int64_t q_heads = 0;   // Hq, a multiple of kv_heads
  int64_t kv_heads = 0;  // Hkv
  int64_t head_dim = 0;  // D

  int64_t tokens() const { return batch * seq_len; }
};

struct AttentionForwardArgs {
  AttentionShape shape;
  Tensor q;            // (N, Hq*D) f32|bf16
  Tensor k;            // (N, Hkv*D) same dtype
  Tensor v;            // (N, Hkv*D) same dtype
  Tensor doc_ids;      // i32 (N), optional (null data: one document per sequence)
  Tensor o;            // (N, Hq*D) same dtype, written
  Tensor lse;          // f32 (N, Hq), written: saved for backward
  Tensor scratch;      // any dtype, bytes() >= AttentionScratchBytes(device, shape)
  float scale = 0;     // usually 1/sqrt(D)
  int64_t window = 0;  // W > 0: sliding window of W keys; 0: none
};

struct AttentionBackwardArgs {
  AttentionShape shape;
  Tensor q, k, v, doc_ids;  // as in the forward
  Tensor o;                 // (N, Hq*D): the forward's output
  Tensor lse;               // f32 (N, Hq): the forward's log-sum-exp
  Tensor d_o;               // (N, Hq*D): gradient of the loss by o
  Tensor dq;                // (N, Hq*D), written (=)
  Tensor dk;                // (N, Hkv*D), written (=)
  Tensor dv;                // (N, Hkv*D), written (=)
  Tensor scratch;           // bytes() >= AttentionScratchBytes(device, shape)
  float scale = 0;
  int64_t window = 0;
};

// Shapes, dtypes and parameters; InvalidArgument naming the tensor and expected vs actual. (The
// scratch size is checked against the device by the dispatchers.)
Status ValidateAttentionForward(const AttentionForwardArgs& a);
Status ValidateAttentionBackward(const AttentionBackwardArgs& a);

// Scratch bytes for forward and backward of `shape` on `d` (one size serves both). O(T*(Hq + D))
// per sequence batch and worker; independent of T^2. 0 on devices without the op yet. For a device
// of target `t` (the planner's question) or for `d` (its target).
size_t AttentionScratchBytes(OpTarget t, const AttentionShape& shape);
size_t AttentionScratchBytes(const Device& d, const AttentionShape& shape);

// Validate, then enqueue on d's compute stream.
Status AttentionForward(Device& d, const AttentionForwardArgs& a);
Status AttentionBackward(Device& d, const AttentionBackwardArgs& a);

}  // namespace ferry
