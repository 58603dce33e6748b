// Test helpers for holding a device stream: a one-shot Signal a test thread waits for with a
// deadline, and a Gate, a stream task (Device::LaunchHostFunc) that signals it was reached and
// blocks until the test opens it. Every wait is bounded, so a failing test fails instead of
// hanging. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "kernels/status.h"

namespace ferry::testing {

class Signal {
 public:
  void Set() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      set_ = true;
    }
    cv_.notify_all();
  }
  // True when set by `deadline`.
  bool WaitUntil(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;  // guarded by mu_
};

struct Gate {
  Signal reached, opened;
  // The stream task: Cancelled when the test never opens the gate (within two minutes).
  Status Pass() {
    reached.Set();
    return opened.WaitUntil(std::chrono::steady_clock::now() + std::chrono::minutes(2))
               ? Status::Ok()
               : Status::Cancelled("the test never opened the gate");
  }
  void Open() { opened.Set(); }
};

}  // namespace ferry::testing
