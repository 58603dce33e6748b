// Deterministic reductions shared by the row and column kernels (norms.cu, lm_head_loss.cu): a
// warp and a block sum whose summation order depends only on the launch shape, never on timing, so
// every run gives the same bits, and a block max. Device code only; included by .cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/cuda/elementwise.cuh"

namespace ferry::cuda {

// Sum over the 32 lanes of a warp, returned to every lane (float, or double where a kernel sums
// in double as its CPU twin does). The xor butterfly adds the same two values on both partners of
// each step (a + b == b + a in IEEE), so every lane holds the same bits. REQUIRES: all 32 lanes
// call it.
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of v over the block, returned to every thread. REQUIRES: blockDim = (x, 1, 1) with x a
// multiple of 32 and <= 1024; every thread of the block calls it (it synchronizes).
template <typename T>
__device__ __forceinline__ T BlockSum(T v) {
  __shared__ T warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // a previous call's readers are done with warp_sums
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  return WarpSum(lane < warps ? warp_sums[lane] : T(0));  // every warp sums the same values
}

// Maximum of v over the block (NaNs are skipped, as fmaxf does), returned to every thread; exact,
// so the order does not matter. REQUIRES: as BlockSum.
__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float warp_maxes[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) warp_maxes[warp] = v;
  __syncthreads();
  return WarpMax(lane < warps ? warp_maxes[lane] : -INFINITY);
}

// Threads of a block that walks one row of `cols` elements: a multiple of 32, at most 256, no
// more warps than the row has elements for.
inline constexpr int kRowThreads = 256;
inline unsigned RowThreads(int64_t cols) {
  return unsigned(std::min<int64_t>(kRowThreads, std::max<int64_t>(32, (cols + 31) / 32 * 32)));
}

// A block per row: grid.x holds up to 2^31 - 1 blocks.
inline Status CheckGridRows(std::string_view op, int64_t rows) {
  if (rows <= INT_MAX) return Status::Ok();
  return Status::InvalidArgument(std::string(op) + ": " + std::to_string(rows) +
                                 " rows exceed one CUDA grid (2^31 - 1 blocks)");
}

// Column sums over (rows, cols): a block per tile of kColumnTile columns, kColumnLanes row lanes
// per tile. Lane y sums rows y, y + kColumnLanes, ... in row order; then lane 0 adds the lanes'
// partial sums in lane order. Fixed order, no atomics, no scratch.
inline constexpr int kColumnTile = 32;
inline constexpr int kColumnLanes = 16;
inline dim3 ColumnBlock() { return dim3(kColumnTile, kColumnLanes); }
inline unsigned ColumnBlocks(int64_t cols) {
  return unsigned((cols + kColumnTile - 1) / kColumnTile);
}

// Adds `term(r, c, sums)` (which adds K values into sums[0..K)) over all rows r for every column
// c, then out[k][c] = round(out[k][c] + sum k): a parameter gradient, accumulated (+=), rounded to
// out[k]'s dtype once, as the CPU kernels' AccumulateFloats. Launch: ColumnBlocks(cols) blocks of
// ColumnBlock() threads. Term: a copyable struct with
// `__device__ void operator()(int64_t r, int64_t c, float (&sums)[K]) const`.
template <int K, typename Term>
__global__ void AccumulateColumnSums(Term term, int64_t rows, int64_t cols,
                                     DeviceFloats out0,    // (cols), accumulated
                                     DeviceFloats out1) {  // (cols), accumulated when K == 2
  static_assert(K == 1 || K == 2);
  const DeviceFloats out[2] = {out0, out1};
  __shared__ float partial[K][kColumnLanes][kColumnTile];  // a warp reads one row of it
  const int64_t c = int64_t(blockIdx.x) * kColumnTile + threadIdx.x;
  float sums[K] = {};
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kColumnLanes) term(r, c, sums);
  }
  for (int k = 0; k < K; ++k) partial[k][threadIdx.y][threadIdx.x] = sums[k];
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 0; k < K; ++k) {
    float total = 0.0f;
    for (int y = 0; y < kColumnLanes; ++y) total += partial[k][y][threadIdx.x];
    out[k].Store(c, out[k].Load(c) + total);
  }
}

}  // namespace ferry::cuda
