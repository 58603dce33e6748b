// Host memory that devices copy to and from.
//
// Copies go only between device memory and host-pool memory (pageable memory would make CUDA
// copies synchronous), so Device copy calls take a HostSpan, and a HostSpan can only be made from
// a HostAllocation: a page-aligned anonymous mapping owned by this RAII type. The host pool
// (offload/host_pool.h) carves large HostAllocations into exact-size spans and registers them with
// the GPU driver once (Device::RegisterHost).
//
// Thread-safety: a HostAllocation is not synchronized; spans of disjoint ranges may be used from
// different threads.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "kernels/status.h"

namespace ferry {

// Undoes a driver registration (cudaHostUnregister, munlock) when destroyed.
class HostRegistration {
 public:
  virtual ~HostRegistration() = default;
};

class HostSpan;

class HostAllocation {
 public:
  HostAllocation() = default;
  ~HostAllocation();
  HostAllocation(HostAllocation&& o) noexcept;
  HostAllocation& operator=(HostAllocation&& o) noexcept;
  HostAllocation(const HostAllocation&) = delete;
  HostAllocation& operator=(const HostAllocation&) = delete;

  // Maps `bytes` (rounded up to the page size) of zeroed anonymous memory. `name` appears in
  // errors. Fails with OutOfMemory naming the size when the mapping is refused.
  static Result<HostAllocation> Map(size_t bytes, std::string name);

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // A view of [offset, offset + bytes). REQUIRES: the range lies inside the allocation.
  HostSpan Span(size_t offset, size_t bytes) const;
  HostSpan Whole() const;

  // Keeps a driver registration alive exactly as long as the mapping (released first).
  void Attach(std::unique_ptr<HostRegistration> registration) { registration_ = std::move(registration); }
  bool registered() const { return registration_ != nullptr; }

 private:
  void Release();
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  std::unique_ptr<HostRegistration> registration_;
};

class HostSpan {
 public:
  HostSpan() = default;
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  std::span<T> as() const { return {reinterpret_cast<T*>(data_), size_ / sizeof(T)}; }
  // A sub-range. REQUIRES: offset + bytes <= size().
  HostSpan Sub(size_t offset, size_t bytes) const;

 private:
  friend class HostAllocation;
  HostSpan(std::byte* d, size_t n) : data_(d), size_(n) {}
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

size_t HostPageSize();

}  // namespace ferry
