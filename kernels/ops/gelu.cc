#include "kernels/ops/gelu.h"

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {

Status ValidateGeluForward(const GeluForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("gelu_forward", "x", a.x, a.x.shape));
  return CheckFloatTensor("gelu_forward", "y", a.y, a.x.shape);
}

Status ValidateGeluBackward(const GeluBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("gelu_backward", "x", a.x, a.x.shape));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("gelu_backward", "dy", a.dy, a.x.shape));
  return CheckFloatTensor("gelu_backward", "dx", a.dx, a.x.shape);
}

Status GeluForward(Device& d, const GeluForwardArgs& a) {
  return RunKernel(d, &Backend::gelu_forward, ValidateGeluForward, a);
}

Status GeluBackward(Device& d, const GeluBackwardArgs& a) {
  return RunKernel(d, &Backend::gelu_backward, ValidateGeluBackward, a);
}

}  // namespace ferry
