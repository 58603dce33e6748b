// Fast CPU AdamW over host arrays (the trainer's CPU optimizer) and over device tensors (the
// compute-stream kernel behind kernels/ops/adamw.h), plus the gradient sum of squares for
// global-norm clipping.
//
// One streaming pass per tensor: p, g, m, v are read once; p, m, v (and the optional bf16 copy of
// p that is uploaded to GPUs) are written once. The inner loop is written once
// (adamw_simd.inc) and compiled for AVX-512, AVX2+FMA and a generic baseline; an AdamWKernel picks
// one at construction (the best this CPU supports unless told otherwise) and keeps it, so there is
// no process-wide dispatch state. Results are bit-identical across the variants and to the fp32
// reference (kernels/ref/adamw.h): the same IEEE operations in the same order.
//
// Accumulation: AdamW updates p, m, v in place and writes p_bf16 (`=`).
// Thread-safety: an AdamWKernel is immutable; concurrent calls on disjoint tensors are safe.
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "kernels/ops/adamw.h"
#include "kernels/status.h"

namespace ferry::cpu {

enum class SimdLevel : uint8_t { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };
inline constexpr SimdLevel kAllSimdLevels[] = {SimdLevel::kGeneric, SimdLevel::kAvx2,
                                               SimdLevel::kAvx512};

std::string_view SimdLevelName(SimdLevel level);  // "generic", "avx2", "avx512"
// Whether this CPU runs the level's code (AVX2 needs FMA too; AVX-512 needs AVX-512F).
bool SimdLevelSupported(SimdLevel level);
SimdLevel BestSimdLevel();

// One parameter tensor in host memory.
struct AdamWHostTensor {
  float* p = nullptr;       // (n) fp32 master weights, updated in place
  const void* g = nullptr;  // (n) gradient in g_dtype (f32 | bf16), read only
  DType g_dtype = DType::kF32;
  float* m = nullptr;      // (n) first moment, updated in place
  float* v = nullptr;      // (n) second moment, updated in place
  bf16* p_bf16 = nullptr;  // (n) optional: the updated p rounded to nearest even
  int64_t n = 0;
};

struct AdamWIsa;  // the kernels of one instruction set (adamw.cc)

class AdamWKernel {
 public:
  // REQUIRES: SimdLevelSupported(level).
  explicit AdamWKernel(SimdLevel level = BestSimdLevel());

  SimdLevel level() const { return level_; }

  // Updates one tensor. `pool` may be null (runs on the calling thread); large tensors are split
  // over the pool. Errors: InvalidArgument for bad hyperparameters, a gradient dtype other than
  // f32/bf16, or missing arrays.
  Status Update(const AdamWHyperparameters& h, const AdamWHostTensor& t, ThreadPool* pool) const;

  // Sum of g[i]^2 (g as stored, before any grad_scale), accumulated in double over fixed blocks
  // that are summed in order, so the result does not depend on the pool's size or timing.
  // REQUIRES: g_dtype is f32 or bf16.
  double SumOfSquares(const void* g, DType g_dtype, int64_t n, ThreadPool* pool) const;

 private:
  SimdLevel level_;
  const AdamWIsa* isa_;  // points at a constant table; never null
};

// The device kernel: AdamW over device tensors on the device's pool, with BestSimdLevel().
// REQUIRES: ValidateAdamW(a).ok().
Status AdamWStep(ThreadPool& pool, const AdamWArgs& a);

}  // namespace ferry::cpu
