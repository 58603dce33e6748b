#include "kernels/ops/adamw.h"

#include <cmath>
#include <string>

#include "kernels/ops/backend.h"

namespace ferry {

namespace {

Status CheckTensor(const Tensor& t, const char* name, int64_t n, bool allow_bf16) {
  if (t.data.is_null())
    return Status::InvalidArgument(std::string("AdamW: ") + name + " is missing");
  if (!(t.dtype == DType::kF32 || (allow_bf16 && t.dtype == DType::kBF16))) {
    return Status::InvalidArgument(std::string("AdamW: ") + name + " is " + t.ToString() +
                                   "; expected " + (allow_bf16 ? "f32 or bf16" : "f32"));
  }
  if (t.numel() != n) {
    return Status::InvalidArgument(std::string("AdamW: ") + name + " is " + t.ToString() +
                                   " with " + std::to_string(t.numel()) + " elements; expected " +
                                   std::to_string(n) + " (as p)");
  }
  return Status::Ok();
}

Status CheckRange(double x, bool ok, const char* name, const char* expected) {
  if (ok && std::isfinite(x)) return Status::Ok();
  return Status::InvalidArgument(std::string("AdamW: ") + name + " = " + std::to_string(x) +
                                 " is out of range; expected " + expected);
}

}  // namespace

Status ValidateAdamWHyperparameters(const AdamWHyperparameters& h) {
  FERRY_RETURN_IF_ERROR(CheckRange(h.lr, h.lr >= 0, "lr", "lr >= 0"));
  FERRY_RETURN_IF_ERROR(CheckRange(h.beta1, h.beta1 >= 0 && h.beta1 < 1, "beta1", "[0, 1)"));
  FERRY_RETURN_IF_ERROR(CheckRange(h.beta2, h.beta2 >= 0 && h.beta2 < 1, "beta2", "[0, 1)"));
  FERRY_RETURN_IF_ERROR(CheckRange(h.eps, h.eps > 0, "eps", "eps > 0"));
  FERRY_RETURN_IF_ERROR(
      CheckRange(h.weight_decay, h.weight_decay >= 0, "weight_decay", "weight_decay >= 0"));
  FERRY_RETURN_IF_ERROR(
      CheckRange(h.grad_scale, h.grad_scale >= 0, "grad_scale", "grad_scale >= 0"));
  if (h.step < 1) {
    return Status::InvalidArgument("AdamW: step = " + std::to_string(h.step) +
                                   "; expected >= 1 (1 for the first update)");
  }
  return Status::Ok();
}

Status ValidateAdamW(const AdamWArgs& a) {
  const int64_t n = a.p.numel();
  FERRY_RETURN_IF_ERROR(CheckTensor(a.p, "p", n, false));
  FERRY_RETURN_IF_ERROR(CheckTensor(a.g, "g", n, true));
  FERRY_RETURN_IF_ERROR(CheckTensor(a.m, "m", n, false));
  FERRY_RETURN_IF_ERROR(CheckTensor(a.v, "v", n, false));
  if (!a.p_bf16.data.is_null()) {
    if (a.p_bf16.dtype != DType::kBF16 || a.p_bf16.numel() != n) {
      return Status::InvalidArgument("AdamW: p_bf16 is " + a.p_bf16.ToString() +
                                     "; expected bf16 with " + std::to_string(n) +
                                     " elements (as p)");
    }
  }
  return ValidateAdamWHyperparameters(a.hyper);
}

Status AdamWStep(Device& d, const AdamWArgs& a) {
  return RunKernel(d, &Backend::adamw, ValidateAdamW, a);
}

}  // namespace ferry
