#include "kernels/ops/layernorm.h"

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {

Status ValidateLayerNormForward(const LayerNormForwardArgs& a) {
  const char* op = "layernorm_forward";
  int64_t n, c;
  FERRY_RETURN_IF_ERROR(CheckMatrix(op, "x", a.x, &n, &c));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor(op, "weight", a.weight, Shape{c}));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor(op, "bias", a.bias, Shape{c}));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor(op, "y", a.y, Shape{n, c}));
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(op, "mean", a.mean, Shape{n}, DType::kF32));
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(op, "rstd", a.rstd, Shape{n}, DType::kF32));
  if (!(a.eps >= 0.0f)) return Status::InvalidArgument("layernorm_forward: eps must be >= 0");
  return Status::Ok();
}

Status ValidateLayerNormBackward(const LayerNormBackwardArgs& a) {
  const char* op = "layernorm_backward";
  int64_t n, c;
  FERRY_RETURN_IF_ERROR(CheckMatrix(op, "x", a.x, &n, &c));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor(op, "dy", a.dy, Shape{n, c}));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor(op, "weight", a.weight, Shape{c}));
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(op, "mean", a.mean, Shape{n}, DType::kF32));
  FERRY_RETURN_IF_ERROR(CheckTensorOfType(op, "rstd", a.rstd, Shape{n}, DType::kF32));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor(op, "dx", a.dx, Shape{n, c}));
  FERRY_RETURN_IF_ERROR(CheckFloatTensor(op, "dweight", a.dweight, Shape{c}));
  return CheckFloatTensor(op, "dbias", a.dbias, Shape{c});
}

Status LayerNormForward(Device& d, const LayerNormForwardArgs& a) {
  return RunKernel(d, &Backend::layernorm_forward, ValidateLayerNormForward, a);
}

Status LayerNormBackward(Device& d, const LayerNormBackwardArgs& a) {
  return RunKernel(d, &Backend::layernorm_backward, ValidateLayerNormBackward, a);
}

}  // namespace ferry
