#include "engine/model/base_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <utility>

#include "kernels/dtype.h"

namespace ferry {

Result<BaseFileReader> BaseFileReader::Create(size_t buffer_bytes, BaseReadMode mode) {
  if (buffer_bytes < 2 * kBaseReadBlockBytes || buffer_bytes % kBaseReadBlockBytes != 0) {
    return Status::InvalidArgument("the frozen base's read buffer (weights.base_read) of " +
                                   std::to_string(buffer_bytes) +
                                   " bytes is not two or more whole 4096-byte blocks: re-plan");
  }
  FERRY_ASSIGN_OR_RETURN(HostAllocation buffer,
                         HostAllocation::Map(buffer_bytes, "weights.base_read"));
  return BaseFileReader(std::move(buffer), mode == BaseReadMode::kDirect);
}

BaseFileReader::OpenFile::~OpenFile() {
  if (fd >= 0) ::close(fd);
}

namespace {

// What to do when a file read every step fails or changed: a model file, or the copy converted
// on NVMe (a file with no name, made again by the next run).
std::string WhatToDo(const FileTensor& t) {
  if (t.fd >= 0) {
    return "the drive holding the frozen base's copy failed (see dmesg): check it, or give "
           "--nvme-dir another, and rerun (checkpoints are kept; the copy is made again)";
  }
  return "the model folder was moved, replaced or damaged after the run loaded it, or the drive "
         "failed (see dmesg): restore the folder and rerun (checkpoints are kept)";
}

}  // namespace

Result<BaseFileReader::OpenFile*> BaseFileReader::FileOf(const FileTensor& t, bool direct) {
  // A file with no name is opened again through its descriptor.
  const std::string path = t.fd >= 0 ? "/proc/self/fd/" + std::to_string(t.fd) : t.path;
  auto it = files_.find(path);
  // Kept open: the same file (a descriptor's number may be another file's later), buffered
  // when asked or already.
  if (it != files_.end() && (!t.identity.known() || it->second.identity == t.identity) &&
      (direct || !it->second.direct)) {
    return &it->second;
  }
  int fd = direct ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
  const bool took_direct = fd >= 0;
  if (fd < 0 && (!direct || errno == EINVAL)) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::FromErrno(
        errno, "open " + t.path + " (the frozen base, streamed every step; " + WhatToDo(t) + ")");
  }
  if (!took_direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);  // no readahead
  OpenFile f(fd, took_direct);
  FERRY_ASSIGN_OR_RETURN(f.identity, IdentityOf(fd, t.path));
  if (t.identity.known() && !(f.identity == t.identity)) {
    return Status::FailedPrecondition(t.path + " is not the file the run loaded (another file " +
                                      "now has its name, or it changed size): " + WhatToDo(t));
  }
  if (it != files_.end()) files_.erase(it);
  return &files_.emplace(path, std::move(f)).first->second;
}

Status BaseFileReader::Read(const FileTensor& t, const Use& use) {
  assert(t.offset >= 0);
  if (t.bytes.empty()) return Status::Ok();  // no block holds it (BaseReadDiskBytes: 0)
  FERRY_ASSIGN_OR_RETURN(OpenFile * f, FileOf(t, direct_));
  constexpr uint64_t A = kBaseReadBlockBytes;
  const size_t element = DTypeSize(t.dtype);
  const uint64_t begin = uint64_t(t.offset), end = begin + t.bytes.size();
  const uint64_t last = (end + A - 1) / A * A;  // the end of the block holding the last byte
  std::byte* const data = buffer_.data() + A;   // reads land here; a split element's head before
  const uint64_t room = buffer_.size() - A;
  size_t carry = 0;
  int64_t first = 0;
  for (uint64_t pos = begin / A * A; pos < last;) {
    const uint64_t want = std::min(room, last - pos);
    const double started = clock_ ? clock_() : 0;
    uint64_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(f->fd, data + got, want - got, off_t(pos + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && f->direct) {  // opened with O_DIRECT, refused at the read
        FERRY_ASSIGN_OR_RETURN(f, FileOf(t, /*direct=*/false));
        got = 0;
        continue;
      }
      if (n < 0) {
        return Status::FromErrno(errno, "read " + std::to_string(want) + " bytes at offset " +
                                            std::to_string(pos) + " of " + t.path + " (" +
                                            WhatToDo(t) + ")");
      }
      got += uint64_t(n);
      // The file's end (with O_DIRECT, a read that stops inside a block is the last).
      if (n == 0 || (f->direct && uint64_t(n) % A != 0)) break;
    }
    disk_bytes_ += (got + A - 1) / A * A;
    if (clock_) read_seconds_ += clock_() - started;
    if (pos + got < std::min(end, pos + want)) {
      return Status::IOError(t.path + " ends at byte " + std::to_string(pos + got) +
                             ", inside the bytes [" + std::to_string(begin) + ", " +
                             std::to_string(end) + ") of a frozen weight: " + WhatToDo(t));
    }
    const uint64_t from = std::max(begin, pos), to = std::min(end, pos + got);
    const std::byte* src = data + (from - pos) - carry;
    const size_t avail = carry + size_t(to - from);
    const int64_t n = int64_t(avail / element);
    if (n > 0) FERRY_RETURN_IF_ERROR(use({src, size_t(n) * element}, first, n));
    first += n;
    carry = avail - size_t(n) * element;
    std::memmove(data - carry, src + size_t(n) * element, carry);
    if (!f->direct) {  // buffered: the base's pages leave the page cache again
      ::posix_fadvise(f->fd, off_t(pos), off_t(got), POSIX_FADV_DONTNEED);
    }
    pos += want;
  }
  assert(carry == 0 && first == t.numel());
  tensor_bytes_ += t.bytes.size();
  return Status::Ok();
}

}  // namespace ferry
