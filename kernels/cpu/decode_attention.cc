#include "kernels/cpu/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/backend_access.h"

namespace ferry::cpu {

void DecodeAttention(ThreadPool& pool, const DecodeAttentionArgs& a) {
  const DecodeAttentionShape& s = a.shape;
  const int64_t n = s.new_tokens, hq = s.q_heads, d = s.head_dim, kw = s.kv_heads * d;
  const int64_t group = hq / s.kv_heads;
  float* k_cache = BackendAccess::Data<float>(a.k_cache);
  float* v_cache = BackendAccess::Data<float>(a.v_cache);
  const size_t row_bytes = size_t(n * kw) * sizeof(float);
  std::memcpy(k_cache + s.past * kw, BackendAccess::Data<const float>(a.k_new), row_bytes);
  std::memcpy(v_cache + s.past * kw, BackendAccess::Data<const float>(a.v_new), row_bytes);
  const float* q = BackendAccess::Data<const float>(a.q);
  float* o = BackendAccess::Data<float>(a.o);
  float* lse = BackendAccess::Data<float>(a.lse);
  const float scale = a.scale;

  pool.ParallelFor(n * hq, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / hq, h = item % hq, t = s.past + i;
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, t - a.window + 1) : 0;
      const float* qi = q + i * hq * d + h * d;
      const float* kc = k_cache + (h / group) * d;
      const float* vc = v_cache + (h / group) * d;
      float* oi = o + i * hq * d + h * d;
      std::fill(oi, oi + d, 0.0f);
      float mx = -std::numeric_limits<float>::infinity(), sum = 0.0f;
      for (int64_t j = lo; j <= t; ++j) {
        const float* kj = kc + j * kw;
        float dot = 0.0f;
        for (int64_t c = 0; c < d; ++c) dot += qi[c] * kj[c];
        const float score = scale * dot;
        if (score > mx) {  // rescale what was accumulated under the old maximum
          const float r = std::exp(mx - score);
          sum *= r;
          for (int64_t c = 0; c < d; ++c) oi[c] *= r;
          mx = score;
        }
        const float p = std::exp(score - mx);
        sum += p;
        const float* vj = vc + j * kw;
        for (int64_t c = 0; c < d; ++c) oi[c] += p * vj[c];
      }
      const float inv = 1.0f / sum;
      for (int64_t c = 0; c < d; ++c) oi[c] *= inv;
      lse[i * hq + h] = mx + std::log(sum);
    }
  });
}

}  // namespace ferry::cpu
