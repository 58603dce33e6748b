// The CUDA decode attention (kernels/cuda/decode_attention.cu, through the op dispatcher) against
// the CPU backend: one and several new tokens, an empty and a long past, GQA groups of 1 to 4,
// head_dim 1 to 257 (below, at and above a warp), sliding windows shorter and longer than the
// past. The cache must match bit for bit (rows [P, P+n) written, the others untouched).
//
// Tolerances (kernels/testing/cuda_vs_cpu.h), per row from a double reference, u = 2^-24: both
// sides sum each score's D products in fp32 in their own orders, so a score moves by at most
// delta = scale 2 (D + 2) u max_j sum_c |q_c k_jc|; a softmax weight then by 2 delta + lib
// relative, lib = kLibrary (1 + range of the scores) for expf and logf (d); the output sums over
// `keys` terms and rescalings in fp32 (b). So o: |v|max (4 delta + 2 lib + 4 (keys + 2) u), and
// lse: delta + lib + 2 (keys + 2) u, each plus (a).
// Needs a GPU: skipped without one (a failure under FERRY_REQUIRE_GPU).
#include <gtest/gtest.h>

#ifdef FERRY_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/decode_attention.h"
#include "kernels/testing/cuda_vs_cpu.h"
#include "kernels/testing/op_testing.h"

namespace ferry::testing {
namespace {

using CudaDecodeAttentionTest = CudaVsCpuTest;

struct DecodeCase {
  int64_t n, past, capacity, hq, hkv, d, window;
  std::string Name() const {
    return "n=" + std::to_string(n) + " P=" + std::to_string(past) +
           " S=" + std::to_string(capacity) + " Hq=" + std::to_string(hq) +
           " Hkv=" + std::to_string(hkv) + " D=" + std::to_string(d) +
           " W=" + std::to_string(window);
  }
};

TEST_F(CudaDecodeAttentionTest, MatchesCpu) {
  const std::vector<DecodeCase> cases = {
      {1, 0, 1, 1, 1, 1, 0},        {1, 37, 64, 4, 2, 64, 0},     {3, 100, 120, 8, 2, 80, 0},
      {5, 300, 310, 6, 3, 128, 16}, {2, 1000, 1002, 2, 1, 33, 0}, {1, 257, 300, 12, 4, 96, 300},
      {4, 9, 13, 3, 3, 257, 5}};
  for (const DecodeCase& k : cases) {
    SCOPED_TRACE(k.Name());
    const int64_t n = k.n, P = k.past, S = k.capacity, D = k.d;
    const int64_t qw = k.hq * D, kw = k.hkv * D, group = k.hq / k.hkv;
    const std::vector<float> qv = StoredRandom(kF32, n * qw, 60),
                             knv = StoredRandom(kF32, n * kw, 61),
                             vnv = StoredRandom(kF32, n * kw, 62),
                             kcv = StoredRandom(kF32, S * kw, 63),
                             vcv = StoredRandom(kF32, S * kw, 64);
    Twin q = Make(kF32, {n, qw}, "q", qv), k_new = Make(kF32, {n, kw}, "k_new", knv),
         v_new = Make(kF32, {n, kw}, "v_new", vnv), k_cache = Make(kF32, {S, kw}, "k_cache", kcv),
         v_cache = Make(kF32, {S, kw}, "v_cache", vcv);
    Twin o = Zeros(kF32, {n, qw}, "o"), lse = Zeros(kF32, {n, k.hq}, "lse");
    const float scale = 1.0f / std::sqrt(float(D));
    RunBoth<DecodeAttentionArgs>(&DecodeAttention, [&](bool g) {
      DecodeAttentionArgs a;
      a.shape = {n, P, S, k.hq, k.hkv, D};
      a.q = q.On(g);
      a.k_new = k_new.On(g);
      a.v_new = v_new.On(g);
      a.k_cache = k_cache.On(g);
      a.v_cache = v_cache.On(g);
      a.o = o.On(g);
      a.lse = lse.On(g);
      a.scale = scale;
      a.window = k.window;
      return a;
    });
    const std::vector<float> kc = k_cache.Cpu(), vc = v_cache.Cpu();
    ExpectExact(k_cache.Gpu(), kc, "k_cache");
    ExpectExact(v_cache.Gpu(), vc, "v_cache");

    // Tolerances from the cache as written.
    const double u = kF32Unit;
    std::vector<double> o_tol(size_t(n * qw)), lse_tol(size_t(n * k.hq));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = P + i, lo = k.window > 0 ? std::max<int64_t>(0, t - k.window + 1) : 0;
      const double keys = double(t - lo + 1);
      for (int64_t h = 0; h < k.hq; ++h) {
        const int64_t kv = h / group;
        double smax = 0, hi = -INFINITY, low = INFINITY;
        std::vector<double> vmax(static_cast<size_t>(D), 0.0);
        for (int64_t j = lo; j <= t; ++j) {
          double dot = 0, mag = 0;
          for (int64_t c = 0; c < D; ++c) {
            const double prod =
                double(qv[size_t(i * qw + h * D + c)]) * double(kc[size_t(j * kw + kv * D + c)]);
            dot += prod;
            mag += std::fabs(prod);
            vmax[size_t(c)] =
                std::max(vmax[size_t(c)], double(std::fabs(vc[size_t(j * kw + kv * D + c)])));
          }
          smax = std::max(smax, mag);
          hi = std::max(hi, dot * scale);
          low = std::min(low, dot * scale);
        }
        const double delta = double(scale) * 2.0 * double(D + 2) * u * smax;
        const double lib = kLibrary * (1.0 + (hi - low));
        lse_tol[size_t(i * k.hq + h)] = delta + lib + 2.0 * (keys + 2.0) * u;
        for (int64_t c = 0; c < D; ++c) {
          o_tol[size_t(i * qw + h * D + c)] =
              vmax[size_t(c)] * (4.0 * delta + 2.0 * lib + 4.0 * (keys + 2.0) * u);
        }
      }
    }
    const std::vector<float> want_o = o.Cpu(), want_lse = lse.Cpu();
    ExpectWithin(o.Gpu(), want_o, Tolerance(kF32, want_o, o_tol, 1.0), "o");
    ExpectWithin(lse.Gpu(), want_lse, Tolerance(kF32, want_lse, lse_tol, 1.0), "lse");
  }
}

}  // namespace
}  // namespace ferry::testing

#endif  // FERRY_WITH_CUDA
