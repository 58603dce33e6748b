// IoEngine: the asynchronous read/write backend under the NVMe store, and its two
// implementations: io_uring (liburing, optional registered "fixed" buffers) and a thread pool of
// blocking pread/pwrite calls. Both take the same IoRequests and report the same IoCompletions,
// after passing every result through IoEnv::FilterCompletion (the fault-injection point).
//
// An engine does one attempt per request: checking results, resubmitting short transfers and
// -EAGAIN is the store's job (one place for both backends).
//
// Thread-safety: Bind, Push, Flush and Wait are called by one thread (the store's dispatcher);
// Wake may be called from any thread. The caller keeps at most depth() requests in flight and keeps
// each request's buffer alive until its completion has been returned by Wait.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/status.h"
#include "offload/io_env.h"

namespace ferry {

struct IoCompletion {
  uint64_t user_data = 0;
  int res = 0;  // bytes transferred, or -errno
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual std::string_view name() const = 0;
  virtual unsigned depth() const = 0;
  // How many of the buffers given at creation are registered: request.buf_index may be set
  // (and must then point into that buffer) only for indexes below this.
  virtual unsigned registered_buffers() const { return 0; }

  // Called once by the thread that will call Push, Flush and Wait, before any of them (the
  // io_uring engine's ring serves that thread only: IORING_SETUP_SINGLE_ISSUER).
  virtual Status Bind() { return Status::Ok(); }
  // Queues a request; it may not start before Flush. REQUIRES: fewer than depth() in flight.
  virtual void Push(const IoRequest& request) = 0;
  virtual Status Flush() = 0;
  // Blocks until at least one completion is available or Wake() has been called since the last
  // Wait returned; appends every available completion to `out` (possibly none after a Wake).
  virtual Status Wait(std::vector<IoCompletion>& out) = 0;
  virtual void Wake() = 0;
};

// An io_uring engine with `depth` request slots. Where the kernel allows (6.1 and later), the ring
// serves one thread and runs completion work only when that thread waits for completions
// (SINGLE_ISSUER, DEFER_TASKRUN: no interruptions of the dispatcher while it prepares blocks); it
// is created disabled and enabled by Bind on that thread. `buffers` are candidates for
// registration; when the kernel refuses (memory-lock limit, ENOMEM), fewer are registered (halving
// down to none) and `report` says how many and why. Fails with Unavailable when the ring cannot be
// created (kernel without io_uring, seccomp in a container, io_uring_disabled sysctl).
Result<std::unique_ptr<IoEngine>> CreateUringEngine(IoEnv& env, unsigned depth,
                                                    std::span<const iovec> buffers,
                                                    std::string* report);

// A pool of `threads` workers doing blocking pread/pwrite; depth() is `depth`.
std::unique_ptr<IoEngine> CreateThreadEngine(IoEnv& env, unsigned depth, int threads);

}  // namespace ferry
