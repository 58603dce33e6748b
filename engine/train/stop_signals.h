// StopSignals: turns SIGINT and SIGTERM into a request that a training loop polls between updates,
// without a signal handler and without global state.
//
// While a StopSignals is alive, the two signals are blocked in the creating thread (and so in every
// thread it creates afterwards) and read from a signalfd: Poll() returns the number of a signal
// that arrived (0 when none), and the loop finishes its update, saves a checkpoint and exits with
// 128 + that number (130 for SIGINT, 143 for SIGTERM) — see apps/train_command.cc. A second signal
// while the checkpoint is written is merely queued, so it cannot interrupt the save. The destructor
// drains what is queued and restores the previous signal mask.
//
// REQUIRES: created on the main thread before any other thread exists (a thread created earlier
// still has the signals unblocked, and the kernel could deliver one there with its default action).
//
// Ownership: owns the signalfd (move-only). Thread-safety: Poll from one thread at a time.
#pragma once

#include <signal.h>

#include "kernels/status.h"

namespace ferry {

class StopSignals {
 public:
  // Blocks SIGINT and SIGTERM and opens the signalfd. IOError when the kernel refuses.
  static Result<StopSignals> Install();

  StopSignals(StopSignals&& o) noexcept;
  StopSignals& operator=(StopSignals&&) = delete;
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals();

  // The first stop signal received so far (it stays reported once seen), or 0. Never blocks.
  int Poll();

 private:
  StopSignals(int fd, const sigset_t& old_mask) : fd_(fd), old_mask_(old_mask) {}
  int fd_ = -1;
  sigset_t old_mask_;
  int received_ = 0;
};

}  // namespace ferry
