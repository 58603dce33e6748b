// Arena: the offset allocator behind every device's memory (CPU and CUDA alike).
//
// It hands out aligned [offset, offset + size) ranges of a fixed capacity, best fit with
// coalescing of freed neighbours, and never grows: a request that does not fit fails with
// OutOfMemory naming the device, the requester, the size, what is in use, the largest free block
// and the capacity. Every allocation is logged by name, so the planner's tests can compare the
// executor's real allocations with the plan.
//
// Thread-safety: all methods may be called concurrently (one internal mutex).
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry {

class Arena {
 public:
  struct Block {
    size_t offset = 0;
    size_t handle = 0;
  };
  // REQUIRES: alignment is a power of two; capacity is a multiple of it.
  Arena(std::string device_name, size_t capacity, size_t alignment);

  // REQUIRES: bytes > 0.
  Result<Block> Allocate(size_t bytes, std::string_view requester);
  // REQUIRES: handle came from Allocate and was not freed.
  void Free(size_t handle);

  ArenaStats stats() const;
  std::vector<ArenaRecord> log() const;
  // Restarts the high-water mark at the current use and drops freed records from the log.
  void ResetPeak();
  size_t live_allocations() const;

 private:
  struct Live {
    size_t offset;
    size_t reserved;
    size_t log_index;
  };
  const std::string device_name_;
  const size_t capacity_;
  const size_t alignment_;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;               // offset -> size; guarded by mu_
  std::unordered_map<size_t, Live> live_;       // handle -> block; guarded by mu_
  std::vector<ArenaRecord> log_;                // guarded by mu_
  size_t next_handle_ = 1;                      // guarded by mu_
  size_t in_use_ = 0;                           // guarded by mu_
  size_t peak_ = 0;                             // guarded by mu_
};

// "1.5 MiB" style sizes for messages.
std::string FormatBytes(size_t bytes);

}  // namespace ferry
