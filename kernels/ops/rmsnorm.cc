#include "kernels/ops/rmsnorm.h"

#include "kernels/cpu/rmsnorm.h"
#include "kernels/ops/check_args.h"
#include "kernels/ops/dispatch.h"

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

size_t RmsNormScratchBytes(const Device&) { return 0; }

Status RmsNormForward(Device& d, const RmsNormForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateRmsNormForward(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "rmsnorm_forward");
  return EnqueueCpuKernel(d, "rmsnorm_forward",
                          [a](ThreadPool& p) { return cpu::RmsNormForward(p, a); });
}

Status RmsNormBackward(Device& d, const RmsNormBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateRmsNormBackward(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "rmsnorm_backward");
  return EnqueueCpuKernel(d, "rmsnorm_backward",
                          [a](ThreadPool& p) { return cpu::RmsNormBackward(p, a); });
}

}  // namespace ferry
