#include "kernels/ops/gelu.h"

#include "kernels/cpu/gelu.h"
#include "kernels/ops/check_args.h"
#include "kernels/ops/dispatch.h"

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

size_t GeluScratchBytes(const Device&) { return 0; }

Status GeluForward(Device& d, const GeluForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateGeluForward(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "gelu_forward");
  return EnqueueCpuKernel(d, "gelu_forward", [a](ThreadPool& p) { return cpu::GeluForward(p, a); });
}

Status GeluBackward(Device& d, const GeluBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateGeluBackward(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "gelu_backward");
  return EnqueueCpuKernel(d, "gelu_backward",
                          [a](ThreadPool& p) { return cpu::GeluBackward(p, a); });
}

}  // namespace ferry
