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
// Storage: q, k, v, o, dO, dq, dk, dv share one dtype, f32, bf16 or f16; math is fp32. The CPU
// kernels take f32 and bf16; the CUDA kernels (cuDNN's fused SDPA, kernels/cuda/attention_cudnn.h)
// take bf16 and f16 only, head_dim a multiple of 8 up to 256, and their backward is not
// deterministic (cuDNN has no deterministic mode for the ragged layout packed documents use).
// Scratch: one byte tensor of at least AttentionScratchBytes(d, shape) (CPU: per-worker tiles
// plus O(N*Hq) fp32 rows; CUDA: CudaAttentionLayout; no T x T buffer). Thread-safety: the
// functions are pure; the caller owns the tensors.
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
  // The most documents one call holds, all sequences together (doc_ids given): the CUDA kernels
  // run each document as one cuDNN sequence and size their graph and scratch by it; 0 means
  // `batch` (one document per sequence). A call holding more fails its stream on CUDA with an
  // error naming this field. The CPU kernels ignore it.
  int64_t max_documents = 0;

  int64_t tokens() const { return batch * seq_len; }
  // max_documents, or batch when 0.
  int64_t documents() const { return max_documents > 0 ? max_documents : batch; }
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

// The CUDA kernels' scratch (kernels/cuda/attention_cudnn.cc), computed without CUDA (the planner
// sizes GPU plans anywhere): byte offsets of its pieces, each aligned to kCudaAttentionAlign.
// With G = shape.documents() cuDNN sequences of up to T tokens:
//   stats      f32 (G, Hq, T): cuDNN's log-sum-exp in its packed layout (its backward reads no
//              other layout on sm_8x/sm_12x), moved to and from the args' lse (N, Hq);
//   seq_len    i32 (G): tokens per document (0 for padding sequences);
//   q_offset   i32 (G + 1): element offset of each document in q/o/dq (start row * Hq*D);
//   kv_offset  i32 (G + 1): the same in k/v/dk/dv (start row * Hkv*D);
//   doc_start  i32 (G + 1): each document's first row; token_doc i32 (N): each row's document;
//   count      i32: documents found (checked against G);
//   workspace  cuDNN's workspace, bounded (it is only known once a graph is built): the
//              backward's fp32 accumulators over R = Hq * max(N, G * (T rounded up to 128)) rows,
//              R * (D + 1) * 4 bytes for dq and the softmax sums, plus 2 * R * D * 4 for dk and
//              dv at full head count when Hkv < Hq; at least 2 * N * Hq * (D + 2) * 4; plus
//              1 MiB. A graph asking for more fails its call with an error naming both sizes.
inline constexpr size_t kCudaAttentionAlign = 256;
struct CudaAttentionLayout {
  size_t stats = 0, seq_len = 0, q_offset = 0, kv_offset = 0, doc_start = 0, token_doc = 0,
         count = 0, workspace = 0;
  size_t workspace_bytes = 0;
  size_t total = 0;
};
CudaAttentionLayout MakeCudaAttentionLayout(const AttentionShape& shape);

// Validate, then enqueue on d's compute stream.
Status AttentionForward(Device& d, const AttentionForwardArgs& a);
Status AttentionBackward(Device& d, const AttentionBackwardArgs& a);

}  // namespace ferry
