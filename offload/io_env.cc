#include "offload/io_env.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace ferry {
namespace {
int NegErrno(int rc) { return rc < 0 ? -errno : rc; }
}  // namespace

int IoEnv::Open(const std::string& path, int flags, mode_t mode) {
  return NegErrno(::open(path.c_str(), flags | O_CLOEXEC, mode));
}
int IoEnv::Close(int fd) { return NegErrno(::close(fd)); }
int IoEnv::Fallocate(int fd, off_t offset, off_t len) {
  return NegErrno(::fallocate(fd, 0, offset, len));
}
int IoEnv::MakeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0 || errno == EEXIST) return 0;
  return -errno;
}
int IoEnv::Unlink(const std::string& path) { return NegErrno(::unlink(path.c_str())); }
int64_t IoEnv::FileSize(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return -errno;
  return st.st_size;
}
int IoEnv::Fdatasync(int fd) { return NegErrno(::fdatasync(fd)); }
int IoEnv::RingInit(unsigned entries, io_uring* ring, unsigned flags) {
  return io_uring_queue_init(entries, ring, flags);
}
int IoEnv::RegisterBuffers(io_uring* ring, const iovec* iovecs, unsigned count) {
  return io_uring_register_buffers(ring, iovecs, count);
}
ssize_t IoEnv::Pread(int fd, void* buf, size_t len, off_t offset) {
  const ssize_t n = ::pread(fd, buf, len, offset);
  return n < 0 ? -errno : n;
}
ssize_t IoEnv::Pwrite(int fd, const void* buf, size_t len, off_t offset) {
  const ssize_t n = ::pwrite(fd, buf, len, offset);
  return n < 0 ? -errno : n;
}

}  // namespace ferry
