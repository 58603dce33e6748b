// CPU residual add and gradient accumulation (semantics: kernels/ops/residual.h), elementwise in
// parallel pieces.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/residual.h"
#include "kernels/status.h"

namespace ferry::cpu {

// y = a + b. REQUIRES: ValidateResidualAdd(a) is ok.
Status ResidualAdd(ThreadPool& pool, const ResidualAddArgs& a);
// dx += dy. REQUIRES: ValidateResidualAccumulate(a) is ok.
Status ResidualAccumulate(ThreadPool& pool, const ResidualAccumulateArgs& a);

}  // namespace ferry::cpu
