// Internals of NvmeStore shared by nvme_store.cc (API, index, Open) and store_dispatcher.cc (the
// I/O loop). Not part of the public interface.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/host_memory.h"
#include "offload/io_engine.h"
#include "offload/nvme_store.h"
#include "offload/segment_allocator.h"
#include "offload/zstd_codec.h"

namespace ferry {

inline constexpr size_t kDirectAlign = 4096;
inline size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct TransferHandle::State {
  std::mutex mu;
  std::condition_variable cv;  // with mu
  bool done = false;           // guarded by mu
  Status status;               // guarded by mu
  void Finish(Status s);
};

// One block of a stored entry.
struct StoredBlock {
  Slot slot;
  uint32_t stored_len = 0;  // bytes of payload (compressed or raw) at the slot's start
  uint32_t crc = 0;         // CRC-32C of the payload
  bool compressed = false;
};

// An immutable (once committed) version of an entry. Frees its slots when the last holder (the
// index, or a read in flight) lets go.
struct EntryVersion {
  size_t size = 0;
  std::vector<StoredBlock> blocks;
  SegmentAllocator* allocator = nullptr;
  ~EntryVersion();
};

struct ExternalFile {
  std::string path;
  int fd = -1;
  uint64_t size = 0;
};

// Dispatcher-owned after it is queued (the submitting thread only creates it).
struct Transfer {
  enum class Kind { kWrite, kRead, kReadExternal };
  Kind kind = Kind::kRead;
  TransferPriority priority = TransferPriority::kSpill;
  std::string name;  // entry name or external path, for errors
  std::span<const std::byte> src;
  std::span<std::byte> dst;
  std::shared_ptr<EntryVersion> version;  // written (kWrite) or read (kRead)
  Compression compression = Compression::kNever;
  bool compress = false;  // decided at block 0
  // kReadExternal: the aligned file range [aligned_begin, aligned_end) covers the request.
  int fd = -1;
  uint64_t file_size = 0;
  uint64_t offset = 0;
  uint64_t aligned_begin = 0;
  uint64_t aligned_end = 0;
  size_t num_blocks = 0;
  size_t next_block = 0;
  size_t inflight = 0;
  Status status;
  std::shared_ptr<TransferHandle::State> handle;
};

// One in-flight slot (with its bounce buffer) and the block using it.
struct InflightBlock {
  std::shared_ptr<Transfer> transfer;
  size_t block = 0;
  IoRequest request;  // the current attempt
  // The bounce buffer, or (zero_copy) the caller's own pages for this block.
  std::byte* buf = nullptr;
  bool zero_copy = false;
  uint64_t file_offset = 0;  // of the block's first byte
  uint32_t io_len = 0;       // bytes the block's I/O covers (aligned)
  uint32_t needed = 0;  // bytes that must be transferred (io_len, less at end of an external file)
  uint32_t done = 0;    // bytes known transferred from the start
  int retries = 0;
};

struct NvmeStore::Impl {
  NvmeStoreOptions options;
  IoEnv default_env;
  IoEnv* env = nullptr;
  bool direct = false;
  std::string report;
  std::unique_ptr<SegmentAllocator> allocator;
  HostAllocation bounce;  // queue_depth buffers of block_bytes
  std::unique_ptr<IoEngine> engine;

  mutable std::mutex mu;
  std::map<std::string, std::shared_ptr<EntryVersion>> index;  // guarded by mu
  std::vector<ExternalFile> externals;                         // guarded by mu
  PriorityQueues<std::shared_ptr<Transfer>> queues;            // guarded by mu
  bool stop = false;                                           // guarded by mu

  // Dispatcher thread only.
  std::vector<InflightBlock> inflight;
  std::vector<unsigned> free_buffers;
  unsigned inflight_count = 0;  // requests with the engine
  // Work done after the ring has been refilled, so the disk is busy meanwhile: checksums of write
  // blocks just submitted (buffer indexes), and blocks whose I/O completed but whose finishing
  // (read verification, copy out) is pending. A pending block still counts in its transfer's
  // `inflight`; it keeps its buffer (kept_buffer) only when its data lies in that bounce buffer.
  struct CompletedBlock {
    InflightBlock block;
    int kept_buffer = -1;
  };
  std::vector<unsigned> crc_pending;
  std::vector<CompletedBlock> completed;
  ZstdCodec codec;
  size_t auto_bytes_left = 0;  // kAuto: bytes until the codec is measured again
  bool auto_decision = false;
  std::chrono::steady_clock::time_point busy_since;
  double busy_seconds = 0;

  std::atomic<uint64_t> bytes_written{0}, bytes_read{0}, disk_written{0}, disk_read{0},
      short_resubmits{0}, again_resubmits{0}, compressed_blocks{0}, checksum_failures{0},
      decisions_yes{0}, decisions_no{0}, zero_copy_blocks{0};

  std::thread dispatcher;

  explicit Impl(NvmeStoreOptions o);
  ~Impl();
  // Queues the transfer (or finishes it at once when it has no blocks); returns its handle.
  TransferHandle Submit(std::shared_ptr<Transfer> t);
  void Enqueue(std::shared_ptr<Transfer> t);
  void Log(std::string_view line) const;
  // store_dispatcher.cc
  void Run();
  void Start(const std::shared_ptr<Transfer>& t, size_t block, unsigned buffer);
  void OnCompletion(const IoCompletion& c);
  // Checksums the write blocks just submitted and finishes the completed blocks; whether that
  // freed bounce buffers (so more blocks can be dispatched before waiting).
  bool AfterSubmit();
  Status FinishBlock(InflightBlock& b);
  // Ends block b of its transfer (status `error` when not ok); finalizes the transfer when it
  // was the last block.
  void EndBlock(InflightBlock& b, Status error);
  void Finalize(const std::shared_ptr<Transfer>& t);
  double DiskRate() const;
};

}  // namespace ferry
