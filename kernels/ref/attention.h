// Reference attention (semantics and mask in kernels/ops/attention.h): the obvious masked
// softmax, materializing each (sequence, head)'s full T x T probability matrix, in the real type
// R (float or double), for tests only. The mask is evaluated from its definition (every token
// between key and query checked for the same document id), independently of the fast kernels'
// mask bounds. Backward writes dq, dk, dv (activation gradients: =) and does not use o or lse.
#pragma once

#include <cstdint>

namespace ferry::ref {

struct AttentionDims {
  int64_t batch = 0;     // B
  int64_t seq_len = 0;   // T
  int64_t q_heads = 0;   // Hq
  int64_t kv_heads = 0;  // Hkv (divides Hq)
  int64_t head_dim = 0;  // D
  int64_t window = 0;    // W > 0: sliding window; 0: none
  double scale = 0;
};

// True when query t of sequence b may attend to key s. doc_ids (B*T) may be null.
bool AttentionAllowed(const int32_t* doc_ids, const AttentionDims& dims, int64_t b, int64_t t,
                      int64_t s);

template <typename R>
void AttentionForward(const R* q,              // (B*T, Hq*D)
                      const R* k,              // (B*T, Hkv*D)
                      const R* v,              // (B*T, Hkv*D)
                      const int32_t* doc_ids,  // (B*T) or null
                      const AttentionDims& dims,
                      R* o,     // (B*T, Hq*D)
                      R* lse);  // (B*T, Hq)

template <typename R>
void AttentionBackward(const R* q, const R* k, const R* v, const int32_t* doc_ids,
                       const R* d_o,  // (B*T, Hq*D)
                       const AttentionDims& dims,
                       R* dq,   // (B*T, Hq*D)
                       R* dk,   // (B*T, Hkv*D)
                       R* dv);  // (B*T, Hkv*D)

}  // namespace ferry::ref
