// Whole-file reads and writes, with errno turned into a Status once, here, naming the file.
//
// Durable writes for run folders use the write-fsync-rename-fsync protocol that leaves either the
// old file or the complete new one after a crash or a kill -9, never a torn mix:
//
//   WriteFileDurably(path, data)    writes `path` in place and fsyncs it (for files inside a folder
//                                   that is itself published atomically, e.g. a checkpoint's
//                                   temporary folder);
//   WriteFileAtomically(path, data) writes "<path>.tmp", fsyncs it, renames it over `path` and
//                                   fsyncs the parent folder;
//   SyncDirectory(dir)              fsyncs a folder so renames and creations in it are durable.
//
// Stateless; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "kernels/status.h"

struct stat;  // <sys/stat.h>

namespace ferry {

// The whole file, its bytes as they are (text or binary). Errors name the call, the path and the
// operating system's reason ("open <path>: No such file or directory"): NotFound when the file
// does not exist, IOError (or NoSpace) otherwise. Callers add what the file was for with
// WithContext.
Result<std::string> ReadWholeFile(const std::string& path);

// Writes `text` to `path`, without fsync: for files a crash may lose (a plan's timeline, a
// hardware profile, a model folder being written). A regular file (or a new one) is written as
// "<path>.tmp" and renamed over `path`, so a failed write leaves `path` as it was and no partial
// file; anything else that exists (/dev/stdout, /dev/full, a FIFO) is written in place. IOError
// (NoSpace for a full disk) naming the path when the file cannot be created (a missing folder
// included) or written.
[[nodiscard]] Status WriteTextFile(const std::string& path, std::string_view text);

// A file of records appended one at a time (metrics.jsonl): each Append lands whole or not at all
// (a failed or short write is cut back off, so the file never ends in a partial record). Owns its
// descriptor; move-only; thread-compatible.
class AppendFile {
 public:
  // Opens `path` for appending, created when absent and emptied first when `truncate`.
  static Result<AppendFile> Open(const std::string& path, bool truncate);
  AppendFile(AppendFile&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }
  AppendFile& operator=(AppendFile&& o) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();

  // Errors name the path and the reason; the file keeps its previous records.
  [[nodiscard]] Status Append(std::string_view text);
  [[nodiscard]] Status Append(std::span<const std::byte> data) {
    return Append(std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
  }
  // fsyncs what was appended (a file inside a folder that is published atomically).
  [[nodiscard]] Status Sync();

 private:
  AppendFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

// The durable writes (see above); errors as WriteTextFile's.
[[nodiscard]] Status WriteFileDurably(const std::string& path, std::span<const std::byte> data);
[[nodiscard]] Status WriteFileAtomically(const std::string& path, std::span<const std::byte> data);
[[nodiscard]] Status WriteFileAtomically(const std::string& path, std::string_view text);
// WriteFileAtomically of the pieces' concatenation, written one after another (a header and the
// data behind it need not be copied together first).
[[nodiscard]] Status WritePiecesAtomically(const std::string& path,
                                           std::span<const std::span<const std::byte>> pieces);
// The bytes of piece i of a file written as it is produced, valid until the next call.
using PieceSource = std::function<Result<std::span<const std::byte>>(size_t)>;
// WritePiecesAtomically of `count` pieces made one at a time by `piece(0)`, `piece(1)`, ... in
// order, so a file larger than the free RAM (a model's weights, converted as they are written)
// never has its whole image in memory. An error from `piece` removes the temporary file and is
// returned as it is.
[[nodiscard]] Status WriteProducedAtomically(const std::string& path, size_t count,
                                             const PieceSource& piece);
[[nodiscard]] Status SyncDirectory(const std::string& dir);

// A read-only mapping of a file with no name, for scratch a run reads back many times (a LoRA
// base converted once and streamed from NVMe each step). Copies share the mapping; the last one
// unmaps it, and the file's blocks are freed then.
struct UnnamedMapping {
  std::shared_ptr<const void> owner;  // keeps the mapping alive; null when empty
  std::span<const std::byte> bytes;
  // The file's descriptor, open as long as `owner` lives, to read it again other than through the
  // mapping (open("/proc/self/fd/<fd>") with O_DIRECT, say); -1 when empty.
  int fd = -1;
};
// Writes the `count` pieces `piece` makes one at a time into a file in `dir` that has no name
// (O_TMPFILE; where the filesystem lacks it, a file created and unlinked at once, so only a kill
// in the instant between leaves a ".ferry-scratch-*" there), so nothing is left behind however the
// process ends, a kill -9 included; fsyncs it, then maps it read-only. Errors name
// `dir` and the reason: IOError for a missing or unwritable folder, NoSpace when it fills up; an
// error from `piece` is returned as it is. Nothing is left in `dir` after an error either. The
// written pages are dropped from the page cache once on disk (a copy larger than RAM pushes out
// nothing the host holds); reads fetch them again.
Result<UnnamedMapping> WriteUnnamedAndMap(const std::string& dir, size_t count,
                                          const PieceSource& piece);

// Which file an open descriptor is (fstat: its device and inode) and its size then: a file read
// again by name later (a model's weights, streamed) can be told from another that took its name.
struct FileIdentity {
  uint64_t device = 0, inode = 0;  // 0, 0: unknown
  int64_t size = -1;
  bool known() const { return device != 0 || inode != 0; }
  bool operator==(const FileIdentity&) const = default;
};
// Errors: fstat's, naming `what`.
Result<FileIdentity> IdentityOf(int fd, std::string_view what);
// Of a file already stat'ed.
FileIdentity IdentityOf(const struct ::stat& st);

// The bytes an unprivileged user may still write in the filesystem that holds `dir` (statvfs:
// f_bavail x f_frsize). Errors name the folder and the reason.
Result<uint64_t> FreeSpace(const std::string& dir);

// The bytes of `s` (a file read whole, for a checksum or a codec).
inline std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

}  // namespace ferry
