// SegmentAllocator: the NvmeStore's disk space: segment files of fixed-size slots.
//
// Segment k is "<dir>/segment-<k>.ferry", segment_bytes long, space reserved with fallocate when
// it is created. Slots are handed out lowest first, so a fresh store writes sequentially. When
// every slot is taken a new segment is created; a full disk (or a file-size limit) is NoSpace
// and a vanished directory NotFound, both naming the file — slots already handed out (and what
// was written to them) are unaffected.
//
// Ownership: owns the segment files' descriptors (closed, files removed, on destruction).
// Thread-safety: all methods are safe to call concurrently (internal mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kernels/status.h"
#include "offload/io_env.h"

namespace ferry {

struct Slot {
  int fd = -1;
  uint32_t segment = 0;
  uint64_t offset = 0;  // within the segment file
  uint64_t id = 0;      // global slot number
};

class SegmentAllocator {
 public:
  // REQUIRES: segment_bytes a multiple of slot_bytes > 0. `open_flags` are added to
  // O_RDWR | O_CREAT when segments are opened (O_DIRECT or 0).
  SegmentAllocator(IoEnv& env, std::string directory, size_t slot_bytes, size_t segment_bytes,
                   int open_flags);
  ~SegmentAllocator();
  SegmentAllocator(const SegmentAllocator&) = delete;
  SegmentAllocator& operator=(const SegmentAllocator&) = delete;

  // Creates segments until at least `bytes` of slots exist.
  Status Reserve(size_t bytes);
  // `count` slots, or the error of the segment that could not be created (nothing allocated).
  Result<std::vector<Slot>> Allocate(size_t count);
  void Free(const std::vector<Slot>& slots);

  std::string SegmentPath(uint32_t segment) const;
  size_t capacity_bytes() const;
  size_t free_slots() const;

 private:
  Status AddSegmentLocked();  // REQUIRES: mu_ held

  IoEnv& env_;
  const std::string directory_;
  const size_t slot_bytes_;
  const size_t segment_bytes_;
  const int open_flags_;
  mutable std::mutex mu_;
  std::vector<int> fds_;     // guarded by mu_; one per segment
  std::set<uint64_t> free_;  // guarded by mu_; free slot ids
};

}  // namespace ferry
