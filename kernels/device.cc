#include "kernels/device.h"

#include <cassert>
#include <utility>

namespace ferry {

std::string_view StreamName(StreamId s) {
  switch (s) {
    case StreamId::kCompute: return "compute";
    case StreamId::kUpload: return "upload";
    case StreamId::kDownload: return "download";
  }
  return "?";
}

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : device_(std::exchange(o.device_, nullptr)),
      data_(std::exchange(o.data_, {})),
      bytes_(std::exchange(o.bytes_, 0)),
      handle_(std::exchange(o.handle_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Release();
    device_ = std::exchange(o.device_, nullptr);
    data_ = std::exchange(o.data_, {});
    bytes_ = std::exchange(o.bytes_, 0);
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}

void DeviceBuffer::Release() {
  if (device_ != nullptr) device_->Free(handle_);
  device_ = nullptr;
  data_ = {};
  bytes_ = 0;
}

Tensor DeviceBuffer::View(DType dtype, Shape shape, size_t byte_offset) const {
  Tensor t{data_ + std::ptrdiff_t(byte_offset), dtype, shape};
  assert(byte_offset + t.bytes() <= bytes_);
  return t;
}

DeviceBuffer Device::MakeBuffer(Device* device, DevicePtr<std::byte> data, size_t bytes,
                                size_t handle) {
  DeviceBuffer b;
  b.device_ = device;
  b.data_ = data;
  b.bytes_ = bytes;
  b.handle_ = handle;
  return b;
}

}  // namespace ferry
