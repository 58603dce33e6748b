// VirtualClock: an opt-in, deterministic clock for CPU devices (CpuDeviceOptions::virtual_clock),
// so a run's timing can be asserted without reading a wall clock.
//
// Under it every stream operation of a CPU device still runs for real (the data are the same), but
// it also takes a fixed virtual duration: a kernel the clock's cost function gives for its work
// (kernels/ops/kernel_work.h), a copy its bytes over the device's link rate (0 with no link model),
// a zero its bytes over the cost function's memory traffic, a host function, a wait or a record
// none. A stream's virtual time advances in its order as
//   start = max(the stream's time, the host's time when the work was enqueued,
//               for a wait: the virtual time of the record it waits for)
//   end   = start + duration
// and a timed event's record takes the stream's time (ElapsedSeconds then reports virtual
// seconds). The host's time starts at 0 and advances only when it learns that device work has
// completed: Synchronize on an event, a stream or a device moves it to the latest virtual time it
// waited for (Query does not: its answer depends on real timing). So the times depend only on what
// was enqueued, in what order, and where the host waited — never on how fast the machine is.
//
// Not modelled: host work (it takes no virtual time), two streams' copies sharing one link (each
// copy takes its bytes over the rate on its own stream), and a caller that branches on Query or on
// real time (its enqueue order, and so the times, may then vary).
//
// Now() is the caller's time: on a stream's worker while it runs a task (a host function, such as
// a trace's clock anchor), the stream's virtual time there; on any other thread the host's.
//
// Ownership: the devices borrow the clock; it must outlive them. Every device of one run uses the
// same clock (their events' times are compared). Thread-safety: all methods may be called from any
// thread.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include "kernels/ops/kernel_work.h"

namespace ferry {

class VirtualClock {
 public:
  // Seconds a kernel takes: `op` is the kernel's name (kernels/ops/backend.h; "zero" for
  // Device::Zero, whose work is its bytes). Called on the enqueueing thread.
  using KernelCost = std::function<double(std::string_view op, const KernelWork& work)>;

  explicit VirtualClock(KernelCost kernel_seconds) : kernel_seconds_(std::move(kernel_seconds)) {}
  VirtualClock(const VirtualClock&) = delete;
  VirtualClock& operator=(const VirtualClock&) = delete;

  // Virtual seconds since the clock was made, as seen by the calling thread (see above).
  double Now() const;

  // ---- for CpuDevice ---------------------------------------------------------------------
  double KernelSeconds(std::string_view op, const KernelWork& work) const {
    return kernel_seconds_(op, work);
  }
  double HostNow() const;
  // The host has seen device work complete at virtual time `t`.
  void HostReached(double t);

  // While alive, Now() on the calling thread (a stream's worker) answers `*stream_time`.
  // REQUIRES: *stream_time outlives the scope; one scope per thread at a time.
  class StreamScope {
   public:
    StreamScope(VirtualClock* clock, const double* stream_time);
    ~StreamScope();
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;

   private:
    VirtualClock* const clock_;  // null: no clock, nothing to do
  };

 private:
  const KernelCost kernel_seconds_;
  mutable std::mutex mu_;
  double host_s_ = 0;                                 // guarded by mu_
  std::map<std::thread::id, const double*> streams_;  // guarded by mu_; workers inside a task
};

}  // namespace ferry
