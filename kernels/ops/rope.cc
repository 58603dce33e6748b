#include "kernels/ops/rope.h"

#include <string>

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {

Status ValidateRope(const RopeArgs& a) {
  if (a.num_heads < 1 || a.head_dim < 2 || a.head_dim % 2 != 0 || a.head_dim > kRopeMaxHeadDim) {
    return Status::InvalidArgument("rope: need num_heads >= 1 and an even head_dim in [2, " +
                                   std::to_string(kRopeMaxHeadDim) + "], got num_heads " +
                                   std::to_string(a.num_heads) + ", head_dim " +
                                   std::to_string(a.head_dim));
  }
  const int64_t r = a.rotary();
  if (r < 2 || r % 2 != 0 || r > a.head_dim) {
    return Status::InvalidArgument("rope: rotary_dim must be even and in [2, head_dim = " +
                                   std::to_string(a.head_dim) + "], got " + std::to_string(r));
  }
  if (a.in.dtype != DType::kF32 && a.in.dtype != DType::kBF16 && a.in.dtype != DType::kF16) {
    return Status::InvalidArgument("rope: tensor 'in' must be f32, bf16 or f16, got " +
                                   a.in.ToString());
  }
  if (a.in.shape.rank() != 2) {
    return Status::InvalidArgument("rope: tensor 'in' must be (N, H*D), got " + a.in.ToString());
  }
  const int64_t n = a.in.dim(0);
  const Shape act{n, a.num_heads * a.head_dim};
  FERRY_RETURN_IF_ERROR(CheckExactTensor("rope", "in", a.in, a.in.dtype, act));
  FERRY_RETURN_IF_ERROR(CheckExactTensor("rope", "out", a.out, a.in.dtype, act));
  FERRY_RETURN_IF_ERROR(CheckExactTensor("rope", "positions", a.positions, DType::kI32, Shape{n}));
  if (!a.inv_freq.data.is_null()) {
    FERRY_RETURN_IF_ERROR(
        CheckExactTensor("rope", "inv_freq", a.inv_freq, DType::kF32, Shape{r / 2}));
  } else if (!(a.theta > 0.0f)) {
    return Status::InvalidArgument("rope: theta must be > 0 when no inv_freq table is given");
  }
  return Status::Ok();
}

Status RopeForward(Device& d, const RopeArgs& a) {
  return RunKernel(d, &Backend::rope_forward, ValidateRope, a);
}

Status RopeBackward(Device& d, const RopeArgs& a) {
  return RunKernel(d, &Backend::rope_backward, ValidateRope, a);
}

}  // namespace ferry
