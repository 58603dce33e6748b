// IoEnv: the operating-system calls the NVMe store makes, behind one interface (LevelDB's Env).
//
// The store and its two I/O backends reach the OS only through an IoEnv passed in by the caller,
// so a test can substitute a faulty one: refuse io_uring, refuse buffer registration, or rewrite
// the result of any completed read or write (-EIO, -ENOSPC, a short count, -EAGAIN) in either
// backend (FilterCompletion is called by both, on every completion, before the store sees it).
//
// Every method returns 0 / a non-negative count on success and -errno on failure (the raw kernel
// convention, like io_uring's cqe->res); the store turns those into a Status once, with context.
//
// The base class is the real operating system (POSIX calls and liburing); tests derive from it
// and override what they fault.
//
// Thread-safety: methods may be called concurrently from several threads (the thread-pool
// backend's workers); overrides must be safe for that. The base class is stateless.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

struct io_uring;

namespace ferry {

enum class IoKind : uint8_t { kRead, kWrite };

// One read or write handed to a backend. `user_data` is the caller's tag, returned unchanged.
struct IoRequest {
  uint64_t user_data = 0;
  IoKind kind = IoKind::kRead;
  int fd = -1;
  std::byte* buf = nullptr;
  uint32_t len = 0;
  uint64_t offset = 0;
  int buf_index = -1;  // registered-buffer index for io_uring fixed I/O, -1 when unregistered
};

class IoEnv {
 public:
  virtual ~IoEnv() = default;

  virtual int Open(const std::string& path, int flags, mode_t mode);
  virtual int Close(int fd);
  virtual int Fallocate(int fd, off_t offset, off_t len);
  virtual int MakeDirectory(const std::string& path);  // 0 when created or already present
  virtual int Unlink(const std::string& path);
  // File size in bytes, or -errno.
  virtual int64_t FileSize(int fd);
  // fdatasync: a file's written data made durable (the versioned store's commit point).
  virtual int Fdatasync(int fd);

  // io_uring_queue_init (with IORING_SETUP_* `flags`) / io_uring_register_buffers.
  virtual int RingInit(unsigned entries, io_uring* ring, unsigned flags);
  virtual int RegisterBuffers(io_uring* ring, const iovec* iovecs, unsigned count);

  // Blocking pread/pwrite used by the thread-pool backend (one call, no retry loop: short counts
  // are reported as they are).
  virtual ssize_t Pread(int fd, void* buf, size_t len, off_t offset);
  virtual ssize_t Pwrite(int fd, const void* buf, size_t len, off_t offset);

  // Called by both backends with each completion's raw result; returns the result the store
  // sees. The default passes it through; fault-injecting envs rewrite it.
  virtual int FilterCompletion(const IoRequest& request, int res) { return res; }
};

}  // namespace ferry
