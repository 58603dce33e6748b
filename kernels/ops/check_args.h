// Argument checks shared by the op validators (kernels/ops/*.cc): each returns InvalidArgument
// naming the op, the tensor and what was expected versus what came, so the message says what to
// fix. Header-only, pure functions.
#pragma once

#include <string>
#include <string_view>

#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

// A tensor is "given" when it points somewhere; optional arguments are left default (null).
inline bool Given(const Tensor& t) { return !t.data.is_null(); }

inline bool IsFloatDType(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

// `t` has exactly shape `want` and a floating-point storage dtype.
inline Status CheckFloatTensor(std::string_view op, std::string_view name, const Tensor& t,
                               const Shape& want) {
  if (!(t.shape == want)) {
    return Status::InvalidArgument(std::string(op) + ": " + std::string(name) +
                                   " must have shape " + want.ToString() + ", got " +
                                   t.shape.ToString());
  }
  if (!IsFloatDType(t.dtype)) {
    return Status::InvalidArgument(std::string(op) + ": " + std::string(name) +
                                   " must be f32, bf16 or f16, got " + t.ToString());
  }
  if (t.data.is_null() && t.numel() > 0) {
    return Status::InvalidArgument(std::string(op) + ": " + std::string(name) +
                                   " has no data (null pointer)");
  }
  return Status::Ok();
}

// As CheckFloatTensor, and the dtype must be `dtype` (statistics saved in fp32, for example).
inline Status CheckTensorOfType(std::string_view op, std::string_view name, const Tensor& t,
                                const Shape& want, DType dtype) {
  FERRY_RETURN_IF_ERROR(CheckFloatTensor(op, name, t, want));
  if (t.dtype != dtype) {
    return Status::InvalidArgument(std::string(op) + ": " + std::string(name) + " must be " +
                                   std::string(DTypeName(dtype)) + ", got " + t.ToString());
  }
  return Status::Ok();
}

// `t` is given, of dtype `dtype` (any, i32 ids included) and shape `want`. Unlike
// CheckFloatTensor, an empty tensor must be given too.
inline Status CheckExactTensor(std::string_view op, std::string_view name, const Tensor& t,
                               DType dtype, const Shape& want) {
  if (t.data.is_null()) {
    return Status::InvalidArgument(std::string(op) + ": tensor '" + std::string(name) +
                                   "' is null");
  }
  if (t.dtype != dtype || !(t.shape == want)) {
    return Status::InvalidArgument(std::string(op) + ": tensor '" + std::string(name) +
                                   "' must be " + std::string(DTypeName(dtype)) + want.ToString() +
                                   ", got " + t.ToString());
  }
  return Status::Ok();
}

// A rank-2 float tensor; its dimensions are returned through rows/cols.
inline Status CheckMatrix(std::string_view op, std::string_view name, const Tensor& t,
                          int64_t* rows, int64_t* cols) {
  if (t.shape.rank() != 2) {
    return Status::InvalidArgument(std::string(op) + ": " + std::string(name) +
                                   " must be a matrix (rank 2), got " + t.ToString());
  }
  *rows = t.dim(0);
  *cols = t.dim(1);
  return CheckFloatTensor(op, name, t, t.shape);
}

}  // namespace ferry
