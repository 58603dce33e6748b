#include "kernels/ops/rmsnorm.h"

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {

Status ValidateRmsNormForward(const RmsNormForwardArgs& a) {
  int64_t n, c;
  FERRY_RETURN_IF_ERROR(CheckMatrix("rmsnorm_forward", "x", a.x, &n, &c));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("rmsnorm_forward", "weight", a.weight, Shape{c}));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("rmsnorm_forward", "y", a.y, Shape{n, c}));
  FERRY_RETURN_IF_ERROR(
      CheckTensorOfType("rmsnorm_forward", "rstd", a.rstd, Shape{n}, DType::kF32));
  if (!(a.eps >= 0.0f)) return Status::InvalidArgument("rmsnorm_forward: eps must be >= 0");
  return Status::Ok();
}

Status ValidateRmsNormBackward(const RmsNormBackwardArgs& a) {
  int64_t n, c;
  FERRY_RETURN_IF_ERROR(CheckMatrix("rmsnorm_backward", "x", a.x, &n, &c));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("rmsnorm_backward", "dy", a.dy, Shape{n, c}));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("rmsnorm_backward", "weight", a.weight, Shape{c}));
  FERRY_RETURN_IF_ERROR(
      CheckTensorOfType("rmsnorm_backward", "rstd", a.rstd, Shape{n}, DType::kF32));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("rmsnorm_backward", "dx", a.dx, Shape{n, c}));
  return CheckFloatTensor("rmsnorm_backward", "dweight", a.dweight, Shape{c});
}

Status RmsNormForward(Device& d, const RmsNormForwardArgs& a) {
  return RunKernel(d, &Backend::rmsnorm_forward, ValidateRmsNormForward, a);
}

Status RmsNormBackward(Device& d, const RmsNormBackwardArgs& a) {
  return RunKernel(d, &Backend::rmsnorm_backward, ValidateRmsNormBackward, a);
}

}  // namespace ferry
