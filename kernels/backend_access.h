// Unwraps device pointers into raw addresses. For device implementations and their kernels only
// (kernels/cpu, kernels/cuda, kernels/ops): code above kernels/ never includes this header.
#pragma once

#include "kernels/host_memory.h"
#include "kernels/tensor.h"

namespace ferry {

class BackendAccess {
 public:
  template <typename T>
  static T* Raw(DevicePtr<T> p) { return p.p_; }
  template <typename T>
  static DevicePtr<T> Wrap(T* p) { return DevicePtr<T>(p); }
  // Typed raw pointer to a tensor's elements. REQUIRES: sizeof(T) == DTypeSize(t.dtype).
  template <typename T>
  static T* Data(const Tensor& t) {
    assert(sizeof(T) == DTypeSize(t.dtype));
    return reinterpret_cast<T*>(t.data.p_);
  }
};

}  // namespace ferry
