// StopSignals: turns SIGINT and SIGTERM into a request that a training loop polls between updates.
//
// While a StopSignals is alive, a handler for the two signals records the first one received and
// does nothing else (async-signal-safe: one lock-free atomic store); Poll() returns its number (0
// when none), and the loop finishes its update, saves a checkpoint and exits with 128 + that
// number (130 for SIGINT, 143 for SIGTERM) — see apps/train_command.cc. A second signal while the
// checkpoint is written only finds the flag already set, so it cannot interrupt the save. The
// destructor restores the previous dispositions.
//
// The one exception to "no global mutable state": a handler receives no argument, so the flag it
// sets is a process-wide std::atomic<int> in stop_signals.cc, owned by the single StopSignals alive
// (Install refuses a second). Blocking the signals and reading a signalfd would avoid it, but any
// thread a library starts before main (OpenBLAS starts its pool at load time) keeps them
// unblocked and would take the default action — killing the process mid-step.
//
// Ownership: owns the installed dispositions (move-only). Thread-safety: Poll may be called from
// any thread.
#pragma once

#include <signal.h>

#include "kernels/status.h"

namespace ferry {

class StopSignals {
 public:
  // Installs the handler for SIGINT and SIGTERM. FailedPrecondition when a StopSignals is already
  // installed; IOError when the kernel refuses.
  static Result<StopSignals> Install();

  StopSignals(StopSignals&& o) noexcept;
  StopSignals& operator=(StopSignals&&) = delete;
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals();

  // The first stop signal received while installed, or 0. Never blocks.
  int Poll() const;

 private:
  StopSignals(const struct sigaction& old_int, const struct sigaction& old_term)
      : old_int_(old_int), old_term_(old_term) {}
  bool owner_ = true;
  struct sigaction old_int_, old_term_;
};

}  // namespace ferry
