#include "kernels/ops/residual.h"

#include "kernels/cpu/residual.h"
#include "kernels/ops/check_args.h"
#include "kernels/ops/dispatch.h"
#ifdef FERRY_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

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
#ifdef FERRY_WITH_CUDA
  if (d.kind() == DeviceKind::kCuda) {
    if (a.a.dtype != a.y.dtype || a.b.dtype != a.y.dtype) {
      return Status::Unavailable("residual_add: mixed dtypes (" + a.a.ToString() + " + " +
                                 a.b.ToString() + " -> " + a.y.ToString() +
                                 ") are not implemented on CUDA devices yet");
    }
    return cuda::Residual(static_cast<CudaDevice&>(d), a.a, a.b, a.y);
  }
#endif
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "residual_add");
  return EnqueueCpuKernel(d, "residual_add", [a](ThreadPool& p) { return cpu::ResidualAdd(p, a); });
}

Status ResidualAccumulate(Device& d, const ResidualAccumulateArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateResidualAccumulate(a));
#ifdef FERRY_WITH_CUDA
  if (d.kind() == DeviceKind::kCuda) {
    if (a.dx.dtype != a.dy.dtype) {
      return Status::Unavailable("residual_accumulate: mixed dtypes (" + a.dx.ToString() +
                                 " += " + a.dy.ToString() +
                                 ") are not implemented on CUDA devices yet");
    }
    return cuda::Residual(static_cast<CudaDevice&>(d), a.dx, a.dy, a.dx);
  }
#endif
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "residual_accumulate");
  return EnqueueCpuKernel(d, "residual_accumulate",
                          [a](ThreadPool& p) { return cpu::ResidualAccumulate(p, a); });
}

}  // namespace ferry
