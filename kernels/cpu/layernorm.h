// CPU LayerNorm kernels (semantics and accumulation rules: kernels/ops/layernorm.h). Forward and
// dx run in parallel over rows; dw and db run in parallel over column blocks, each summing all
// rows in order (no scratch, thread-count-independent results).
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/layernorm.h"
#include "kernels/status.h"

namespace ferry::cpu {

// REQUIRES: ValidateLayerNormForward(a) is ok.
Status LayerNormForward(ThreadPool& pool, const LayerNormForwardArgs& a);
// REQUIRES: ValidateLayerNormBackward(a) is ok.
Status LayerNormBackward(ThreadPool& pool, const LayerNormBackwardArgs& a);

}  // namespace ferry::cpu
