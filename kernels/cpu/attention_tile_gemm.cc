#include "kernels/cpu/attention_tile_gemm.h"

#include <cstring>

namespace ferry::cpu {
namespace {

typedef float Vec4 __attribute__((vector_size(16)));

void BlockPortable(const float* __restrict a, int64_t ars, int64_t aks, const float* __restrict b,
                   int64_t bs, int64_t k0, int64_t k1, float* __restrict out, int64_t os) {
  // Eight named accumulators (two 4-wide vectors per row) so they stay in registers.
  Vec4 c00, c01, c10, c11, c20, c21, c30, c31;
  std::memcpy(&c00, out, 16), std::memcpy(&c01, out + 4, 16);
  std::memcpy(&c10, out + os, 16), std::memcpy(&c11, out + os + 4, 16);
  std::memcpy(&c20, out + 2 * os, 16), std::memcpy(&c21, out + 2 * os + 4, 16);
  std::memcpy(&c30, out + 3 * os, 16), std::memcpy(&c31, out + 3 * os + 4, 16);
  for (int64_t k = k0; k < k1; ++k) {
    Vec4 b0, b1;
    std::memcpy(&b0, b + k * bs, 16), std::memcpy(&b1, b + k * bs + 4, 16);
    const float* ak = a + k * aks;
    const float x0 = ak[0], x1 = ak[ars], x2 = ak[2 * ars], x3 = ak[3 * ars];
    c00 += x0 * b0, c01 += x0 * b1, c10 += x1 * b0, c11 += x1 * b1;
    c20 += x2 * b0, c21 += x2 * b1, c30 += x3 * b0, c31 += x3 * b1;
  }
  std::memcpy(out, &c00, 16), std::memcpy(out + 4, &c01, 16);
  std::memcpy(out + os, &c10, 16), std::memcpy(out + os + 4, &c11, 16);
  std::memcpy(out + 2 * os, &c20, 16), std::memcpy(out + 2 * os + 4, &c21, 16);
  std::memcpy(out + 3 * os, &c30, 16), std::memcpy(out + 3 * os + 4, &c31, 16);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FERRY_ATTENTION_AVX2 1
typedef float Vec8 __attribute__((vector_size(32)));

__attribute__((target("avx2"))) void BlockAvx2(const float* __restrict a, int64_t ars, int64_t aks,
                                               const float* __restrict b, int64_t bs, int64_t k0,
                                               int64_t k1, float* __restrict out, int64_t os) {
  Vec8 c0, c1, c2, c3;  // one 8-wide accumulator per row
  std::memcpy(&c0, out, 32), std::memcpy(&c1, out + os, 32);
  std::memcpy(&c2, out + 2 * os, 32), std::memcpy(&c3, out + 3 * os, 32);
  for (int64_t k = k0; k < k1; ++k) {
    Vec8 bk;
    std::memcpy(&bk, b + k * bs, 32);
    const float* ak = a + k * aks;
    c0 += ak[0] * bk, c1 += ak[ars] * bk, c2 += ak[2 * ars] * bk, c3 += ak[3 * ars] * bk;
  }
  std::memcpy(out, &c0, 32), std::memcpy(out + os, &c1, 32);
  std::memcpy(out + 2 * os, &c2, 32), std::memcpy(out + 3 * os, &c3, 32);
}
#endif

}  // namespace

TileGemmBlock PortableTileGemmBlock() { return BlockPortable; }

TileGemmBlock SelectTileGemmBlock() {
#ifdef FERRY_ATTENTION_AVX2
  if (__builtin_cpu_supports("avx2")) return BlockAvx2;
#endif
  return BlockPortable;
}

}  // namespace ferry::cpu
