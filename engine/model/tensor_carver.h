// TensorCarver: lays named tensors out one after another in one device
// allocation, so that a group of tensors (a block's saved activations, its
// workspace, the weights) is one arena block.
//
// Planning runs a layout function twice: first over a carver without a buffer
// (it only counts bytes, the tensors it returns have null data), then over the
// allocated buffer (same offsets). Every tensor starts on a kAlignment-byte
// boundary.
//
// Plain value type; not thread-safe.
#pragma once

#include <cstddef>

#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry {

class TensorCarver {
 public:
  static constexpr size_t kAlignment = 256;

  TensorCarver() = default;  // counting only
  explicit TensorCarver(const DeviceBuffer* buffer) : buffer_(buffer) {}

  // The next tensor of this dtype and shape. `offset` (optional) receives its
  // byte offset.
  Tensor Take(DType dtype, Shape shape, size_t* offset = nullptr) {
    Tensor t;
    t.dtype = dtype;
    t.shape = shape;
    if (buffer_ != nullptr) t = buffer_->View(dtype, shape, offset_);
    if (offset != nullptr) *offset = offset_;
    const size_t bytes = size_t(shape.numel()) * DTypeSize(dtype);
    offset_ += (bytes + kAlignment - 1) / kAlignment * kAlignment;
    return t;
  }
  size_t bytes() const { return offset_; }

 private:
  const DeviceBuffer* buffer_ = nullptr;
  size_t offset_ = 0;
};

// Runs `layout(carver)` once to count, allocates one buffer named `requester`
// (at least one byte), and runs it again over the buffer so the tensors it
// assigns point into it.
template <typename Layout>
Result<DeviceBuffer> AllocateCarved(Device& d, std::string_view requester, Layout&& layout) {
  TensorCarver count;
  layout(count);
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                         d.Allocate(count.bytes() == 0 ? 1 : count.bytes(), requester));
  TensorCarver carve(&buffer);
  layout(carve);
  return buffer;
}

}  // namespace ferry
