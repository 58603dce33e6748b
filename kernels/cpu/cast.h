// CPU cast kernel, and the staging helpers the dense CPU kernels in this directory share: bulk
// conversions that read storage dtypes as fp32 and write fp32 results back (round to nearest
// even), the fp32 accumulate step, and row reductions. The conversion
// loops are written in blocks of 8 so the compiler vectorizes them at -O2.
// Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "kernels/ops/cast.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry::cpu {

// Elements per fp32 staging buffer on the stack (kernels process rows in pieces of this size).
inline constexpr int64_t kStageElems = 512;

// dst[i] = float(src[i]) for n elements of storage dtype t (f32, bf16 or f16).
void ConvertRowToFloat(DType t, const void* src, float* dst, int64_t n);
// dst[i] = round(src[i]) into storage dtype t. src and dst must not overlap.
void ConvertRowFromFloat(const float* src, DType t, void* dst, int64_t n);

// Reads n elements starting at element `offset` of `t` as fp32: returns the tensor's own memory
// when it is f32 (no copy), otherwise converts into `stage` (>= n floats) and returns it.
const float* LoadFloats(const Tensor& t, int64_t offset, int64_t n, float* stage);
// Where a kernel should write n fp32 results destined for element `offset` of `t`: the tensor's
// own memory when it is f32, otherwise `stage`; StoreFloats then rounds `stage` into the tensor
// (a no-op for f32).
float* OutputFloats(const Tensor& t, int64_t offset, float* stage);
void StoreFloats(const float* results, const Tensor& t, int64_t offset, int64_t n);

// t[offset, offset + n) += add[0, n) in fp32, rounded once to t's dtype (the parameter-gradient
// accumulation step). REQUIRES: n <= kStageElems.
void AccumulateFloats(const float* add, const Tensor& t, int64_t offset, int64_t n);

// Raw address of element `offset` of a tensor (any dtype).
std::byte* ElementAddress(const Tensor& t, int64_t offset);

// Rows of length c per parallel chunk for row-wise kernels: about 16K elements of work each.
inline int64_t RowGrain(int64_t c) {
  return std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, c));
}

// sum over j of (x[row, j] - shift)^power, power 1 or 2, for a (?, c) tensor: fp32 with 8
// partial sums (vectorizable, and a smaller error than one running sum).
float RowMoment(const Tensor& x, int64_t row, int64_t c, float shift, int power);

// Runs fn(offset, len) over [0, n) in pieces of at most kStageElems elements, in parallel over
// the pool (for elementwise kernels: each piece fits the stack staging buffers).
template <typename Fn>
void ParallelPieces(ThreadPool& pool, int64_t n, const Fn& fn) {
  pool.ParallelFor(n, int64_t(1) << 14, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; i += kStageElems) fn(i, std::min(kStageElems, end - i));
  });
}

// dst = cast(src), in parallel over the pool.
Status Cast(ThreadPool& pool, const CastArgs& a);

}  // namespace ferry::cpu
