// Fast CPU fused LM head + cross-entropy (semantics: kernels/ops/lm_head_loss.h).
//
// Per chunk of `chunk_tokens` tokens, with the vocabulary split into one fixed range per pool
// thread ("part"):
//   A. logits[:, part] = h_chunk W[part]^T           (serial OpenBLAS sgemm per part)
//   B. per token: max, sum of exp in double, loss; backward turns the row into (P - Y) * s in place
//   C. backward, per part: dW[part] += dL[:, part]^T h_chunk   (rows of dW owned by the part: no
//      races; skipped without a dW) and dh_part += dL[:, part] W[part]   (one fp32 partial per
//      part)
//   D. backward: dh_chunk = sum of the partials in part order (deterministic for a given pool
//      size), stored in h's dtype.
// bf16 h and W: A runs on oneDNN's bf16 kernels where the CPU has them (kernels/cpu/onednn.h: the
// same exact products and fp32 sums, one call per part, the worker's W panel its scratchpad);
// elsewhere, and in C (whose dL is fp32), they are widened to fp32 panels in scratch (h: once per
// chunk; W: 128 rows at a time) so the GEMMs are fp32. The scratch is the panels' either way, so a
// plan does not depend on the host.
//
// Accumulation: dh `=` (activation gradient), dW `+=` (parameter gradient).
// Thread-safety: one call at a time per pool (ThreadPool's rule); no other state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "kernels/ops/lm_head_loss.h"
#include "kernels/status.h"

namespace ferry::cpu {

// Scratch bytes for a pool of `threads`: logits (chunk, V) + per-token losses (chunk) + h panel
// (chunk, C) when h is not f32 + per thread: a W panel (128, C) when W is not f32, a dW panel
// (128, C) when a dW is computed and not f32 (backward; dw_dtype nullopt: no dW) and a dh partial
// (chunk, C) (backward). Each piece is 64-byte aligned.
size_t LmHeadLossScratchBytes(int threads, int64_t chunk_tokens, int64_t V, int64_t C,
                              DType h_dtype, std::optional<DType> dw_dtype, bool backward);

// REQUIRES: ValidateLmHeadLoss(a, false).ok(). Errors: InvalidArgument for too little scratch or
// a target outside [0, V) that is not kIgnoreIndex.
Status LmHeadLossForward(ThreadPool& pool, const LmHeadLossArgs& a);
// REQUIRES: ValidateLmHeadLoss(a, true).ok(). Errors as LmHeadLossForward.
Status LmHeadLossForwardBackward(ThreadPool& pool, const LmHeadLossArgs& a);

}  // namespace ferry::cpu
