// HostPool: the host-RAM tier. Hands out exact-size, page-aligned host buffers (HostSpans the
// Device copies accept) carved from a few large anonymous mappings.
//
// Two kinds, each counted against its own budget:
//  - pinned: bf16 copies that are uploaded and buffers gradients land in. Their mappings are
//    locked (mlock) and registered once, when mapped, with every device given (Device::
//    RegisterHost: cudaHostRegister on CUDA, once per process for all GPUs, since a portable
//    registration covers them all and a second one is refused), so copies run at full speed.
//  - pageable: fp32 master weights, gradients for the update, Adam moments.
// A request that would pass the budget fails with OutOfMemory naming the requester, the size,
// what is in use and the budget — never an OOM kill later. A lock the kernel refuses
// (RLIMIT_MEMLOCK) is reported with the limit and how to raise it.
//
// NUMA: with numa_node >= 0 every mapping is bound (mbind) to that node before it is touched;
// on a machine with one node that is a no-op, and numa_report() says so.
//
// Ownership: the pool owns its mappings; a HostBlock gives its range back when destroyed and
// must not outlive the pool. Registrations are undone before the mappings are unmapped.
// Thread-safety: Allocate, stats and HostBlock destruction may run concurrently (one mutex).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/device.h"
#include "kernels/host_memory.h"
#include "kernels/status.h"

namespace ferry {

enum class HostMemoryKind { kPinned = 0, kPageable = 1 };
std::string_view HostMemoryKindName(HostMemoryKind k);

struct HostPoolOptions {
  size_t pinned_budget = 0;    // bytes; 0 allows none
  size_t pageable_budget = 0;  // bytes; 0 allows none
  // Size of each mapping carved into buffers (a larger request gets a mapping of its own size).
  size_t chunk_bytes = size_t{256} << 20;
  int numa_node = -1;            // -1: no placement
  std::vector<Device*> devices;  // not owned; pinned mappings are registered with each
  // false: pinned mappings are registered but not locked (mlock). Only a GPU's DMA needs
  // page-locked memory; CPU devices copy from any memory alike, and locking would make their
  // users raise RLIMIT_MEMLOCK (8 MiB by default) for nothing.
  bool lock_pinned = true;
};

struct HostPoolStats {
  size_t budget = 0;
  size_t in_use = 0;  // bytes handed out (page-rounded)
  size_t peak = 0;
  size_t mapped = 0;  // bytes of mappings (counted against the budget too)
  size_t mappings = 0;
};

class HostPool;

// One buffer from the pool. Move-only.
class HostBlock {
 public:
  HostBlock() = default;
  ~HostBlock();
  HostBlock(HostBlock&& o) noexcept;
  HostBlock& operator=(HostBlock&& o) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;

  // Exactly the bytes requested.
  HostSpan span() const { return span_; }
  std::byte* data() const { return span_.data(); }
  size_t size() const { return span_.size(); }
  HostMemoryKind kind() const { return kind_; }
  bool valid() const { return pool_ != nullptr; }

 private:
  friend class HostPool;
  void Release();
  HostPool* pool_ = nullptr;
  HostSpan span_;
  HostMemoryKind kind_ = HostMemoryKind::kPageable;
  size_t chunk_ = 0;
  size_t offset_ = 0;
  size_t reserved_ = 0;
};

class HostPool {
 public:
  static Result<std::unique_ptr<HostPool>> Create(HostPoolOptions options);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // REQUIRES: bytes > 0.
  Result<HostBlock> Allocate(size_t bytes, HostMemoryKind kind, std::string_view requester);
  HostPoolStats stats(HostMemoryKind kind) const;
  // The pages of the pool's mappings now in RAM (HostAllocation::ResidentBytes): all of them once
  // locked for a GPU, else those written so far.
  size_t ResidentBytes() const;
  const std::string& numa_report() const { return numa_report_; }
  // Number of NUMA nodes with memory on this machine (1 when it cannot tell).
  static int NumaNodes();

 private:
  friend class HostBlock;
  struct Chunk {
    HostAllocation mapping;
    HostMemoryKind kind;
    std::map<size_t, size_t> free;  // offset -> bytes, coalesced
  };
  explicit HostPool(HostPoolOptions options) : options_(std::move(options)) {}
  Result<size_t> MapChunkLocked(size_t bytes, HostMemoryKind kind, std::string_view requester);
  void Free(size_t chunk, size_t offset, size_t bytes, HostMemoryKind kind);

  const HostPoolOptions options_;
  std::string numa_report_;
  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;  // guarded by mu_
  HostPoolStats stats_[2];     // guarded by mu_; indexed by HostMemoryKind
};

}  // namespace ferry
