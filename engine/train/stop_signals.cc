#include "engine/train/stop_signals.h"

#include <pthread.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>

namespace ferry {
namespace {

sigset_t StopSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

Result<StopSignals> StopSignals::Install() {
  const sigset_t set = StopSet();
  sigset_t old;
  if (const int err = pthread_sigmask(SIG_BLOCK, &set, &old); err != 0) {
    return Status::FromErrno(err, "block SIGINT/SIGTERM");
  }
  const int fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return Status::FromErrno(err, "signalfd");
  }
  return StopSignals(fd, old);
}

StopSignals::StopSignals(StopSignals&& o) noexcept
    : fd_(o.fd_), old_mask_(o.old_mask_), received_(o.received_) {
  o.fd_ = -1;
}

StopSignals::~StopSignals() {
  if (fd_ < 0) return;
  Poll();  // drain what is queued, so restoring the mask delivers nothing
  signalfd_siginfo info;
  while (::read(fd_, &info, sizeof(info)) == ssize_t(sizeof(info))) {
  }
  ::close(fd_);
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

int StopSignals::Poll() {
  signalfd_siginfo info;
  while (received_ == 0) {
    const ssize_t r = ::read(fd_, &info, sizeof(info));
    if (r == ssize_t(sizeof(info))) {
      received_ = int(info.ssi_signo);
    } else if (!(r < 0 && errno == EINTR)) {
      break;  // EAGAIN: nothing pending
    }
  }
  return received_;
}

}  // namespace ferry
