// BaseFileReader: the frozen base a plan streams from NVMe, read from the model's own safetensors
// files or the copy converted there (FileTensor; a file with no name through its descriptor) with
// O_DIRECT through one bounce buffer, so every byte a step reads comes from the drive, the
// process's own I/O counters (/proc/self/io: read_bytes) see it, and the page cache keeps none of
// the base (a base larger than RAM does not push out what the host holds).
//
// O_DIRECT moves whole 4096-byte blocks: a tensor's read starts at the block holding its first
// byte and ends at the block holding its last (disk_bytes() counts them), so per tensor it reads
// up to two blocks beyond the tensor's own bytes (where its neighbours lie; the plan counts them:
// BaseReadDiskBytes); the process's read_bytes counts the same on a drive formatted in 4096-byte
// blocks (tmpfs, which takes O_DIRECT since Linux 6.6, counts nothing). Where a filesystem refuses
// O_DIRECT, at the open or at a read, the same reads are buffered, with no readahead, and their
// pages dropped from the page cache after each piece (posix_fadvise RANDOM, DONTNEED).
//
// A file is opened at its first read, checked to be the one the run loaded (a model folder
// replaced in between is refused, never read at the old offsets), and kept open.
//
// Not thread-safe: one packing thread (the executor's host thread) uses it; the conversion
// callback may fan out over a pool.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>

#include "engine/model/host_tensors.h"
#include "kernels/host_memory.h"
#include "kernels/status.h"

namespace ferry {

inline constexpr size_t kBaseReadBlockBytes = 4096;  // O_DIRECT's alignment
inline constexpr size_t kBaseReadBufferMaxBytes = size_t(4) << 20;

// The reader's bounce buffer when the largest tensor it reads has `largest` bytes (0: it reads
// none, and takes none): one block that keeps the bytes of an element split between two reads,
// then room for that tensor's blocks in one read, at most 4 MiB in all (a larger tensor is read in
// pieces). The memory model counts it ("weights.base_read").
constexpr size_t BaseReadBufferBytes(uint64_t largest) {
  if (largest == 0) return 0;
  const uint64_t blocks = (largest + kBaseReadBlockBytes - 1) / kBaseReadBlockBytes + 2;
  return size_t(std::min<uint64_t>(blocks * kBaseReadBlockBytes, kBaseReadBufferMaxBytes));
}

// The blocks Read takes from the drive for a tensor of `bytes` bytes at `offset` in its file
// (disk_bytes()): from the block holding its first byte to the one holding its last.
constexpr uint64_t BaseReadDiskBytes(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return 0;
  constexpr uint64_t A = kBaseReadBlockBytes;
  return ((offset + bytes + A - 1) / A - offset / A) * A;
}
// The most they can be where the tensor's place in its file is not known: one block more than
// its bytes take when it starts on a block's last byte.
constexpr uint64_t BaseReadMostDiskBytes(uint64_t bytes) {
  return BaseReadDiskBytes(kBaseReadBlockBytes - 1, bytes);
}

// Where a tensor lies in its file: its first byte, and its bytes as stored there.
struct FileExtent {
  uint64_t offset = 0, bytes = 0;
};
// Where each tensor of a model's safetensors files lies, by the name a model's parameter has
// (FolderTensorLayout): what a plan needs to count the blocks a streamed base reads.
using TensorFileLayout = std::map<std::string, FileExtent, std::less<>>;

// How the reader reads: O_DIRECT where the filesystem takes it, or buffered (what a filesystem
// that refuses O_DIRECT gets; asked for by tests on filesystems that take it).
enum class BaseReadMode { kDirect, kBuffered };

class BaseFileReader {
 public:
  // Maps a bounce buffer of `buffer_bytes` (BaseReadBufferBytes; OutOfMemory naming it when
  // refused; InvalidArgument unless it is two or more whole blocks).
  static Result<BaseFileReader> Create(size_t buffer_bytes,
                                       BaseReadMode mode = BaseReadMode::kDirect);

  // Reads `t`'s stored bytes and hands them to `use` in order, in pieces of whole elements:
  // use(bytes, first, n) gets elements [first, first + n) as stored (t.dtype, row-major as
  // stored). `bytes` is valid during the call only. Errors name the file and the offset, and say
  // what to do (IOError; a file shorter than its header says is one; FailedPrecondition when
  // another file has taken its name); `use`'s own error stops the read and is returned.
  // REQUIRES: t.offset >= 0 (a tensor whose place in its file is known: a model file's, or the
  // converted copy's).
  using Use = std::function<Status(std::span<const std::byte> bytes, int64_t first, int64_t n)>;
  Status Read(const FileTensor& t, const Use& use);

  uint64_t disk_bytes() const { return disk_bytes_; }      // the blocks read so far
  uint64_t tensor_bytes() const { return tensor_bytes_; }  // the tensors' own bytes among them

  // Times the drive's reads on `clock` (seconds; a trace's), summed in read_seconds(): the part
  // of a packing that was reading, the rest converting. Without a clock read_seconds() stays 0.
  void set_clock(std::function<double()> clock) { clock_ = std::move(clock); }
  double read_seconds() const { return read_seconds_; }

 private:
  // An open file, closed with it (move-only).
  struct OpenFile {
    OpenFile(int fd, bool direct) : fd(fd), direct(direct) {}
    OpenFile(OpenFile&& o) noexcept
        : fd(std::exchange(o.fd, -1)), direct(o.direct), identity(o.identity) {}
    OpenFile& operator=(OpenFile&&) = delete;
    ~OpenFile();
    int fd;
    bool direct;
    FileIdentity identity;
  };
  BaseFileReader(HostAllocation buffer, bool direct)
      : buffer_(std::move(buffer)), direct_(direct) {}
  // t's file, opened at its first read (with O_DIRECT when `direct` and the filesystem takes it)
  // and checked to be the file the run loaded (FileTensor::identity); !direct: reopened without,
  // with no readahead (the reads are exactly the blocks asked for, and the pages they bring in
  // are dropped again).
  Result<OpenFile*> FileOf(const FileTensor& t, bool direct);

  HostAllocation buffer_;
  bool direct_ = true;
  std::function<double()> clock_;
  double read_seconds_ = 0;
  std::map<std::string, OpenFile> files_;
  uint64_t disk_bytes_ = 0, tensor_bytes_ = 0;
};

}  // namespace ferry
