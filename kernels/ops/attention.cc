#include "kernels/ops/attention.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {
namespace {

// The checks forward and backward share: shape parameters, q/k/v, doc_ids, lse, scale, window.
Status ValidateCommon(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& doc_ids, const Tensor& lse, float scale, int64_t window) {
  if (s.batch < 1 || s.seq_len < 1 || s.q_heads < 1 || s.kv_heads < 1 || s.head_dim < 1 ||
      s.q_heads % s.kv_heads != 0) {
    return Status::InvalidArgument(
        "attention: need batch, seq_len, heads, head_dim >= 1 and q_heads a multiple of "
        "kv_heads, got B=" +
        std::to_string(s.batch) + " T=" + std::to_string(s.seq_len) +
        " Hq=" + std::to_string(s.q_heads) + " Hkv=" + std::to_string(s.kv_heads) +
        " D=" + std::to_string(s.head_dim));
  }
  if (s.tokens() > int64_t(INT32_MAX)) {
    return Status::InvalidArgument("attention: more than 2^31 tokens; split the batch");
  }
  if (!std::isfinite(scale) || !(scale > 0.0f)) {
    return Status::InvalidArgument("attention: scale must be finite and > 0 (usually 1/sqrt(D))");
  }
  if (window < 0) return Status::InvalidArgument("attention: window must be >= 0 (0 = none)");
  if (s.max_documents != 0 && (s.max_documents < s.batch || s.max_documents > s.tokens())) {
    return Status::InvalidArgument(
        "attention: max_documents must be 0 (one per sequence) or in [batch = " +
        std::to_string(s.batch) + ", tokens = " + std::to_string(s.tokens()) +
        "] (every sequence holds at least one document), got " + std::to_string(s.max_documents));
  }
  if (q.dtype != DType::kF32 && q.dtype != DType::kBF16 && q.dtype != DType::kF16) {
    return Status::InvalidArgument("attention: tensor 'q' must be f32, bf16 or f16, got " +
                                   q.ToString());
  }
  const int64_t n = s.tokens();
  FERRY_RETURN_IF_ERROR(
      CheckExactTensor("attention", "q", q, q.dtype, Shape{n, s.q_heads * s.head_dim}));
  FERRY_RETURN_IF_ERROR(
      CheckExactTensor("attention", "k", k, q.dtype, Shape{n, s.kv_heads * s.head_dim}));
  FERRY_RETURN_IF_ERROR(
      CheckExactTensor("attention", "v", v, q.dtype, Shape{n, s.kv_heads * s.head_dim}));
  if (!doc_ids.data.is_null()) {
    FERRY_RETURN_IF_ERROR(CheckExactTensor("attention", "doc_ids", doc_ids, DType::kI32, Shape{n}));
  }
  return CheckExactTensor("attention", "lse", lse, DType::kF32, Shape{n, s.q_heads});
}

Status ValidateScratch(const Device& d, const AttentionShape& s, const Tensor& scratch) {
  const size_t need = AttentionScratchBytes(d, s);
  if (need > 0 && (scratch.data.is_null() || scratch.bytes() < need)) {
    return Status::InvalidArgument("attention: scratch tensor holds " +
                                   std::to_string(scratch.data.is_null() ? 0 : scratch.bytes()) +
                                   " bytes, device '" + d.name() + "' needs " +
                                   std::to_string(need) + ": size it with AttentionScratchBytes");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateAttentionForward(const AttentionForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(
      ValidateCommon(a.shape, a.q, a.k, a.v, a.doc_ids, a.lse, a.scale, a.window));
  return CheckExactTensor("attention", "o", a.o, a.q.dtype, a.q.shape);
}

Status ValidateAttentionBackward(const AttentionBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(
      ValidateCommon(a.shape, a.q, a.k, a.v, a.doc_ids, a.lse, a.scale, a.window));
  FERRY_RETURN_IF_ERROR(CheckExactTensor("attention", "o", a.o, a.q.dtype, a.q.shape));
  FERRY_RETURN_IF_ERROR(CheckExactTensor("attention", "d_o", a.d_o, a.q.dtype, a.q.shape));
  FERRY_RETURN_IF_ERROR(CheckExactTensor("attention", "dq", a.dq, a.q.dtype, a.q.shape));
  FERRY_RETURN_IF_ERROR(CheckExactTensor("attention", "dk", a.dk, a.q.dtype, a.k.shape));
  return CheckExactTensor("attention", "dv", a.dv, a.q.dtype, a.v.shape);
}

size_t AttentionScratchBytes(OpTarget t, const AttentionShape& shape) {
  return ScratchReportsFor(t.kind).attention(t.threads, shape);
}

size_t AttentionScratchBytes(const Device& d, const AttentionShape& shape) {
  return AttentionScratchBytes(OpTargetOf(d), shape);
}

CudaAttentionLayout MakeCudaAttentionLayout(const AttentionShape& s) {
  CudaAttentionLayout L;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t offset = at;
    at += (bytes + kCudaAttentionAlign - 1) / kCudaAttentionAlign * kCudaAttentionAlign;
    return offset;
  };
  const size_t g = size_t(s.documents()), n = size_t(s.tokens()), hq = size_t(s.q_heads);
  L.stats = take(g * hq * size_t(s.seq_len) * 4);
  L.seq_len = take(g * 4);
  L.q_offset = take((g + 1) * 4);
  L.kv_offset = take((g + 1) * 4);
  L.doc_start = take((g + 1) * 4);
  L.token_doc = take(n * 4);
  L.count = take(4);
  // The backward's fp32 accumulators, over the larger of the packed tokens and the G sequences
  // padded to 128 rows: dq and the softmax sums, and with grouped KV heads dk and dv at full
  // head count before their reduction. No smaller than the packed tokens' bound, twice.
  const size_t d = size_t(s.head_dim), padded = g * ((size_t(s.seq_len) + 127) / 128 * 128);
  const size_t rows = std::max(n, padded) * hq;
  const size_t accumulators = rows * (d + 1) * 4 + (s.kv_heads < s.q_heads ? 2 * rows * d * 4 : 0);
  L.workspace_bytes = std::max(2 * n * hq * (d + 2) * 4, accumulators) + (size_t(1) << 20);
  L.workspace = take(L.workspace_bytes);
  L.total = at;
  return L;
}

Status AttentionForward(Device& d, const AttentionForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateAttentionForward(a));
  FERRY_RETURN_IF_ERROR(ValidateScratch(d, a.shape, a.scratch));  // 0 bytes where not yet
  return RunKernel(d, &Backend::attention_forward, a);
}

Status AttentionBackward(Device& d, const AttentionBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateAttentionBackward(a));
  FERRY_RETURN_IF_ERROR(ValidateScratch(d, a.shape, a.scratch));  // 0 bytes where not yet
  return RunKernel(d, &Backend::attention_backward, a);
}

}  // namespace ferry
