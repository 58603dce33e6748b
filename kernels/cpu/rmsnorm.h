// CPU RMSNorm kernels (semantics and accumulation rules: kernels/ops/rmsnorm.h). Forward and dx
// run in parallel over rows; dw runs in parallel over column blocks, each summing all rows in
// order (no scratch, thread-count-independent results).
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/status.h"

namespace ferry::cpu {

// REQUIRES: ValidateRmsNormForward(a) is ok.
Status RmsNormForward(ThreadPool& pool, const RmsNormForwardArgs& a);
// REQUIRES: ValidateRmsNormBackward(a) is ok.
Status RmsNormBackward(ThreadPool& pool, const RmsNormBackwardArgs& a);

}  // namespace ferry::cpu
