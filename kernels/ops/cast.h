// Cast: dst = src converted between storage dtypes (f32, bf16, f16). Narrowing rounds to nearest,
// ties to even (kernels/dtype.h has the exact rules for NaN, infinities and fp16 range). The
// executor uses it to move tensors between storage formats (bf16 weights to an fp32 master copy,
// fp32 gradients to bf16, ...). src and dst have the same element count (shapes may differ);
// same-dtype casts copy. No scratch. Thread-safety: pure; the caller owns the tensors.
#pragma once

#include <cstddef>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct CastArgs {
  Tensor src;  // (any) f32|bf16|f16
  Tensor dst;  // (same numel) f32|bf16|f16; must not overlap src unless it is src itself
};

Status ValidateCast(const CastArgs& a);
inline size_t CastScratchBytes(const Device&) { return 0; }  // for the planner's uniformity
// dst = cast(src). Validates, then enqueues on d's compute stream.
Status Cast(Device& d, const CastArgs& a);

}  // namespace ferry
