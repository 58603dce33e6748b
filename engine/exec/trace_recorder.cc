#include "engine/exec/trace_recorder.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "engine/plan/pipeline_schedules.h"
#include "engine/plan/timeline_writers.h"

namespace ferry::exec {

TraceRecorder::TraceRecorder(const plan::Plan& plan, int64_t expected_steps, ClockFn clock)
    : origin_(Clock::now()),
      clock_(std::move(clock)),
      devices_(plan.gpus),
      forward_stages_(int(plan.stages.size())),
      tail_parts_(std::max(plan.tail_parts, 1)),
      expected_steps_(std::max<int64_t>(expected_steps, 1)),
      clock_error_(size_t(std::max(plan.gpus, 0)), 0.0) {
  // A layer updates after the last stage over its range (plan::LastStageOver): the embedding's
  // gradient lands with the backward stage over the first blocks, the head's with the tail's
  // last part.
  const int S = forward_stages_, P = tail_parts_;
  const int layers = int(plan.recompute.size());
  update_stage_.assign(size_t(std::max(layers, 0)), plan::LastStageOver(0, S, P));
  for (int f = 0; f < S; ++f) {
    for (int l = plan.stages[size_t(f)].first; l < plan.stages[size_t(f)].last && l < layers; ++l) {
      update_stage_[size_t(l)] = plan::LastStageOver(f, S, P);
    }
  }
  if (layers > 0) update_stage_.back() = plan::LastStageOver(S, S, P);
}

double TraceRecorder::Now() const {
  if (clock_) return clock_();
  return std::chrono::duration<double>(Clock::now() - origin_).count();
}

void TraceRecorder::BeginStep() {
  const int64_t step = step_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (step != 1) return;
  // Every step runs the same tasks: room for all of them at once, so later steps do not grow it.
  std::lock_guard<std::mutex> lock(mu_);
  spans_.reserve(spans_.size() * size_t(expected_steps_ + 1));
}

void TraceRecorder::Add(TraceSpan span) {
  if (span.step < 0) span.step = step();
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(std::move(span));
}

void TraceRecorder::NoteClockError(int device, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (device >= 0 && size_t(device) < clock_error_.size()) {
    clock_error_[size_t(device)] = std::max(clock_error_[size_t(device)], seconds);
  }
}

void TraceRecorder::NoteEventsCreated(int64_t events) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step() > 0) late_events_ += events;
}

int64_t TraceRecorder::events_created_after_first_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return late_events_;
}

TraceRecorder::TaskLabel TraceRecorder::UpdateTask(int layer) const {
  const int stage = layer >= 0 && size_t(layer) < update_stage_.size()
                        ? update_stage_[size_t(layer)]
                        : plan::LastStageOver(0, forward_stages_, tail_parts_);
  return {plan::RoundRobinTaskName('U', stage, forward_stages_, -1, tail_parts_), stage};
}

std::vector<TraceSpan> TraceRecorder::spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

double TraceRecorder::clock_error_s(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  return device >= 0 && size_t(device) < clock_error_.size() ? clock_error_[size_t(device)] : 0;
}

std::string TraceRecorder::ChromeTraceJson() const {
  const std::vector<TraceSpan> spans = this->spans();
  // The measured run as a schedule the simulator could have produced: the same writer then draws
  // it with the plan's lanes and names.
  plan::Schedule schedule;
  schedule.name = "measured";
  schedule.gpus = devices_;
  plan::SimResult result;
  std::vector<int64_t> steps;
  double t0 = std::numeric_limits<double>::infinity();
  for (const TraceSpan& s : spans) t0 = std::min(t0, s.start_s);
  for (const TraceSpan& s : spans) {
    plan::SimTask t;
    t.name = s.name;
    t.kind = s.kind;
    t.lane = s.lane;
    t.bytes = s.bytes;
    t.stage = s.stage;
    t.micro_batch = s.micro_batch;
    schedule.tasks.push_back(std::move(t));
    result.timing.push_back({s.start_s - t0, s.end_s - t0});
    result.makespan_s = std::max(result.makespan_s, s.end_s - t0);
    steps.push_back(s.step);
  }
  return plan::ChromeTraceJson(schedule, result, steps);
}

HostSpan::HostSpan(TraceRecorder* recorder, plan::LaneKind lane, plan::TaskKind kind,
                   std::string_view name, int micro_batch, int stage, double bytes)
    : recorder_(recorder) {
  if (recorder_ == nullptr) return;
  span_.name = name;
  if (micro_batch >= 0) span_.name += "." + std::to_string(micro_batch);
  span_.kind = kind;
  span_.lane = {lane, 0};
  span_.step = recorder_->step();
  span_.stage = stage;
  span_.micro_batch = micro_batch;
  span_.bytes = bytes;
  start_s_ = recorder_->Now();
}

HostSpan::~HostSpan() { End(); }

HostSpan::HostSpan(HostSpan&& o) noexcept
    : recorder_(std::exchange(o.recorder_, nullptr)),
      span_(std::move(o.span_)),
      start_s_(o.start_s_) {}

HostSpan& HostSpan::operator=(HostSpan&& o) noexcept {
  if (this != &o) {
    End();
    recorder_ = std::exchange(o.recorder_, nullptr);
    span_ = std::move(o.span_);
    start_s_ = o.start_s_;
  }
  return *this;
}

void HostSpan::End() {
  if (recorder_ == nullptr) return;
  span_.start_s = start_s_;
  span_.end_s = recorder_->Now();
  std::exchange(recorder_, nullptr)->Add(std::move(span_));
}

HostSpan OptimizerSpan(TraceRecorder* recorder, int layer) {
  if (recorder == nullptr) return HostSpan();
  const TraceRecorder::TaskLabel task = recorder->UpdateTask(layer);
  return HostSpan(recorder, plan::LaneKind::kCpuOptimizer, plan::TaskKind::kOptimizer, task.name,
                  -1, task.stage);
}

}  // namespace ferry::exec
