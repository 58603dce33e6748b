// CPU SwiGLU kernels (semantics: kernels/ops/swiglu.h), elementwise over rows in parallel pieces.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/swiglu.h"
#include "kernels/status.h"

namespace ferry::cpu {

// REQUIRES: ValidateSwiGluForward(a) is ok.
Status SwiGluForward(ThreadPool& pool, const SwiGluForwardArgs& a);
// dgate_up = (dgate | dup) (=). REQUIRES: ValidateSwiGluBackward(a) is ok.
Status SwiGluBackward(ThreadPool& pool, const SwiGluBackwardArgs& a);

}  // namespace ferry::cpu
