#include "kernels/ops/cast.h"

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

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

Status Cast(Device& d, const CastArgs& a) { return RunKernel(d, &Backend::cast, ValidateCast, a); }

}  // namespace ferry
