// Decode attention on CUDA (semantics: kernels/ops/decode_attention.h; the CPU kernel is
// kernels/cpu/decode_attention.cc), on the device's compute stream, f32 storage and math.
//
// The new keys and values are copied into cache rows [P, P+n) first (device-to-device copies on
// the compute stream, so the kernel below sees them). Then a block per (new token i, query head
// h): each warp walks the keys j = lo + warp, lo + warp + warps, ... of the row's range
// [lo, P+i] with the CPU's online softmax (the same rescaling steps: when a score exceeds the
// running maximum, the sum and the output are multiplied by exp(old - new)), the dot product
// q . k_j summed by the warp's lanes (WarpSum); each lane owns the output elements c = lane,
// lane + 32, ... of its warp's accumulator. At the end the warps' (max, sum, output) are merged in
// warp order: o = sum_w o_w e^(m_w - M) / sum_w s_w e^(m_w - M), lse = M + log S. Fixed order,
// no atomics: the same bits on every run. Writes o and lse (=) and the cache rows [P, P+n) (=).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/backend_access.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/reduce.cuh"

namespace ferry::cuda {
namespace {

constexpr int kMaxWarps = 8;
constexpr size_t kSharedBytes = 48 * 1024;  // the default limit of dynamic shared memory

// Shared floats of a block with `warps` warps: q (D), each warp's output (warps x D), each warp's
// max and sum (2 x warps).
size_t SharedFloats(int warps, int64_t d) { return size_t(d) * (1 + warps) + 2 * size_t(warps); }

__global__ void DecodeAttentionKernel(const float* __restrict__ q,  // (n, Hq*D)
                                      const float* __restrict__ k,  // (S, Hkv*D)
                                      const float* __restrict__ v,  // (S, Hkv*D)
                                      float* __restrict__ o,        // (n, Hq*D), written
                                      float* __restrict__ lse,      // (n, Hq), written
                                      int64_t past, int64_t hq, int64_t group, int64_t d,
                                      int64_t kw, float scale, int64_t window) {
  extern __shared__ float shared[];
  const int warps = int(blockDim.x >> 5), warp = int(threadIdx.x >> 5),
            lane = int(threadIdx.x & 31);
  float* qs = shared;                          // (D)
  float* acc = shared + d;                     // (warps, D)
  float* warp_max = acc + int64_t(warps) * d;  // (warps)
  float* warp_sum = warp_max + warps;          // (warps)
  const int64_t item = blockIdx.x, i = item / hq, h = item % hq, t = past + i;
  const int64_t lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
  const float* qi = q + i * hq * d + h * d;
  const float* kc = k + (h / group) * d;
  const float* vc = v + (h / group) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) qs[c] = qi[c];
  float* ow = acc + int64_t(warp) * d;  // this warp's output; lane owns c = lane + 32 m
  for (int64_t c = lane; c < d; c += 32) ow[c] = 0.0f;
  __syncthreads();

  float mx = -INFINITY, sum = 0.0f;
  for (int64_t j = lo + warp; j <= t; j += warps) {
    const float* kj = kc + j * kw;
    float part = 0.0f;
    for (int64_t c = lane; c < d; c += 32) part += qs[c] * kj[c];
    const float score = scale * WarpSum(part);  // every lane holds the same bits
    if (score > mx) {  // rescale what was accumulated under the old maximum
      const float r = expf(mx - score);
      sum *= r;
      for (int64_t c = lane; c < d; c += 32) ow[c] *= r;
      mx = score;
    }
    const float p = expf(score - mx);
    sum += p;
    const float* vj = vc + j * kw;
    for (int64_t c = lane; c < d; c += 32) ow[c] += p * vj[c];
  }
  if (lane == 0) {
    warp_max[warp] = mx;
    warp_sum[warp] = sum;
  }
  __syncthreads();
  // Merge in warp order. Key t lies in [lo, t], so some warp saw a key and M is finite; a warp
  // that saw none has max -inf and weight e^-inf = 0.
  float m_all = -INFINITY;
  for (int w = 0; w < warps; ++w) m_all = fmaxf(m_all, warp_max[w]);
  float s_all = 0.0f;
  for (int w = 0; w < warps; ++w) s_all += warp_sum[w] * expf(warp_max[w] - m_all);
  const float inv = 1.0f / s_all;
  float* oi = o + i * hq * d + h * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += acc[int64_t(w) * d + c] * expf(warp_max[w] - m_all);
    oi[c] = total * inv;
  }
  if (threadIdx.x == 0) lse[i * hq + h] = m_all + logf(s_all);
}

}  // namespace

Status DecodeAttention(CudaDevice& d, const DecodeAttentionArgs& a) {
  const DecodeAttentionShape& s = a.shape;
  const int64_t n = s.new_tokens, hq = s.q_heads, hd = s.head_dim, kw = s.kv_heads * hd;
  FERRY_RETURN_IF_ERROR(CheckGridRows("decode_attention", n * hq));
  // As many warps as the keys of the longest row can use, at most kMaxWarps, fewer when the
  // per-warp outputs of a large head_dim would not fit the shared memory.
  const int64_t keys = a.window > 0 ? std::min(a.window, s.past + n) : s.past + n;
  int warps = int(std::clamp<int64_t>(keys, 1, kMaxWarps));
  while (warps > 1 && SharedFloats(warps, hd) * sizeof(float) > kSharedBytes) --warps;
  const size_t shared = SharedFloats(warps, hd) * sizeof(float);
  if (shared > kSharedBytes) {
    return Status::InvalidArgument("decode_attention on CUDA: head_dim " + std::to_string(hd) +
                                   " needs " + std::to_string(shared) +
                                   " bytes of shared memory; at most " +
                                   std::to_string(kSharedBytes));
  }
  const size_t row_bytes = size_t(n * kw) * sizeof(float);
  float* k_cache = BackendAccess::Data<float>(a.k_cache);
  float* v_cache = BackendAccess::Data<float>(a.v_cache);
  return d.EnqueueCompute("decode_attention", [&](const CudaContext& ctx) -> Status {
    FERRY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(k_cache + s.past * kw,
                                               BackendAccess::Data<const float>(a.k_new), row_bytes,
                                               cudaMemcpyDeviceToDevice, ctx.compute));
    FERRY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v_cache + s.past * kw,
                                               BackendAccess::Data<const float>(a.v_new), row_bytes,
                                               cudaMemcpyDeviceToDevice, ctx.compute));
    DecodeAttentionKernel<<<unsigned(n * hq), unsigned(warps * 32), shared, ctx.compute>>>(
        BackendAccess::Data<const float>(a.q), k_cache, v_cache, BackendAccess::Data<float>(a.o),
        BackendAccess::Data<float>(a.lse), s.past, hq, hq / s.kv_heads, hd, kw, a.scale, a.window);
    return Status::Ok();
  });
}

}  // namespace ferry::cuda
