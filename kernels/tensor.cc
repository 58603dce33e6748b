#include "kernels/tensor.h"

namespace ferry {

std::string Shape::ToString() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

std::string Tensor::ToString() const { return std::string(DTypeName(dtype)) + shape.ToString(); }

}  // namespace ferry
