#include "kernels/ops/layernorm.h"

#include "kernels/cpu/layernorm.h"
#include "kernels/ops/check_args.h"
#include "kernels/ops/dispatch.h"

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

size_t LayerNormScratchBytes(const Device&) { return 0; }

Status LayerNormForward(Device& d, const LayerNormForwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateLayerNormForward(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "layernorm_forward");
  return EnqueueCpuKernel(d, "layernorm_forward",
                          [a](ThreadPool& p) { return cpu::LayerNormForward(p, a); });
}

Status LayerNormBackward(Device& d, const LayerNormBackwardArgs& a) {
  FERRY_RETURN_IF_ERROR(ValidateLayerNormBackward(a));
  if (d.kind() != DeviceKind::kCpu) return NotOnDevice(d, "layernorm_backward");
  return EnqueueCpuKernel(d, "layernorm_backward",
                          [a](ThreadPool& p) { return cpu::LayerNormBackward(p, a); });
}

}  // namespace ferry
