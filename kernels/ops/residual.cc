#include "kernels/ops/residual.h"

#include "kernels/cpu/residual.h"
#include "kernels/ops/check_args.h"
#include "kernels/ops/dispatch.h"

namespace ferry {

Status ValidateResidualAdd(const ResidualAddArgs& a) {
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("residual_add", "a", a.a, a.a.shape));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("residual_add", "b", a.b, a.a.shape));
  return CheckFloatTensor("residual_add", "y", a.y, a.a.shape);
}

Status ValidateResidualAccumulate(const ResidualAccumulateArgs& a) {
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("residual_accumulate", "dx", a.dx, a.dx.shape));
  return CheckFloatTensor("residual_accumulate", "dy", a.dy, a.dx.shape);
}

size_t ResidualScratchBytes(const Device&) { return 0; }

Status ResidualAdd(Device& d, const ResidualAddArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateResidualAdd(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "residual_add");
  return EnqueueCpuKernel(d, "residual_add", [a](ThreadPool& p) { return cpu::ResidualAdd(p, a); });
}

Status ResidualAccumulate(Device& d, const ResidualAccumulateArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateResidualAccumulate(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "residual_accumulate");
  return EnqueueCpuKernel(d, "residual_accumulate",
                          [a](ThreadPool& p) { return cpu::ResidualAccumulate(p, a); });
}

}  // namespace ferry
