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
#include <span>
#include <string>
#include <string_view>

#include "kernels/status.h"

namespace ferry {

// The whole file, its bytes as they are (text or binary). Errors name the call, the path and the
// operating system's reason ("open <path>: No such file or directory"): NotFound when the file
// does not exist, IOError (or NoSpace) otherwise. Callers add what the file was for with
// WithContext.
Result<std::string> ReadWholeFile(const std::string& path);

// Writes `text` to `path` (created or truncated), without fsync: for files a crash may lose (a
// plan's timeline, a model folder being written). IOError naming the path when the file cannot
// be created (a missing folder included) or written.
[[nodiscard]] Status WriteTextFile(const std::string& path, std::string_view text);

// The durable writes (see above); errors as WriteTextFile's.
[[nodiscard]] Status WriteFileDurably(const std::string& path, std::span<const std::byte> data);
[[nodiscard]] Status WriteFileAtomically(const std::string& path, std::span<const std::byte> data);
[[nodiscard]] Status WriteFileAtomically(const std::string& path, std::string_view text);
// WriteFileAtomically of the pieces' concatenation, written one after another (a header and the
// data behind it need not be copied together first).
[[nodiscard]] Status WritePiecesAtomically(const std::string& path,
                                           std::span<const std::span<const std::byte>> pieces);
[[nodiscard]] Status SyncDirectory(const std::string& dir);

// The bytes of `s` (a file read whole, for a checksum or a codec).
inline std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

}  // namespace ferry
