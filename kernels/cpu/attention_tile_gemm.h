// Register-blocked products of small fp32 tiles, the inner loops of the CPU attention kernels
// (kernels/cpu/attention.cc): S = Q K^T, P V, dS K, P^T dO, dS^T Q on tiles of at most a few
// hundred rows and columns. A block kernel accumulates one 4 x 8 block of the output in
// registers; TileGemm walks the blocks.
//
// Two block kernels: a portable one (GCC/Clang 4-wide vectors: SSE2 on x86-64, NEON on arm64)
// and, on x86-64, an AVX2 one chosen at run time when the CPU has it. Both do, per lane, the same
// multiply then add in the same order (no fused multiply-add: FMA is not enabled and the build's
// ISO mode keeps contraction off), so they give bit-identical results.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace ferry::cpu {

// out (4 x 8 block, row stride os) += A B over k in [k0, k1), where
// A(r, k) = a[r * ars + k * aks] for r < 4 and B(k, c) = b[k * bs + c] for c < 8.
using TileGemmBlock = void (*)(const float* a, int64_t ars, int64_t aks, const float* b, int64_t bs,
                               int64_t k0, int64_t k1, float* out, int64_t os);

TileGemmBlock PortableTileGemmBlock();
// The fastest block kernel this CPU runs.
TileGemmBlock SelectTileGemmBlock();

// out (rows x cols, row stride os) += A B over k in [k0, k1) (A and B indexed as above, from
// their origins). REQUIRES: rows % 4 == 0, cols % 8 == 0.
inline void TileGemm(TileGemmBlock block, int64_t rows, int64_t cols, const float* a, int64_t ars,
                     int64_t aks, const float* b, int64_t bs, int64_t k0, int64_t k1, float* out,
                     int64_t os) {
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
      block(a + r0 * ars, ars, aks, b + c0, bs, k0, k1, out + r0 * os + c0, os);
    }
  }
}

}  // namespace ferry::cpu
