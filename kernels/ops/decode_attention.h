// Decode attention: the attention of generation with a KV cache. n new query tokens at positions
// [P, P+n) of ONE sequence attend to the keys and values of positions [0, P+n), held in a cache
// of `capacity` rows that the op first extends by the n new keys and values.
//
// Semantics are those of kernels/ops/attention.h restricted to the last n rows of a single
// sequence of P+n tokens, one document: query P+i (i in [0, n)) attends to key s iff s <= P+i and,
// with a window W > 0, s > P+i - W. GQA as there: query head h reads KV head h / (Hq/Hkv).
// The reference is therefore the plain attention reference (kernels/ref/attention.h) over the
// whole prefix, of which this op must reproduce the rows [P, P+n).
//
// Effects, in order: cache rows [P, P+n) of k_cache and v_cache are written (=) with k_new and
// v_new; then o (n, Hq*D) and lse (n, Hq) are written (=). Rows [0, P) are read, never written;
// rows >= P+n are untouched. Forward only (nothing is saved for a backward).
//
// Storage f32 (the generator computes in f32), math in fp32. No scratch. Thread-safety: the
// functions are pure apart from the cache rows named above; the caller owns the tensors.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct DecodeAttentionShape {
  int64_t new_tokens = 0;  // n >= 1
  int64_t past = 0;        // P >= 0: rows of the cache already filled
  int64_t capacity = 0;    // S >= P + n: rows of the cache
  int64_t q_heads = 0;     // Hq, a multiple of kv_heads
  int64_t kv_heads = 0;    // Hkv
  int64_t head_dim = 0;    // D
};

struct DecodeAttentionArgs {
  DecodeAttentionShape shape;
  Tensor q;            // f32 (n, Hq*D): the new queries (after RoPE)
  Tensor k_new;        // f32 (n, Hkv*D): the new keys (after RoPE)
  Tensor v_new;        // f32 (n, Hkv*D)
  Tensor k_cache;      // f32 (S, Hkv*D): rows [P, P+n) written, [0, P) read
  Tensor v_cache;      // f32 (S, Hkv*D): as k_cache
  Tensor o;            // f32 (n, Hq*D), written
  Tensor lse;          // f32 (n, Hq), written: log-sum-exp of each row's scaled scores
  float scale = 0;     // usually 1/sqrt(D)
  int64_t window = 0;  // W > 0: sliding window of W keys; 0: none
};

// Shapes, dtypes and parameters; InvalidArgument naming the tensor and expected vs actual.
Status ValidateDecodeAttention(const DecodeAttentionArgs& a);

// Validate, then enqueue on d's compute stream.
Status DecodeAttention(Device& d, const DecodeAttentionArgs& a);

}  // namespace ferry
