#include "kernels/ops/swiglu.h"

#include "kernels/cpu/swiglu.h"
#include "kernels/ops/check_args.h"
#include "kernels/ops/dispatch.h"

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

size_t SwiGluScratchBytes(const Device&) { return 0; }

Status SwiGluForward(Device& d, const SwiGluForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateSwiGluForward(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "swiglu_forward");
  return EnqueueCpuKernel(d, "swiglu_forward",
                          [a](ThreadPool& p) { return cpu::SwiGluForward(p, a); });
}

Status SwiGluBackward(Device& d, const SwiGluBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateSwiGluBackward(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "swiglu_backward");
  return EnqueueCpuKernel(d, "swiglu_backward",
                          [a](ThreadPool& p) { return cpu::SwiGluBackward(p, a); });
}

}  // namespace ferry
