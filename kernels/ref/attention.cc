#include "kernels/ref/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace ferry::ref {

bool AttentionAllowed(const int32_t* doc_ids, const AttentionDims& dims, int64_t b, int64_t t,
                      int64_t s) {
  if (s > t) return false;
  if (dims.window > 0 && s <= t - dims.window) return false;
  if (doc_ids != nullptr) {
    for (int64_t u = s; u <= t; ++u) {
      if (doc_ids[b * dims.seq_len + u] != doc_ids[b * dims.seq_len + t]) return false;
    }
  }
  return true;
}

namespace {

// P (T, T) = masked softmax(scale * q k^T) of one (sequence, query head); masked entries 0.
// Also returns each row's log-sum-exp.
template <typename R>
void Probabilities(const R* q, const R* k, const int32_t* doc_ids, const AttentionDims& dims,
                   int64_t b, int64_t h, std::vector<R>& p, std::vector<R>& lse) {
  const int64_t t_len = dims.seq_len, d = dims.head_dim, hk = h / (dims.q_heads / dims.kv_heads);
  p.assign(size_t(t_len * t_len), R(0));
  lse.assign(size_t(t_len), R(0));
  std::vector<char> allowed(static_cast<size_t>(t_len));
  for (int64_t t = 0; t < t_len; ++t) {
    const R* qt = q + ((b * t_len + t) * dims.q_heads + h) * d;
    R mx = -std::numeric_limits<R>::infinity();
    for (int64_t s = 0; s < t_len; ++s) {
      allowed[size_t(s)] = AttentionAllowed(doc_ids, dims, b, t, s);
      if (!allowed[size_t(s)]) continue;
      const R* ks = k + ((b * t_len + s) * dims.kv_heads + hk) * d;
      R dot = 0;
      for (int64_t i = 0; i < d; ++i) dot += qt[i] * ks[i];
      p[size_t(t * t_len + s)] = R(dims.scale) * dot;
      mx = std::max(mx, R(dims.scale) * dot);
    }
    R sum = 0;
    for (int64_t s = 0; s < t_len; ++s) {
      if (allowed[size_t(s)]) sum += std::exp(p[size_t(t * t_len + s)] - mx);
    }
    for (int64_t s = 0; s < t_len; ++s) {
      R& e = p[size_t(t * t_len + s)];
      e = allowed[size_t(s)] ? std::exp(e - mx) / sum : R(0);
    }
    lse[size_t(t)] = mx + std::log(sum);
  }
}

}  // namespace

template <typename R>
void AttentionForward(const R* q, const R* k, const R* v, const int32_t* doc_ids,
                      const AttentionDims& dims, R* o, R* lse) {
  const int64_t t_len = dims.seq_len, d = dims.head_dim, g = dims.q_heads / dims.kv_heads;
  std::vector<R> p, row_lse;
  for (int64_t b = 0; b < dims.batch; ++b) {
    for (int64_t h = 0; h < dims.q_heads; ++h) {
      Probabilities(q, k, doc_ids, dims, b, h, p, row_lse);
      for (int64_t t = 0; t < t_len; ++t) {
        R* ot = o + ((b * t_len + t) * dims.q_heads + h) * d;
        for (int64_t i = 0; i < d; ++i) {
          R acc = 0;
          for (int64_t s = 0; s < t_len; ++s) {
            acc += p[size_t(t * t_len + s)] * v[((b * t_len + s) * dims.kv_heads + h / g) * d + i];
          }
          ot[i] = acc;
        }
        lse[(b * t_len + t) * dims.q_heads + h] = row_lse[size_t(t)];
      }
    }
  }
}

template <typename R>
void AttentionBackward(const R* q, const R* k, const R* v, const int32_t* doc_ids, const R* d_o,
                       const AttentionDims& dims, R* dq, R* dk, R* dv) {
  const int64_t t_len = dims.seq_len, d = dims.head_dim, g = dims.q_heads / dims.kv_heads;
  const int64_t n = dims.batch * t_len;
  std::fill(dq, dq + n * dims.q_heads * d, R(0));
  std::fill(dk, dk + n * dims.kv_heads * d, R(0));
  std::fill(dv, dv + n * dims.kv_heads * d, R(0));
  std::vector<R> p, row_lse, dp(static_cast<size_t>(t_len));
  auto at = [&](int64_t b, int64_t t, int64_t heads, int64_t h) {
    return ((b * t_len + t) * heads + h) * d;
  };
  for (int64_t b = 0; b < dims.batch; ++b) {
    for (int64_t h = 0; h < dims.q_heads; ++h) {
      const int64_t hk = h / g;
      Probabilities(q, k, doc_ids, dims, b, h, p, row_lse);
      for (int64_t t = 0; t < t_len; ++t) {
        // dP_ts = dO_t . v_s;  dS_ts = P_ts (dP_ts - sum_u P_tu dP_tu).
        R pdp = 0;
        for (int64_t s = 0; s < t_len; ++s) {
          R dot = 0;
          for (int64_t i = 0; i < d; ++i)
            dot += d_o[at(b, t, dims.q_heads, h) + i] * v[at(b, s, dims.kv_heads, hk) + i];
          dp[size_t(s)] = dot;
          pdp += p[size_t(t * t_len + s)] * dot;
        }
        for (int64_t s = 0; s < t_len; ++s) {
          const R pts = p[size_t(t * t_len + s)];
          const R ds = pts * (dp[size_t(s)] - pdp) * R(dims.scale);
          for (int64_t i = 0; i < d; ++i) {
            dv[at(b, s, dims.kv_heads, hk) + i] += pts * d_o[at(b, t, dims.q_heads, h) + i];
            dq[at(b, t, dims.q_heads, h) + i] += ds * k[at(b, s, dims.kv_heads, hk) + i];
            dk[at(b, s, dims.kv_heads, hk) + i] += ds * q[at(b, t, dims.q_heads, h) + i];
          }
        }
      }
    }
  }
}

#define FERRY_INSTANTIATE(R)                                                                 \
  template void AttentionForward<R>(const R*, const R*, const R*, const int32_t*,            \
                                    const AttentionDims&, R*, R*);                           \
  template void AttentionBackward<R>(const R*, const R*, const R*, const int32_t*, const R*, \
                                     const AttentionDims&, R*, R*, R*);
FERRY_INSTANTIATE(float)
FERRY_INSTANTIATE(double)
#undef FERRY_INSTANTIATE

}  // namespace ferry::ref
