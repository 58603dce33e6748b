#include "kernels/ops/cast.h"

#include "kernels/cpu/cast.h"
#include "kernels/ops/check_args.h"
#include "kernels/ops/dispatch.h"
#ifdef FERRY_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace ferry {

Status ValidateCast(const CastArgs& a) {
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("cast", "src", a.src, a.src.shape));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor("cast", "dst", a.dst, a.dst.shape));
  if (a.src.numel() != a.dst.numel()) {
    return Status::InvalidArgument("cast: dst " + a.dst.ToString() +
                                   " must have as many elements as src " + a.src.ToString());
  }
  if (a.src.dtype != a.dst.dtype && a.src.data == a.dst.data && a.src.numel() > 0) {
    return Status::InvalidArgument("cast: in-place cast between different dtypes (" +
                                   a.src.ToString() + " -> " + a.dst.ToString() +
                                   ") is not supported: give dst its own memory");
  }
  return Status::Ok();
}

size_t CastScratchBytes(const Device&) { return 0; }

Status Cast(Device& d, const CastArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateCast(a));
#ifdef FERRY_WITH_CUDA
  if (d.kind() == DeviceKind::kCuda) return cuda::Cast(static_cast<CudaDevice&>(d), a.src, a.dst);
#endif
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "cast");
  return EnqueueCpuKernel(d, "cast", [a](ThreadPool& p) { return cpu::Cast(p, a); });
}

}  // namespace ferry
