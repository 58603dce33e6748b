// CPU GEMM and bias-gradient kernels (semantics: kernels/ops/gemm.h, gemm_bias_grad.h).
//
// The product runs on OpenBLAS sgemm restricted to the calling thread (the pthread build set to
// one thread: Debian's serial build is not safe to call concurrently, see CMakeLists.txt), called
// on blocks of C in parallel from the device's ThreadPool (never a global BLAS pool):
//  - all of A, B, C f32: C is split along its larger dimension into one block per worker and
//    each block goes straight to sgemm on the tensors' own memory (no copies, no scratch);
//  - otherwise C is cut into tiles (kGemmTileM x kGemmTileN), and for each K panel
//    (kGemmTileK) the worker converts the non-f32 operand panels to fp32 in its own part of the
//    scratch and calls sgemm; a non-f32 C tile accumulates in fp32 scratch and is rounded to its
//    dtype once, after the last panel and the bias;
//  - except that A and B both bf16 (C f32 or bf16) run on oneDNN's bf16 kernels where the CPU
//    has AVX512-BF16 or AMX (kernels/cpu/onednn.h): C split into one block per worker, in place,
//    fp32 accumulation. The scratch reported stays the conversion path's, so a plan is the same
//    whichever path the host takes; oneDNN's scratchpad is each worker's slice of it (a block
//    whose scratchpad is larger runs in smaller blocks).
// Thread-safety: ParallelFor's per-worker index gives each worker its own scratch slice.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/gemm_bias_grad.h"
#include "kernels/status.h"

namespace ferry::cpu {

inline constexpr int64_t kGemmTileM = 256;
inline constexpr int64_t kGemmTileN = 512;
inline constexpr int64_t kGemmTileK = 256;

// Scratch bytes Gemm needs with a pool of `threads` workers.
size_t GemmScratchBytes(int threads, int64_t m, int64_t n, int64_t k, GemmDTypes dtypes);

// REQUIRES: ValidateGemm(g) is ok. Errors: InvalidArgument when g.scratch is smaller than
// GemmScratchBytes(pool.size(), ...); Internal naming a oneDNN call that failed.
Status Gemm(ThreadPool& pool, const GemmArgs& g);

class OneDnn;
// The bf16 path Gemm uses (kernels/cpu/onednn.h): the loaded library, or null where it is off.
const OneDnn* Bf16GemmLibrary();
// Gemm with its bf16 path given: null converts bf16 operands to fp32 panels (the tests run both).
Status GemmWith(ThreadPool& pool, const GemmArgs& g, const OneDnn* bf16);

// db += column sums of dy. REQUIRES: ValidateBiasGrad(a) is ok.
Status BiasGrad(ThreadPool& pool, const BiasGradArgs& a);

}  // namespace ferry::cpu
