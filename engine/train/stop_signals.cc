#include "engine/train/stop_signals.h"

#include <atomic>
#include <cerrno>

namespace ferry {
namespace {

// The documented exception (stop_signals.h): what the handler can reach. 0: none received yet.
std::atomic<int> g_received{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free atomic");

void RecordSignal(int signo) {
  int none = 0;
  g_received.compare_exchange_strong(none, signo);
}

}  // namespace

Result<StopSignals> StopSignals::Install() {
  if (g_installed.exchange(true)) {
    return Status::FailedPrecondition("SIGINT/SIGTERM handling is already installed");
  }
  g_received.store(0);
  struct sigaction sa = {};
  sa.sa_handler = RecordSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  struct sigaction old_int = {}, old_term = {};
  if (::sigaction(SIGINT, &sa, &old_int) != 0) {
    const int err = errno;
    g_installed.store(false);
    return Status::FromErrno(err, "install a SIGINT handler");
  }
  if (::sigaction(SIGTERM, &sa, &old_term) != 0) {
    const int err = errno;
    ::sigaction(SIGINT, &old_int, nullptr);
    g_installed.store(false);
    return Status::FromErrno(err, "install a SIGTERM handler");
  }
  return StopSignals(old_int, old_term);
}

StopSignals::StopSignals(StopSignals&& o) noexcept
    : owner_(o.owner_), old_int_(o.old_int_), old_term_(o.old_term_) {
  o.owner_ = false;
}

StopSignals::~StopSignals() {
  if (!owner_) return;
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  g_installed.store(false);
}

int StopSignals::Poll() const { return g_received.load(); }

}  // namespace ferry
