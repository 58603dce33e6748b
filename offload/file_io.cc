#include "offload/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace ferry {
namespace {

// A file that cannot be created is an I/O error even when the reason is a missing folder (ENOENT,
// which FromErrno calls NotFound: that code is for what a read expected to exist).
Status CreateError(int err, const std::string& path) {
  if (err == ENOENT) return Status::IOError("create " + path + ": " + std::strerror(err));
  return Status::FromErrno(err, "create " + path);
}

Status WriteAll(int fd, std::span<const std::byte> data, const std::string& path) {
  const std::byte* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write " + path);
    }
    p += w;
    n -= size_t(w);
  }
  return Status::Ok();
}

// Creates (or truncates) `path`, writes the `count` pieces `piece` makes one after another,
// fsyncs it when `sync`, closes it.
Status WriteFile(const std::string& path, size_t count, const PieceSource& piece, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return CreateError(errno, path);
  Status s;
  for (size_t i = 0; i < count && s.ok(); ++i) {
    Result<std::span<const std::byte>> bytes = piece(i);
    s = bytes.ok() ? WriteAll(fd, *bytes, path) : bytes.status();
  }
  if (s.ok() && sync && ::fsync(fd) != 0) s = Status::FromErrno(errno, "fsync " + path);
  if (::close(fd) != 0 && s.ok()) s = Status::FromErrno(errno, "close " + path);
  return s;
}

Status WriteFile(const std::string& path, std::span<const std::byte> data, bool sync) {
  return WriteFile(
      path, 1, [&](size_t) -> Result<std::span<const std::byte>> { return data; }, sync);
}

}  // namespace

Status WriteFileDurably(const std::string& path, std::span<const std::byte> data) {
  return WriteFile(path, data, /*sync=*/true);
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open folder " + dir);
  Status s;
  if (::fsync(fd) != 0) s = Status::FromErrno(errno, "fsync folder " + dir);
  ::close(fd);
  return s;
}

Status WriteProducedAtomically(const std::string& path, size_t count, const PieceSource& piece) {
  const std::string tmp = path + ".tmp";
  Status s = WriteFile(tmp, count, piece, /*sync=*/true);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Status::FromErrno(errno, "rename " + tmp + " to " + path);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return SyncDirectory(parent.empty() ? "." : parent.string());
}

Status WritePiecesAtomically(const std::string& path,
                             std::span<const std::span<const std::byte>> pieces) {
  return WriteProducedAtomically(
      path, pieces.size(),
      [&](size_t i) -> Result<std::span<const std::byte>> { return pieces[i]; });
}

Status WriteFileAtomically(const std::string& path, std::span<const std::byte> data) {
  return WritePiecesAtomically(path, std::span(&data, 1));
}

Status WriteFileAtomically(const std::string& path, std::string_view text) {
  return WriteFileAtomically(path, AsBytes(text));
}

Status WriteTextFile(const std::string& path, std::string_view text) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return WriteFile(path, AsBytes(text), /*sync=*/false);  // a device or a pipe: in place
  }
  // A symbolic link stays one: its target is replaced.
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::is_symlink(path, ec)
                                           ? std::filesystem::canonical(path, ec)
                                           : std::filesystem::path(path);
  const std::string file = ec ? path : target.string();
  const std::string tmp = file + ".tmp";
  Status s = WriteFile(tmp, AsBytes(text), /*sync=*/false);
  if (s.ok() && std::rename(tmp.c_str(), file.c_str()) != 0) {
    s = Status::FromErrno(errno, "rename " + tmp + " to " + file);
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

Result<AppendFile> AppendFile::Open(const std::string& path, bool truncate) {
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
  if (fd < 0) return CreateError(errno, path);
  return AppendFile(path, fd);
}

AppendFile& AppendFile::operator=(AppendFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status AppendFile::Append(std::string_view text) {
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  if (before < 0) return Status::FromErrno(errno, "seek " + path_);
  Status s = WriteAll(fd_, AsBytes(text), path_);
  if (!s.ok() && ::ftruncate(fd_, before) != 0) {
    return s.WithContext("cut back to " + std::to_string(before) + " bytes failed too");
  }
  return s;
}

Status AppendFile::Sync() {
  if (::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync " + path_);
  return Status::Ok();
}

Result<UnnamedMapping> WriteUnnamedAndMap(const std::string& dir, size_t count,
                                          const PieceSource& piece) {
  const std::string what = dir + "/(a file with no name)";
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE here: a named file, unlinked before anything is written to it.
    std::string name = dir + "/.ferry-scratch-XXXXXX";
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0 && ::unlink(name.c_str()) != 0) {
      const Status s = Status::FromErrno(errno, "unlink " + name);
      ::close(fd);
      return s;
    }
  }
  if (fd < 0) return CreateError(errno, what);
  Status s;
  uint64_t size = 0;
  for (size_t i = 0; i < count && s.ok(); ++i) {
    Result<std::span<const std::byte>> bytes = piece(i);
    s = bytes.ok() ? WriteAll(fd, *bytes, what) : bytes.status();
    if (bytes.ok()) size += bytes->size();
  }
  // Written back before it is read: a write-back error (a full thin volume, a failing drive) is
  // reported here, not met later as a bad page of the mapping.
  if (s.ok() && ::fsync(fd) != 0) s = Status::FromErrno(errno, "fsync " + what);
  if (s.ok()) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // a hint: nothing fails
  UnnamedMapping m;
  if (s.ok() && size > 0) {
    void* p = ::mmap(nullptr, size_t(size), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      s = Status::FromErrno(errno, "mmap " + what);
    } else {
      // The mapping and the descriptor keep the file; its blocks go with the last of them.
      m.owner = std::shared_ptr<const void>(p, [size, fd](const void* q) {
        ::munmap(const_cast<void*>(q), size_t(size));
        ::close(fd);
      });
      m.bytes = {static_cast<const std::byte*>(p), size_t(size)};
      m.fd = fd;
      return m;
    }
  }
  if (::close(fd) != 0 && s.ok()) s = Status::FromErrno(errno, "close " + what);
  if (!s.ok()) return s;
  return m;
}

Result<FileIdentity> IdentityOf(int fd, std::string_view what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "stat " + std::string(what));
  return IdentityOf(st);
}

FileIdentity IdentityOf(const struct ::stat& st) {
  return {.device = uint64_t(st.st_dev), .inode = uint64_t(st.st_ino), .size = int64_t(st.st_size)};
}

Result<uint64_t> FreeSpace(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return Status::FromErrno(errno, "statvfs " + dir);
  return uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
}

Result<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  // The size is a hint only (sysfs and /proc files say 4096 or 0): read until end of file.
  struct stat st {};
  std::string out;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) out.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "read " + path);
    }
    if (r == 0) break;
    out.append(buf, size_t(r));
  }
  ::close(fd);
  return out;
}

}  // namespace ferry
