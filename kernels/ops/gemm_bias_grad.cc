#include "kernels/ops/gemm_bias_grad.h"

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {

Status ValidateBiasGrad(const BiasGradArgs& a) {
  int64_t rows, cols;
  FERRY_RETURN_IF_ERROR(CheckMatrix("bias_grad", "dy", a.dy, &rows, &cols));
  return CheckFloatTensor("bias_grad", "db", a.db, Shape{cols});
}

Status BiasGrad(Device& d, const BiasGradArgs& a) {
  return RunKernel(d, &Backend::bias_grad, ValidateBiasGrad, a);
}

}  // namespace ferry
