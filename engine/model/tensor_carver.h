// TensorCarver: lays named tensors out one after another in one device
// allocation, so that a group of tensors (a block's saved activations, its
// workspace, the weights) is one arena block.
//
// Planning runs a layout function twice: first over a carver without a buffer
// (it only counts bytes, the tensors it returns have null data), then over the
// allocated buffer (same offsets). Every tensor starts on a kAlignment-byte
// boundary.
//
// A CarveSource (optional) lets a caller that planned the device memory itself (the pipeline
// executor, engine/exec) hand a region of one of its own allocations to each requester instead of
// a fresh arena block: the requester's layout must then fit the region.
//
// Plain value type; not thread-safe.
#pragma once

#include <cstddef>
#include <string_view>

#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry {

class TensorCarver {
 public:
  static constexpr size_t kAlignment = 256;

  TensorCarver() = default;  // counting only
  explicit TensorCarver(const DeviceBuffer* buffer) : buffer_(buffer) {}
  // Carves from device memory starting at `base` (a region the caller owns).
  explicit TensorCarver(DevicePtr<std::byte> base) : base_(base), has_base_(true) {}

  // The next tensor of this dtype and shape. `offset` (optional) receives its
  // byte offset.
  Tensor Take(DType dtype, Shape shape, size_t* offset = nullptr) {
    Tensor t;
    t.dtype = dtype;
    t.shape = shape;
    if (buffer_ != nullptr) t = buffer_->View(dtype, shape, offset_);
    if (has_base_) t.data = base_ + std::ptrdiff_t(offset_);
    if (offset != nullptr) *offset = offset_;
    const size_t bytes = size_t(shape.numel()) * DTypeSize(dtype);
    offset_ += (bytes + kAlignment - 1) / kAlignment * kAlignment;
    unaligned_ += bytes;
    return t;
  }
  size_t bytes() const { return offset_; }
  // The tensors' own bytes, without the alignment between them.
  size_t unaligned_bytes() const { return unaligned_; }

 private:
  const DeviceBuffer* buffer_ = nullptr;
  DevicePtr<std::byte> base_;
  bool has_base_ = false;
  size_t offset_ = 0;
  size_t unaligned_ = 0;
};

// Hands out device regions by requester name ("blocks.saved.0", "params.weights", ...).
// Implementations say what they are backed by; the region stays valid while the source does.
class CarveSource {
 public:
  virtual ~CarveSource() = default;
  // The start of a region of at least `bytes` for `requester`. Errors: OutOfMemory naming the
  // requester and the region when it is too small; NotFound when the source has no region for it.
  virtual Result<DevicePtr<std::byte>> Region(std::string_view requester, size_t bytes) = 0;
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

// As above, but with a source the tensors are carved from its region for `requester` and the
// returned buffer is empty (the source owns the memory).
template <typename Layout>
Result<DeviceBuffer> AllocateCarved(Device& d, CarveSource* source, std::string_view requester,
                                    Layout&& layout) {
  if (source == nullptr) return AllocateCarved(d, requester, layout);
  TensorCarver count;
  layout(count);
  FERRY_ASSIGN_OR_RETURN(DevicePtr<std::byte> base, source->Region(requester, count.bytes()));
  TensorCarver carve(base);
  layout(carve);
  return DeviceBuffer();
}

}  // namespace ferry
