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
#include <vector>

#include "kernels/status.h"

namespace ferry {

[[nodiscard]] Status WriteFileDurably(const std::string& path, std::span<const std::byte> data);
[[nodiscard]] Status WriteFileAtomically(const std::string& path, std::span<const std::byte> data);
[[nodiscard]] Status WriteFileAtomically(const std::string& path, std::string_view text);
[[nodiscard]] Status SyncDirectory(const std::string& dir);
// Writes `text` to `path` (truncating), without fsync; IOError naming the path on failure.
[[nodiscard]] Status WriteTextFile(const std::string& path, std::string_view text);
// The whole file; NotFound or IOError naming it.
Result<std::vector<std::byte>> ReadWholeFile(const std::string& path);

}  // namespace ferry
