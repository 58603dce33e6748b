#include "offload/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace ferry {
namespace {

Status WriteAllAndSync(int fd, std::span<const std::byte> data, const std::string& path) {
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
  if (::fsync(fd) != 0) return Status::FromErrno(errno, "fsync " + path);
  return Status::Ok();
}

}  // namespace

Status WriteFileDurably(const std::string& path, std::span<const std::byte> data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "create " + path);
  Status s = WriteAllAndSync(fd, data, path);
  if (::close(fd) != 0 && s.ok()) s = Status::FromErrno(errno, "close " + path);
  return s;
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open folder " + dir);
  Status s;
  if (::fsync(fd) != 0) s = Status::FromErrno(errno, "fsync folder " + dir);
  ::close(fd);
  return s;
}

Status WriteFileAtomically(const std::string& path, std::span<const std::byte> data) {
  const std::string tmp = path + ".tmp";
  Status s = WriteFileDurably(tmp, data);
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

Status WriteFileAtomically(const std::string& path, std::string_view text) {
  return WriteFileAtomically(path, std::as_bytes(std::span(text.data(), text.size())));
}

Status WriteTextFile(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::trunc | std::ios::binary);
  if (!out) return Status::IOError(path + ": cannot open for writing");
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.flush();
  if (!out) return Status::IOError(path + ": write failed");
  return Status::Ok();
}

Result<std::vector<std::byte>> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  std::vector<std::byte> out;
  std::byte buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "read " + path);
    }
    if (r == 0) break;
    out.insert(out.end(), buf, buf + r);
  }
  ::close(fd);
  return out;
}

}  // namespace ferry
