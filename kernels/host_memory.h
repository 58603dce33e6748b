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

// The pages backing a HostAllocation. Transfers to and from disk and GPU pin and map memory page by
// page, so a 1 MiB block of 4 KiB pages costs 256 page pins and 256 scatter entries, where 2 MiB
// transparent huge pages cost one; on this project's virtual test disk zero-copy O_DIRECT writes
// from huge pages ran 2.3x faster and reads 2.5x (see bench/nvme_bench.cc).
enum class HostPages {
  // Mappings of at least one huge page are aligned to it and advised MADV_HUGEPAGE. The kernel
  // backs them with huge pages when its mode (TransparentHugePagesMode) is "always" or "madvise"
  // and it finds free huge pages; otherwise base pages, silently.
  kHugeWhereLarge,
  kBase,  // MADV_NOHUGEPAGE: base pages even in mode "always" (benchmarks of the small-page case)
};

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
  static Result<HostAllocation> Map(size_t bytes, std::string name,
                                    HostPages pages = HostPages::kHugeWhereLarge);

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // A view of [offset, offset + bytes). REQUIRES: the range lies inside the allocation.
  HostSpan Span(size_t offset, size_t bytes) const;
  HostSpan Whole() const;

  // Keeps a driver registration alive exactly as long as the mapping (released first).
  void Attach(std::unique_ptr<HostRegistration> registration) {
    registration_ = std::move(registration);
  }
  bool registered() const { return registration_ != nullptr; }
  // Bytes of the mapping in RAM now (mincore: pages touched and not released or swapped out);
  // 0 for an empty allocation or when the kernel cannot say.
  size_t ResidentBytes() const;

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
  std::span<T> as() const {
    return {reinterpret_cast<T*>(data_), size_ / sizeof(T)};
  }
  // A sub-range. REQUIRES: offset + bytes <= size().
  HostSpan Sub(size_t offset, size_t bytes) const;

 private:
  friend class HostAllocation;
  HostSpan(std::byte* d, size_t n) : data_(d), size_(n) {}
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

size_t HostPageSize();
// The transparent huge page size (/sys/kernel/mm/transparent_hugepage/hpage_pmd_size), or 0 when
// the kernel has no transparent huge pages.
size_t HostHugePageSize();
// The kernel's transparent huge page mode: "always", "madvise", "never", or "unavailable".
std::string TransparentHugePagesMode();

}  // namespace ferry
