// VersionedStore: fixed-size records on disk, each kept in two versioned slots so that a record
// is always wholly at one version, whatever moment a crash or a kill -9 strikes. The trainer keeps
// each layer's optimizer state (fp32 master weights and AdamW moments) in one record when the
// plan puts optimizer state on NVMe (engine/train/trainer.h).
//
// Layout: record r lives in "<dir>/record-NNNNN.slots", two slots of SlotBytes(record_bytes)
// each, space reserved (fallocate) when the store is created. A slot is the record's bytes
// followed by a SlotHeader (magic, record index, step, payload size, CRC-32C of the payload,
// CRC-32C of the header), padded to the O_DIRECT block (4096 bytes); it is written whole with one
// pwrite and made durable with fdatasync.
//
// Commit protocol: a record's new version is written to the slot that does not hold its
// committed version, then fdatasync'ed; only then is it the committed one (the in-memory index
// flips, and on disk it is the valid slot with the higher step). A crash before the fdatasync
// returns leaves the old slot untouched and the new one either complete (then it is the newer
// version, also whole) or torn (its checksum fails: the old version stays). Open chooses, per
// record, the valid slot with the higher step, so a reader always finds each record wholly at one
// step and knows which.
//
// Staging: a record is read into one of `staging_buffers` page-aligned host buffers of the largest
// slot's size (all the host memory the store takes), updated there by the caller and committed
// from there. Prefetch starts a read ahead on the store's one I/O thread, into a free buffer;
// Acquire waits for it (or reads on the caller's thread when nothing was prefetched). Every read
// and write moves whole slots, so the bytes per cycle are known ahead: SlotBytes read, SlotBytes
// written (the planner's figure, engine/plan/memory_model.h "optimizer.slots").
//
// I/O goes through an IoEnv (io_env.h), O_DIRECT where the filesystem accepts it, each result
// passed through IoEnv::FilterCompletion, so tests inject EIO or torn writes as for NvmeStore.
// NvmeStore's index lives in memory only (scratch for one run); this store's files are found
// again by Open, which is what a resume after a crash needs.
//
// Thread-safety: Prefetch, Acquire, Commit, Release and the accessors may be called from any
// thread, but one record is acquired by one caller at a time. Destroying the store waits for the
// read in flight.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kernels/host_memory.h"
#include "kernels/status.h"
#include "offload/io_env.h"

namespace ferry {

inline constexpr size_t kVersionedSlotAlign = 4096;  // O_DIRECT block
inline constexpr size_t kVersionedSlotHeaderBytes = 48;

// The bytes of one slot of a record of `record_bytes`: the record, its header, padding.
constexpr size_t VersionedSlotBytes(size_t record_bytes) {
  return (record_bytes + kVersionedSlotHeaderBytes + kVersionedSlotAlign - 1) /
         kVersionedSlotAlign * kVersionedSlotAlign;
}

struct VersionedStoreOptions {
  std::string directory;    // created when missing (its parent must exist)
  int staging_buffers = 2;  // >= 1: the record in use and the one prefetched behind it
  bool direct_io = true;    // O_DIRECT where the filesystem accepts it
  IoEnv* env = nullptr;     // not owned, must outlive the store; nullptr = the real OS
};

struct VersionedStoreStats {
  uint64_t bytes_read = 0;     // whole slots read (headers and padding included)
  uint64_t bytes_written = 0;  // whole slots written
  uint64_t commits = 0;
  uint64_t wasted_prefetches = 0;  // prefetched records dropped unused to free a buffer
  uint64_t unprefetched = 0;       // acquires whose record was not read ahead (read then, waited)
};

class VersionedStore {
 public:
  // Creates (or truncates) one file per record, writes each record's slot 0 at `step` with the
  // bytes `init(r, record)` fills in (record arrives zeroed), and fdatasyncs them.
  static Result<std::unique_ptr<VersionedStore>> Create(
      VersionedStoreOptions options, std::vector<size_t> record_bytes, int64_t step,
      const std::function<void(size_t, std::span<std::byte>)>& init);
  // Opens the files a Create made (and commits updated): each record at its newest valid slot.
  // Corruption naming the file when a record has no valid slot or a size other than asked.
  static Result<std::unique_ptr<VersionedStore>> Open(VersionedStoreOptions options,
                                                      std::vector<size_t> record_bytes);
  ~VersionedStore();
  VersionedStore(const VersionedStore&) = delete;
  VersionedStore& operator=(const VersionedStore&) = delete;

  size_t records() const { return record_bytes_.size(); }
  // The step of record r's committed version.
  int64_t step(size_t r) const;
  const std::string& path(size_t r) const { return paths_[r]; }
  bool direct_io() const { return direct_io_; }
  VersionedStoreStats stats() const;
  // Host bytes of the staging buffers.
  size_t staging_bytes() const { return staging_.size(); }
  // Bytes of the files on disk: two slots of every record.
  uint64_t disk_bytes() const;

  // Starts reading record r's committed version into a free staging buffer; does nothing when it
  // is already staged or no buffer is free (a bounded read-ahead, never an error).
  void Prefetch(size_t r);
  // Record r's committed bytes, in a staging buffer the caller may change until Commit or
  // Release. Errors (the read's, a checksum that fails) name the file and the slot; the buffer
  // is released then. REQUIRES: r is not acquired.
  Result<std::span<std::byte>> Acquire(size_t r);
  // Writes the acquired bytes of r as its version `step` to its other slot, fdatasyncs, and makes
  // it the committed version; releases the buffer either way. On error the committed version is
  // unchanged (on disk too). REQUIRES: r is acquired.
  Status Commit(size_t r, int64_t step);
  // Gives back an acquired buffer without writing. REQUIRES: r is acquired.
  void Release(size_t r);

 private:
  enum class BufferState { kFree, kReading, kReady, kAcquired };
  struct Buffer {
    BufferState state = BufferState::kFree;
    size_t record = 0;
    Status status;  // of the read, once kReady
  };
  VersionedStore(VersionedStoreOptions options, std::vector<size_t> record_bytes);
  Status OpenFiles(bool create);
  Status AllocateStaging();
  // Reads slot `slot` of record r whole into `dst` and checks it; returns its step.
  Result<int64_t> ReadSlot(size_t r, int slot, std::byte* dst);
  Status WriteSlot(size_t r, int slot, int64_t step, std::byte* src);
  std::byte* buffer_data(size_t b) const { return staging_.data() + b * buffer_bytes_; }
  // REQUIRES: mu_ held. The buffer holding r, or -1.
  int FindLocked(size_t r) const;
  void IoThread();

  VersionedStoreOptions options_;
  IoEnv* env_;  // not owned
  std::vector<size_t> record_bytes_;
  std::vector<std::string> paths_;
  std::vector<int> fds_;
  bool direct_io_ = false;
  size_t buffer_bytes_ = 0;
  HostAllocation staging_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> committed_slot_;  // per record; guarded by mu_
  std::vector<int64_t> step_;        // per record; guarded by mu_
  std::vector<Buffer> buffers_;      // guarded by mu_
  std::deque<size_t> queue_;         // buffers waiting for the I/O thread; guarded by mu_
  bool stop_ = false;                // guarded by mu_
  VersionedStoreStats stats_;        // guarded by mu_
  std::thread io_thread_;
};

}  // namespace ferry
