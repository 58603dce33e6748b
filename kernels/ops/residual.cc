#include "kernels/ops/residual.h"

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

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

Status ResidualAdd(Device& d, const ResidualAddArgs& a) {
  return RunKernel(d, &Backend::residual_add, ValidateResidualAdd, a);
}

Status ResidualAccumulate(Device& d, const ResidualAccumulateArgs& a) {
  return RunKernel(d, &Backend::residual_accumulate, ValidateResidualAccumulate, a);
}

}  // namespace ferry
