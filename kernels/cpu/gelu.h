// CPU GELU kernels (semantics: kernels/ops/gelu.h), elementwise in parallel pieces, fp32 libm
// erf/tanh/exp.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/gelu.h"
#include "kernels/status.h"

namespace ferry::cpu {

// REQUIRES: ValidateGeluForward(a) is ok.
Status GeluForward(ThreadPool& pool, const GeluForwardArgs& a);
// dx = dy * gelu'(x) (=). REQUIRES: ValidateGeluBackward(a) is ok.
Status GeluBackward(ThreadPool& pool, const GeluBackwardArgs& a);

}  // namespace ferry::cpu
