#include "kernels/ops/swiglu.h"

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {

Status ValidateSwiGluForward(const SwiGluForwardArgs& a) {
  int64_t n, i;
  FERRY_RETURN_IF_ERROR(CheckMatrix("swiglu_forward", "h", a.h, &n, &i));
  return CheckFloatTensor("swiglu_forward", "gate_up", a.gate_up, Shape{n, 2 * i});
}

Status ValidateSwiGluBackward(const SwiGluBackwardArgs& a) {
  int64_t n, i;
  FERRY_RETURN_IF_ERROR(CheckMatrix("swiglu_backward", "dh", a.dh, &n, &i));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("swiglu_backward", "gate_up", a.gate_up, Shape{n, 2 * i}));
  return CheckFloatTensor("swiglu_backward", "dgate_up", a.dgate_up, Shape{n, 2 * i});
}

Status SwiGluForward(Device& d, const SwiGluForwardArgs& a) {
  return RunKernel(d, &Backend::swiglu_forward, ValidateSwiGluForward, a);
}

Status SwiGluBackward(Device& d, const SwiGluBackwardArgs& a) {
  return RunKernel(d, &Backend::swiglu_backward, ValidateSwiGluBackward, a);
}

}  // namespace ferry
