// StreamErrorBook: the host-side error state of one CudaDevice's streams, which gives host
// functions the Device interface's poisoning rules (kernels/device.h) on top of CUDA.
//
// CUDA faults are sticky in the CUDA context and need no bookkeeping; a host function's error is
// ferry's own, so it is kept here. Every host item enqueued on a stream (a LaunchHostFunc, or the
// hidden item that carries an error across a Wait) gets a sequence number in stream order; an
// error remembers the number of the item that raised it, so "does this error precede that point
// of the stream" is a comparison. A Record captures a Mark: the stream's next number, and whether
// host items before it may still fail.
//
// The whole class is plain C++ (no CUDA calls), so its rules are tested without a GPU.
//
// Thread-safety: all methods may be called concurrently (one internal mutex, `mu_`). The enqueue
// side (EnqueueHostItem, MarkRecord, Wait) must be called under the caller's per-stream enqueue
// lock, together with the CUDA call it describes, so that sequence order is stream order.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <utility>

#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry {

class StreamErrorBook {
 public:
  // A point in a stream captured by a Record: work before `seq` is covered.
  struct Mark {
    int stream = 0;
    uint64_t seq = 0;
    uint64_t last_host_item = 0;  // the last host item before the point (0: none)
  };

  // ---- enqueue side ----
  // A new host item on `stream`; returns its sequence number.
  uint64_t EnqueueHostItem(int stream);
  Mark MarkRecord(int stream);
  // `dst_stream` of `dst` waits on `mark` of `src` (the same book or another device's). When the
  // work before the mark already failed, dst is poisoned now and false is returned. Returns true
  // when host items before the mark have not run yet: the caller then enqueues a host item on
  // dst (EnqueueHostItem) that calls Propagate when it runs. False otherwise (nothing to carry).
  static bool Wait(StreamErrorBook& src, const Mark& mark, StreamErrorBook& dst, int dst_stream);

  // ---- run side (host callbacks, in stream order) ----
  // True when an error precedes item `seq` of `stream`: the item must be skipped.
  bool Poisoned(int stream, uint64_t seq) const;
  // Item `seq` has run (or was skipped); a non-ok `status` poisons the items after it.
  void Finish(int stream, uint64_t seq, const Status& status);
  // The hidden item `dst_seq` on dst runs: dst inherits the error of the work before `mark`.
  static void Propagate(const StreamErrorBook& src, const Mark& mark, StreamErrorBook& dst,
                        int dst_stream, uint64_t dst_seq);

  // ---- synchronize side ----
  // The error of work before item `seq` of `stream` (ok when none).
  Status ErrorBefore(int stream, uint64_t seq) const;
  // The next sequence number of `stream`: ErrorBefore(stream, NextSeq(stream)) covers all so far.
  uint64_t NextSeq(int stream) const;
  // The earliest error raised on any stream (ok when none), clearing every stream's error.
  Status TakeFirstError();

 private:
  struct StreamState {
    uint64_t next_seq = 1;
    uint64_t last_host_item = 0;  // last host item enqueued
    uint64_t done_seq = 0;        // last host item that ran (they run in order)
    Status error;                 // first error on this stream since the last TakeFirstError
    uint64_t error_seq = 0;       // the item that raised or inherited it
    uint64_t error_order = 0;     // device-wide order of errors, to find the first
  };
  void SetErrorLocked(int stream, const Status& status, uint64_t seq);
  // Locks the mutexes of two books (once when they are the same book).
  static std::pair<std::unique_lock<std::mutex>, std::unique_lock<std::mutex>> LockBoth(
      const StreamErrorBook& a, const StreamErrorBook& b);

  mutable std::mutex mu_;
  std::array<StreamState, kNumStreams> streams_;  // guarded by mu_
  uint64_t errors_raised_ = 0;                    // guarded by mu_
};

}  // namespace ferry
