// DeviceTimeline: times the tasks an executor enqueues on one device's streams, with the device's
// own timed events (Device::CreateTimedEvent), for a TraceRecorder (engine/exec/trace_recorder.h).
//
// Per step:
//  - BeginStep enqueues an anchor on the compute stream: a timed event, a host function that reads
//    the recorder's clock, and a second timed event. The host function ran between the two
//    records, so a device time t maps onto the host clock as host_time + ElapsedSeconds(first, t),
//    early by nothing and late by at most ElapsedSeconds(first, second) (the recorder's clock
//    error; 0 under a CPU device's virtual clock, whose host functions read the stream's time).
//  - Begin(stream) and End(stream, ...) bracket each task: Begin is enqueued after the waits that
//    order the task, so its record completes when the stream gets to the task, and End's when the
//    task is done. Tasks on one stream are bracketed one at a time.
//  - Collect, once the step's work is enqueued, waits for each end record (only the traced work,
//    so an optimizer or a next step overlapping it is not held up) and adds the spans.
// Events are created the first time a step needs them and reused by later steps; with Reserve
// (below) nothing is created after the first step.
//
// Ownership: borrows the device (it must outlive the timeline). Thread-safety: one host thread.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/exec/trace_recorder.h"
#include "engine/plan/simulator.h"
#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry::exec {

class DeviceTimeline {
 public:
  // `gpu`: the device's index in the trace; `forward_stages` and `tail_parts`: the plan's, for
  // task names.
  static Result<std::unique_ptr<DeviceTimeline>> Create(Device& device, int gpu, int forward_stages,
                                                        int tail_parts = 1);
  // The tail's parts in the step being enqueued (an evaluation of fewer micro-batches than the
  // plan's parts runs fewer).
  void set_tail_parts(int parts) { tail_parts_ = parts; }

  // Starts a step: forgets the last step's marks and enqueues the clock anchor, which reads
  // `recorder`'s clock (the recorder must outlive the step's Collect).
  Status BeginStep(const TraceRecorder& recorder);
  // Marks the start of a task on `stream`.
  Status Begin(StreamId stream);
  // Marks the end of the task begun on `stream` and labels it as the round-robin schedule does
  // (plan::RoundRobinTaskName(what, stage, forward_stages, micro_batch, tail_parts), then
  // "/<chunk>" when chunk >= 0, then `suffix`). what == 0: the stage's own compute (F, T or B,
  // and its task kind).
  // REQUIRES: Begin(stream) since the last End(stream).
  Status End(StreamId stream, char what, plan::TaskKind kind, int stage, int micro_batch,
             double bytes = 0, int chunk = -1, std::string_view suffix = {});
  // Waits for the step's marks and adds the spans to `recorder` (step: recorder.step()), with
  // the number of events created since the last Collect.
  Status Collect(TraceRecorder& recorder);

  // Events this step has used so far.
  size_t events_used() const { return used_; }
  // Creates events until the pool holds `events`. The round robin's counter runs on across steps,
  // so a device runs other stages in the next step (another device's load of this step): the
  // executor reserves the largest device's count on every device after the first step.
  Status Reserve(size_t events);

 private:
  DeviceTimeline(Device& device, int gpu, int forward_stages, int tail_parts, Event before,
                 Event after)
      : device_(device),
        gpu_(gpu),
        forward_stages_(forward_stages),
        tail_parts_(tail_parts),
        anchor_before_(std::move(before)),
        anchor_after_(std::move(after)) {}
  // The next unused event of the pool, created when the pool runs out (the first step only).
  Result<size_t> NextEvent();

  struct Task {
    size_t begin = 0, end = 0;  // indices into events_
    StreamId stream = StreamId::kCompute;
    std::string name;
    plan::TaskKind kind = plan::TaskKind::kOther;
    int stage = -1, micro_batch = -1;
    double bytes = 0;
  };

  Device& device_;
  const int gpu_;
  const int forward_stages_;
  int tail_parts_;
  Event anchor_before_, anchor_after_;
  // Written by the anchor's host function on the stream; read once anchor_after_ has completed.
  double anchor_host_s_ = 0;
  std::vector<Event> events_;                            // the pool
  size_t used_ = 0;                                      // events of the pool used this step
  size_t created_ = 0;                                   // events created since the last Collect
  std::array<std::optional<size_t>, kNumStreams> open_;  // per stream: the begin of its open task
  std::vector<Task> tasks_;                              // this step's, in enqueue order
};

}  // namespace ferry::exec
