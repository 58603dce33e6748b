// Test helper (header-only; tests only): a device tensor filled from and read back to host vectors
// through a HostAllocation, synchronously, for running ops through their dispatchers on a
// CpuDevice. Failures are reported as gtest failures (and leave zeros behind).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/host_memory.h"
#include "kernels/tensor.h"

namespace ferry::testing {

class DeviceTensor {
 public:
  // Allocates shape.numel() elements of `dtype` on `d`, named `name` in the arena log.
  DeviceTensor(Device& d, DType dtype, Shape shape, std::string name)
      : device_(&d), dtype_(dtype), shape_(shape) {
    auto b = d.Allocate(std::max<size_t>(1, bytes()), name);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (b.ok()) buffer_ = std::move(b).value();
  }

  bool ok() const { return buffer_.valid(); }
  size_t bytes() const { return size_t(shape_.numel()) * DTypeSize(dtype_); }
  Tensor tensor() const { return Tensor{buffer_.data(), dtype_, shape_}; }
  const DeviceBuffer& buffer() const { return buffer_; }

  // Values rounded to the tensor's dtype. REQUIRES: v.size() == numel.
  void Upload(const std::vector<float>& v) {
    std::vector<std::byte> bytes_host(bytes());
    ConvertFromFloat(v.data(), dtype_, bytes_host.data(), v.size());
    UploadBytes(bytes_host.data(), bytes_host.size());
  }
  void UploadBytes(const void* src, size_t n) {
    if (!ok() || n == 0) return;
    auto host = HostAllocation::Map(n, "test staging");
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    std::memcpy(host->data(), src, n);
    ASSERT_TRUE(device_->CopyToDevice(buffer_.data(), host->Span(0, n), n).ok());
    const Status s = device_->Synchronize(StreamId::kUpload);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Waits for all work on the device (compute included), then copies back.
  std::vector<float> Download() {
    std::vector<float> out(size_t(shape_.numel()), 0.0f);
    if (!ok() || out.empty()) return out;
    const Status sync = device_->Synchronize();
    EXPECT_TRUE(sync.ok()) << sync.ToString();
    auto host = HostAllocation::Map(bytes(), "test staging");
    EXPECT_TRUE(host.ok()) << host.status().ToString();
    if (!host.ok()) return out;
    EXPECT_TRUE(device_->CopyToHost(host->Span(0, bytes()), buffer_.data(), bytes()).ok());
    const Status s = device_->Synchronize(StreamId::kDownload);
    EXPECT_TRUE(s.ok()) << s.ToString();
    ConvertToFloat(dtype_, host->data(), out.data(), out.size());
    return out;
  }

 private:
  Device* device_;
  DType dtype_;
  Shape shape_;
  DeviceBuffer buffer_;
};

}  // namespace ferry::testing
