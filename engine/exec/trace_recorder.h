// TraceRecorder: what ran during a run of the pipeline executor (`ferry train --devices N --trace
// FILE`), as spans on the lanes of the plan's predicted timeline (engine/plan/simulator.h): per
// device its compute, host->device and device->host lanes; on the host the CPU optimizer and host
// memory (the embedding, weight packing, gradient adding) lanes. Spans are named as the
// round-robin schedule names its tasks (plan::RoundRobinTaskName: "F0.1", "IB1.0", "WF1/2", "UB0",
// "E.0", "PF1", "AB0") and written by the writer of
// `ferry plan --trace` (plan::ChromeTraceJson), so a measured and a predicted run open alike in
// Perfetto, lane for lane and name for name.
//
// Times are seconds since the recorder was created, on the host's steady clock, or on the clock the
// caller gives (a CPU device's VirtualClock, kernels/cpu/virtual_clock.h, for a deterministic
// trace: every span then has virtual times and the mapping below is exact). Device spans come
// from the devices' own timed events (engine/exec/device_timeline.h: when a stream ran the work,
// not when the host enqueued it); host spans (HostSpan) from the clock of the thread doing the
// work. A device's times are mapped onto the host clock once per step, with an error of at most
// clock_error_s(device) (the mapping is never early: a mapped time is the true one plus 0 to that).
//
// Storage: the spans of every step are kept until the run ends. After the first step the recorder
// reserves room for `expected_steps` steps of as many spans, so later steps append without
// reallocating.
//
// Thread-safety: Add, HostSpan and OptimizerSpan may be called from any thread (the optimizer's
// pool); BeginStep and the readers from the thread that drives the executor.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/plan/planner.h"
#include "engine/plan/simulator.h"

namespace ferry::exec {

struct TraceSpan {
  std::string name;  // the plan's task name; short (kept in the string's own buffer)
  plan::TaskKind kind = plan::TaskKind::kOther;
  plan::LaneId lane;  // per-device lanes: lane.gpu is the executor's device index
  int64_t step = -1;  // 0-based, counted by BeginStep
  int stage = -1;     // the stage's index in the step (forward stages, tail, backward), or -1
  int micro_batch = -1;
  double bytes = 0;  // a copy's bytes, or 0
  double start_s = 0, end_s = 0;
};

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // Seconds on some clock, callable from any thread (see Now).
  using ClockFn = std::function<double()>;

  // `plan`: the plan the executor runs (its devices, and which stage updates each layer).
  // `clock`: the host clock spans are timed on (e.g. [&c] { return c.Now(); } for a VirtualClock
  // shared with the devices); empty: the steady clock.
  TraceRecorder(const plan::Plan& plan, int64_t expected_steps, ClockFn clock = {});
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  int devices() const { return devices_; }
  // The recorder's clock now, as the calling thread sees it: seconds since the recorder was made
  // (steady clock), or the given clock's reading.
  double Now() const;

  // A new step begins (the executor calls it at the start of each Step): spans added from now on
  // belong to it.
  void BeginStep();
  // The step in progress (-1 before the first).
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

  void Add(TraceSpan span);
  // Device `device`'s clock mapping had an error window of `seconds` this step.
  void NoteClockError(int device, double seconds);
  // The device timelines created `events` timed events this step (the trace's own cost).
  void NoteEventsCreated(int64_t events);
  // Timed events created in steps after the first (0: the trace allocates no events per step).
  int64_t events_created_after_first_step() const;

  // The optimizer update of `layer` (BuildLayerSpecs order: embedding, blocks, head) as the plan
  // names it: "U" and the stage whose gradients it needs ("UB0", "UT"), and that stage's index.
  struct TaskLabel {
    std::string name;
    int stage = -1;
  };
  TaskLabel UpdateTask(int layer) const;

  std::vector<TraceSpan> spans() const;
  // The largest clock mapping error of the device's steps so far (0 before any).
  double clock_error_s(int device) const;
  // The spans as Chrome-trace JSON (plan::ChromeTraceJson, schedule "measured"), times shifted so
  // the first span starts at 0, each span's step in args.step.
  std::string ChromeTraceJson() const;

 private:
  const Clock::time_point origin_;
  const ClockFn clock_;  // empty: steady clock since origin_
  const int devices_;
  const int forward_stages_;
  const int tail_parts_;
  const int64_t expected_steps_;
  std::vector<int> update_stage_;  // per layer: the stage whose gradients its update needs
  std::atomic<int64_t> step_{-1};
  mutable std::mutex mu_;
  std::vector<TraceSpan> spans_;     // guarded by mu_
  std::vector<double> clock_error_;  // guarded by mu_; per device
  int64_t late_events_ = 0;          // guarded by mu_; created in steps after the first
};

// A span of host work, timed from construction to destruction on the calling thread's clock and
// added to the recorder then. Without a recorder it does nothing (reads no clock, builds no name).
// Move-only.
class HostSpan {
 public:
  HostSpan() = default;
  // Named `name` (and ".<micro_batch>" when micro_batch >= 0).
  HostSpan(TraceRecorder* recorder, plan::LaneKind lane, plan::TaskKind kind, std::string_view name,
           int micro_batch = -1, int stage = -1, double bytes = 0);
  ~HostSpan();
  HostSpan(HostSpan&& o) noexcept;
  HostSpan& operator=(HostSpan&& o) noexcept;
  HostSpan(const HostSpan&) = delete;
  HostSpan& operator=(const HostSpan&) = delete;

  // Ends the span now (the destructor then does nothing).
  void End();

 private:
  TraceRecorder* recorder_ = nullptr;
  TraceSpan span_;
  double start_s_ = 0;  // on the recorder's clock
};

// The CPU optimizer's update of `layer` (BuildLayerSpecs order), on the CPU optimizer lane, named
// as the plan names the update (TraceRecorder::UpdateTask). Inert with a null recorder.
HostSpan OptimizerSpan(TraceRecorder* recorder, int layer);

}  // namespace ferry::exec
