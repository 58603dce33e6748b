// The io_uring backend of IoEngine (see io_engine.h).
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "offload/io_engine.h"

namespace ferry {
namespace {

constexpr uint64_t kWakeTag = ~uint64_t{0};
// A ring for one thread (the store's dispatcher), created disabled so that the thread that
// enables it (Bind) becomes its submitter; completion work runs when it waits (as fio sets up
// its rings).
constexpr unsigned kSingleThreadFlags = IORING_SETUP_R_DISABLED | IORING_SETUP_SINGLE_ISSUER |
                                        IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN;

std::string MemlockLimitText() {
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(rl.rlim_cur / 1024) + " KiB";
}

class UringEngine final : public IoEngine {
 public:
  UringEngine(IoEnv& env, unsigned depth) : env_(env), depth_(depth), slots_(depth) {
    free_.reserve(depth);
    for (unsigned i = depth; i > 0; --i) free_.push_back(i - 1);
  }
  ~UringEngine() override {
    if (ring_ok_) io_uring_queue_exit(&ring_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  Status Init(std::span<const iovec> buffers, std::string* report) {
    // One extra entry for the wake-up poll on the eventfd. Kernels before 6.1 refuse the
    // single-thread flags (EINVAL): then a plain ring.
    int rc = env_.RingInit(depth_ + 1, &ring_, kSingleThreadFlags);
    if (rc == -EINVAL) {
      rc = env_.RingInit(depth_ + 1, &ring_, 0);
    } else if (rc >= 0) {
      disabled_ = true;
    }
    if (rc < 0) {
      return Status::Unavailable(std::string("io_uring_queue_init refused: ") + std::strerror(-rc) +
                                 " (kernel without io_uring, a container seccomp profile, or "
                                 "/proc/sys/kernel/io_uring_disabled)");
    }
    ring_ok_ = true;
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Status::FromErrno(errno, "eventfd for the io_uring engine");
    ArmWake();

    unsigned n = unsigned(buffers.size());
    int first_error = 0;
    while (n > 0) {
      const int r = env_.RegisterBuffers(&ring_, buffers.data(), n);
      if (r == 0) break;
      if (first_error == 0) first_error = -r;
      n /= 2;
    }
    registered_ = n;
    if (report != nullptr) {
      size_t each = buffers.empty() ? 0 : buffers[0].iov_len;
      *report = "registered " + std::to_string(n) + " of " + std::to_string(buffers.size()) +
                " bounce buffers of " + std::to_string(each >> 10) + " KiB";
      if (first_error != 0) {
        *report += "; io_uring_register_buffers refused " + std::to_string(buffers.size()) + " (" +
                   std::strerror(first_error) + "; RLIMIT_MEMLOCK is " + MemlockLimitText() +
                   ": raise it with `ulimit -l unlimited` or a memlock line in "
                   "/etc/security/limits.conf), the others use unregistered I/O";
      }
    }
    return Status::Ok();
  }

  std::string_view name() const override { return "io_uring"; }
  unsigned depth() const override { return depth_; }
  unsigned registered_buffers() const override { return registered_; }

  Status Bind() override {
    if (!disabled_) return Status::Ok();
    // The raw call: liburing 2.3 declares io_uring_enable_rings but does not export it.
    if (syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0) <
        0) {
      return Status::FromErrno(errno, "enabling the io_uring ring (IORING_REGISTER_ENABLE_RINGS)");
    }
    disabled_ = false;
    return Status::Ok();
  }

  void Push(const IoRequest& r) override {
    assert(!free_.empty() && "more requests in flight than depth()");
    const unsigned slot = free_.back();
    free_.pop_back();
    slots_[slot] = r;
    io_uring_sqe* sqe = GetSqe();
    const bool fixed = r.buf_index >= 0 && unsigned(r.buf_index) < registered_;
    if (r.kind == IoKind::kRead) {
      if (fixed) {
        io_uring_prep_read_fixed(sqe, r.fd, r.buf, r.len, r.offset, r.buf_index);
      } else {
        io_uring_prep_read(sqe, r.fd, r.buf, r.len, r.offset);
      }
    } else {
      if (fixed) {
        io_uring_prep_write_fixed(sqe, r.fd, r.buf, r.len, r.offset, r.buf_index);
      } else {
        io_uring_prep_write(sqe, r.fd, r.buf, r.len, r.offset);
      }
    }
    io_uring_sqe_set_data64(sqe, slot);
  }

  Status Flush() override {
    for (;;) {
      const int rc = io_uring_submit(&ring_);
      if (rc >= 0) return Status::Ok();
      if (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        return Status::FromErrno(-rc, "io_uring_submit");
      }
      // EAGAIN/EBUSY: the kernel is short of resources or the CQ is full; completions will be
      // reaped by the next Wait, which submits again (io_uring_submit_and_wait).
      if (rc != -EINTR) return Status::Ok();
    }
  }

  Status Wait(std::vector<IoCompletion>& out) override {
    const size_t before = out.size();
    bool woken = false;
    while (out.size() == before && !woken) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        return Status::FromErrno(-rc, "io_uring_submit_and_wait");
      }
      unsigned head;
      unsigned seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        const uint64_t tag = io_uring_cqe_get_data64(cqe);
        if (tag == kWakeTag) {
          woken = true;
          continue;
        }
        const IoRequest& r = slots_[tag];
        out.push_back({r.user_data, env_.FilterCompletion(r, cqe->res)});
        free_.push_back(unsigned(tag));
      }
      io_uring_cq_advance(&ring_, seen);
      if (woken) {
        uint64_t v;
        while (read(wake_fd_, &v, sizeof v) > 0) {
        }
        ArmWake();
      }
    }
    return Status::Ok();
  }

  void Wake() override {
    const uint64_t one = 1;
    // A full counter (impossible in practice) still leaves the poll readable: ignore the result.
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  }

 private:
  io_uring_sqe* GetSqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {  // the SQ is full of unsubmitted entries: hand them to the kernel
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }
  void ArmWake() {
    io_uring_sqe* sqe = GetSqe();
    io_uring_prep_poll_add(sqe, wake_fd_, POLLIN);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  IoEnv& env_;
  const unsigned depth_;
  io_uring ring_{};
  bool ring_ok_ = false;
  bool disabled_ = false;  // created with IORING_SETUP_R_DISABLED and not yet enabled by Bind
  int wake_fd_ = -1;
  unsigned registered_ = 0;
  std::vector<IoRequest> slots_;  // in-flight requests by slot (dispatcher thread only)
  std::vector<unsigned> free_;    // free slots (dispatcher thread only)
};

}  // namespace

Result<std::unique_ptr<IoEngine>> CreateUringEngine(IoEnv& env, unsigned depth,
                                                    std::span<const iovec> buffers,
                                                    std::string* report) {
  auto engine = std::make_unique<UringEngine>(env, depth);
  FERRY_RETURN_IF_ERROR(engine->Init(buffers, report));
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace ferry
