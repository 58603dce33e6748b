// Fast CPU RoPE kernels over RopeArgs (semantics in kernels/ops/rope.h):
// storage f32 or bf16, math in fp32, tokens split across the pool. Backward
// writes dx (activation gradient: =). REQUIRES: ValidateRope(a) is ok (the
// dispatcher checks); the tensors are host-addressable.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops/rope.h"
#include "kernels/status.h"

namespace ferry::cpu {

Status RopeForward(ThreadPool& pool, const RopeArgs& a);
Status RopeBackward(ThreadPool& pool, const RopeArgs& a);

}  // namespace ferry::cpu
