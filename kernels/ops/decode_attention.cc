#include "kernels/ops/decode_attention.h"

#include <cmath>
#include <string>

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {

Status ValidateDecodeAttention(const DecodeAttentionArgs& a) {
  constexpr const char* kOp = "decode_attention";
  const DecodeAttentionShape& s = a.shape;
  if (s.new_tokens < 1 || s.past < 0 || s.capacity < s.past + s.new_tokens || s.q_heads < 1 ||
      s.kv_heads < 1 || s.head_dim < 1 || s.q_heads % s.kv_heads != 0) {
    return Status::InvalidArgument(
        "decode_attention: need n >= 1, P >= 0, capacity >= P + n, heads and head_dim >= 1, "
        "q_heads a multiple of kv_heads; got n=" +
        std::to_string(s.new_tokens) + " P=" + std::to_string(s.past) +
        " S=" + std::to_string(s.capacity) + " Hq=" + std::to_string(s.q_heads) +
        " Hkv=" + std::to_string(s.kv_heads) + " D=" + std::to_string(s.head_dim) +
        (s.capacity < s.past + s.new_tokens ? " (the KV cache is full: raise its size)" : ""));
  }
  if (!std::isfinite(a.scale) || !(a.scale > 0.0f)) {
    return Status::InvalidArgument("decode_attention: scale must be finite and > 0");
  }
  if (a.window < 0) return Status::InvalidArgument("decode_attention: window must be >= 0");
  const int64_t n = s.new_tokens, qw = s.q_heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  const DType f = DType::kF32;
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(kOp, "q", a.q, Shape{n, qw}, f));
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(kOp, "k_new", a.k_new, Shape{n, kw}, f));
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(kOp, "v_new", a.v_new, Shape{n, kw}, f));
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(kOp, "k_cache", a.k_cache, Shape{s.capacity, kw}, f));
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(kOp, "v_cache", a.v_cache, Shape{s.capacity, kw}, f));
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(kOp, "o", a.o, Shape{n, qw}, f));
  return CheckTensorOfType(kOp, "lse", a.lse, Shape{n, s.q_heads}, f);
}

Status DecodeAttention(Device& d, const DecodeAttentionArgs& a) {
  return RunKernel(d, &Backend::decode_attention, ValidateDecodeAttention, a);
}

}  // namespace ferry
