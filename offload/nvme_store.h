// NvmeStore: named blocks of bytes on a local disk (the tier beneath host RAM), and read-only
// access to existing files (a model's safetensors) through the same I/O machinery.
//
// Layout: segment files "<dir>/segment-NNNNN.ferry" of segment_bytes each, space reserved with
// fallocate when a segment is created (reserve_bytes worth at Open, more as the store grows). An
// entry of N bytes occupies ceil(N / block_bytes) fixed-size slots; each block is written with
// O_DIRECT (when the filesystem allows), optionally zstd-compressed, and carries a CRC-32C
// verified on every read (a mismatch is Corruption naming
// the entry, block, file and offset). The index lives in memory: the store is scratch space for
// one run, not a database; nothing persists across Open.
//
// I/O: one dispatcher thread per store drives an IoEngine (io_uring with a bounded ring of
// registered bounce buffers, or a thread pool of pread/pwrite; see io_engine.h) with at most
// queue_depth blocks in flight (it refills the ring before checksumming and verifying, so the
// disk never waits for that CPU work). Every completion's result is checked; short transfers and
// -EAGAIN are resubmitted; other errors fail the transfer with context. A failed write leaves the
// previous version of the entry (if any) in place, so blocks already written stay readable.
//
// Zero copy: a block whose part of the caller's buffer is page-aligned and a whole number of pages
// (every block of a HostAllocation or host-pool buffer, but perhaps not the last) is transferred
// straight from/to the caller's pages, checksummed there; other blocks (and compressed ones) go
// through one of queue_depth page-aligned bounce buffers. A read that fails may leave any bytes in
// `dst` (a corrupt block is already in place when its checksum is found wrong).
//
// Scheduling: transfers are queued by TransferPriority and served block by block in priority
// order without starving the lower ones (transfer_scheduler.h).
//
// Ownership: the caller's buffers passed to *Async must stay alive and untouched until the
// transfer's handle reports done (a zero-copy write is checksummed from the caller's pages while
// the disk reads them: a change meanwhile would be stored under a wrong checksum). Destroying the
// store cancels queued transfers (Cancelled) and waits for blocks in flight.
// Thread-safety: all public methods may be called from any thread. A read sees the last write of
// that name that completed before the read was submitted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kernels/status.h"
#include "offload/io_env.h"
#include "offload/transfer_scheduler.h"

namespace ferry {

enum class StoreBackend { kAuto, kIoUring, kThreadPool };
enum class Compression { kNever, kAlways, kAuto };  // kAuto: measured per entry (zstd_codec.h)

struct NvmeStoreOptions {
  std::string directory;         // created when missing (its parent must exist)
  size_t block_bytes = 1 << 20;  // I/O and checksum unit; a multiple of 4096, at most 64 MiB
  unsigned queue_depth = 32;     // blocks in flight, 1..1024
  size_t segment_bytes = size_t{1} << 30;  // per file; rounded up to a multiple of block_bytes
  size_t reserve_bytes = 0;                // reserved (fallocate) at Open
  StoreBackend backend = StoreBackend::kAuto;
  bool direct_io = true;  // use O_DIRECT where the filesystem accepts it
  // Cap on bounce-buffer bytes registered with io_uring (registration is locked memory).
  size_t max_registered_bytes = size_t{64} << 20;
  int io_threads = 4;  // workers of the thread-pool backend
  int compression_level = 1;
  int starvation_quota = 8;     // see PriorityQueues
  double disk_bytes_per_s = 0;  // for Compression::kAuto; 0 = measured by the store
  IoEnv* env = nullptr;         // not owned, must outlive the store; nullptr = the real OS
  std::function<void(std::string_view)> log;  // one line per event; default: stderr
};

// A transfer's completion. Copyable; all copies see the same transfer.
class TransferHandle {
 public:
  struct State;
  TransferHandle() = default;
  explicit TransferHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  bool valid() const { return state_ != nullptr; }
  bool done() const;
  // Blocks until the transfer is done; its result (the same on every call).
  Status Wait() const;

 private:
  std::shared_ptr<State> state_;
};

struct StoreStats {
  uint64_t bytes_written = 0;  // user bytes of completed write blocks
  uint64_t bytes_read = 0;     // user bytes of completed read blocks
  uint64_t disk_bytes_written = 0;
  uint64_t disk_bytes_read = 0;
  uint64_t short_resubmits = 0;
  uint64_t again_resubmits = 0;
  uint64_t compressed_blocks = 0;
  uint64_t checksum_failures = 0;
  uint64_t compression_decisions_yes = 0;
  uint64_t compression_decisions_no = 0;
  uint64_t zero_copy_blocks = 0;  // blocks moved straight from/to the caller's pages
};

struct BlockLocation {
  std::string path;
  uint64_t offset = 0;
  uint32_t stored_bytes = 0;
  bool compressed = false;
};

class NvmeStore {
 public:
  static Result<std::unique_ptr<NvmeStore>> Open(NvmeStoreOptions options);
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Stores `src` under `name` (replacing an earlier entry once the write completes).
  TransferHandle WriteAsync(std::string name, std::span<const std::byte> src,
                            TransferPriority priority,
                            Compression compression = Compression::kNever);
  // Reads the entry into `dst`. REQUIRES (else InvalidArgument): dst.size() == EntrySize(name).
  TransferHandle ReadAsync(const std::string& name, std::span<std::byte> dst,
                           TransferPriority priority);
  Status Write(std::string name, std::span<const std::byte> src,
               TransferPriority priority = TransferPriority::kSpill,
               Compression compression = Compression::kNever);
  Status Read(const std::string& name, std::span<std::byte> dst,
              TransferPriority priority = TransferPriority::kActivationNow);
  Result<size_t> EntrySize(const std::string& name) const;
  // Forgets the entry; its slots are reused once reads in flight finish.
  Status Remove(const std::string& name);

  // Opens an existing file for reading (O_DIRECT when the filesystem allows); returns its id.
  Result<int> OpenExternal(const std::string& path);
  Result<uint64_t> ExternalSize(int file) const;
  // Reads [offset, offset + dst.size()) of the file: aligned reads, sliced to the bytes asked.
  TransferHandle ReadExternalAsync(int file, uint64_t offset, std::span<std::byte> dst,
                                   TransferPriority priority);

  // "io_uring" or "threads".
  std::string_view backend_name() const;
  bool direct_io() const;
  unsigned registered_buffers() const;
  size_t block_bytes() const;
  // Host bytes of its bounce buffers (queue_depth blocks): all the host memory it maps itself.
  size_t bounce_bytes() const;
  // Of those, the pages now in RAM (HostAllocation::ResidentBytes): all of them once io_uring has
  // registered them, else those used so far.
  size_t bounce_resident_bytes() const;
  // The line logged at Open: backend, O_DIRECT, registration, and why any fallback was taken.
  const std::string& report() const;
  StoreStats stats() const;
  // Where block `block` of an entry lives (for tools and tests).
  Result<BlockLocation> LocateBlock(const std::string& name, size_t block) const;

  struct Impl;

 private:
  explicit NvmeStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
