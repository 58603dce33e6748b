#include "kernels/ops/gemm_bias_grad.h"

#include "kernels/cpu/gemm.h"
#include "kernels/ops/check_args.h"
#include "kernels/ops/dispatch.h"

namespace ferry {

Status ValidateBiasGrad(const BiasGradArgs& a) {
  int64_t rows, cols;
  FERRY_RETURN_IF_ERROR(CheckMatrix("bias_grad", "dy", a.dy, &rows, &cols));
  return CheckFloatTensor("bias_grad", "db", a.db, Shape{cols});
}

size_t BiasGradScratchBytes(const Device&) { return 0; }

Status BiasGrad(Device& d, const BiasGradArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateBiasGrad(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "bias_grad");
  return EnqueueCpuKernel(d, "bias_grad", [a](ThreadPool& p) { return cpu::BiasGrad(p, a); });
}

}  // namespace ferry
