#include "kernels/ops/nf4_dequantize.h"

#include <cmath>
#include <string>

#include "kernels/ops/backend.h"
#include "kernels/ops/check_args.h"

namespace ferry {
namespace {

constexpr const char* kOp = "nf4_dequantize";

// `t` is given, of dtype `dtype` and `numel` elements (any shape: bitsandbytes keeps packed codes
// as (n, 1) and ferry as (n)).
Status CheckElements(const char* name, const Tensor& t, DType dtype, int64_t numel,
                     const std::string& why) {
  if (t.data.is_null()) {
    return Status::InvalidArgument(std::string(kOp) + ": tensor '" + name + "' is null");
  }
  if (t.dtype != dtype || t.numel() != numel) {
    return Status::InvalidArgument(
        std::string(kOp) + ": tensor '" + name + "' must be " + std::string(DTypeName(dtype)) +
        " with " + std::to_string(numel) + " elements (" + why + "), got " + t.ToString());
  }
  return Status::Ok();
}

}  // namespace

Status ValidateNf4Dequantize(const Nf4DequantizeArgs& a) {
  FERRY_RETURN_IF_ERROR(CheckFloatTensor(kOp, "out", a.out, a.out.shape));
  if (a.block <= 0 || a.block % 2 != 0) {
    return Status::InvalidArgument(std::string(kOp) + ": block size " + std::to_string(a.block) +
                                   " is not supported: it must be positive and even");
  }
  const int64_t n = a.out.numel(), blocks = (n + a.block - 1) / a.block;
  const std::string of_out = std::to_string(n) + " outputs in blocks of " + std::to_string(a.block);
  FERRY_RETURN_IF_ERROR(CheckElements("packed", a.packed, DType::kU8, (n + 1) / 2,
                                      std::to_string(n) + " outputs, two codes a byte"));
  FERRY_RETURN_IF_ERROR(CheckElements("code", a.code, DType::kF32, 16, "the 4-bit map"));
  if (!a.nested()) {
    if (Given(a.nested_absmax) || Given(a.nested_code) || Given(a.nested_offset)) {
      return Status::InvalidArgument(std::string(kOp) +
                                     ": nested_absmax/nested_code/nested_offset given but absmax "
                                     "is f32 (a nested weight's absmax holds u8 indices)");
    }
    return CheckElements("absmax", a.absmax, DType::kF32, blocks, of_out);
  }
  if (a.nested_block <= 0) {
    return Status::InvalidArgument(std::string(kOp) + ": nested block size " +
                                   std::to_string(a.nested_block) + " is not positive");
  }
  FERRY_RETURN_IF_ERROR(CheckElements("absmax", a.absmax, DType::kU8, blocks, of_out));
  FERRY_RETURN_IF_ERROR(CheckElements(
      "nested_absmax", a.nested_absmax, DType::kF32, (blocks + a.nested_block - 1) / a.nested_block,
      std::to_string(blocks) + " blocks in nested blocks of " + std::to_string(a.nested_block)));
  FERRY_RETURN_IF_ERROR(
      CheckElements("nested_code", a.nested_code, DType::kF32, 256, "the 8-bit dynamic map"));
  return CheckElements("nested_offset", a.nested_offset, DType::kF32, 1, "one offset a weight");
}

Status Nf4Dequantize(Device& d, const Nf4DequantizeArgs& a) {
  return RunKernel(d, &Backend::nf4_dequantize, ValidateNf4Dequantize, a);
}

}  // namespace ferry
