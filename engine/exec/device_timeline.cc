#include "engine/exec/device_timeline.h"

#include <utility>

#include "engine/plan/pipeline_schedules.h"

namespace ferry::exec {
namespace {

plan::LaneKind LaneOf(StreamId s) {
  switch (s) {
    case StreamId::kCompute:
      return plan::LaneKind::kCompute;
    case StreamId::kUpload:
      return plan::LaneKind::kHostToDevice;
    case StreamId::kDownload:
      return plan::LaneKind::kDeviceToHost;
  }
  return plan::LaneKind::kCompute;
}

}  // namespace

Result<std::unique_ptr<DeviceTimeline>> DeviceTimeline::Create(Device& device, int gpu,
                                                               int forward_stages, int tail_parts) {
  FERRY_ASSIGN_OR_RETURN(Event before, device.CreateTimedEvent());
  FERRY_ASSIGN_OR_RETURN(Event after, device.CreateTimedEvent());
  return std::unique_ptr<DeviceTimeline>(new DeviceTimeline(device, gpu, forward_stages, tail_parts,
                                                            std::move(before), std::move(after)));
}

Status DeviceTimeline::BeginStep(const TraceRecorder& recorder) {
  used_ = 0;
  open_.fill(std::nullopt);
  tasks_.clear();  // keeps its capacity (and the names' buffers go with the tasks)
  FERRY_RETURN_IF_ERROR(device_.Record(anchor_before_, StreamId::kCompute));
  FERRY_RETURN_IF_ERROR(device_.LaunchHostFunc(StreamId::kCompute, [this, &recorder] {
    anchor_host_s_ = recorder.Now();
    return Status::Ok();
  }));
  return device_.Record(anchor_after_, StreamId::kCompute);
}

Result<size_t> DeviceTimeline::NextEvent() {
  if (used_ == events_.size()) FERRY_RETURN_IF_ERROR(Reserve(used_ + 1));
  return used_++;
}

Status DeviceTimeline::Reserve(size_t events) {
  events_.reserve(events);
  tasks_.reserve(events / 2);
  while (events_.size() < events) {
    FERRY_ASSIGN_OR_RETURN(Event e, device_.CreateTimedEvent());
    events_.push_back(std::move(e));
    ++created_;
  }
  return Status::Ok();
}

Status DeviceTimeline::Begin(StreamId stream) {
  FERRY_ASSIGN_OR_RETURN(const size_t e, NextEvent());
  FERRY_RETURN_IF_ERROR(device_.Record(events_[e], stream));
  open_[size_t(stream)] = e;
  return Status::Ok();
}

Status DeviceTimeline::End(StreamId stream, char what, plan::TaskKind kind, int stage,
                           int micro_batch, double bytes, int chunk, std::string_view suffix) {
  std::optional<size_t>& begin = open_[size_t(stream)];
  if (!begin) {
    return Status::Internal("DeviceTimeline::End on " + std::string(StreamName(stream)) +
                            " without a Begin");
  }
  FERRY_ASSIGN_OR_RETURN(const size_t e, NextEvent());
  FERRY_RETURN_IF_ERROR(device_.Record(events_[e], stream));
  if (what == 0) {
    what = plan::StepStageLetter(stage, forward_stages_, tail_parts_);
    kind = plan::StepStageKind(stage, forward_stages_, tail_parts_);
  }
  Task t{.begin = *begin,
         .end = e,
         .stream = stream,
         .name = plan::RoundRobinTaskName(what, stage, forward_stages_, micro_batch, tail_parts_),
         .kind = kind,
         .stage = stage,
         .micro_batch = micro_batch,
         .bytes = bytes};
  if (chunk >= 0) t.name += "/" + std::to_string(chunk);
  t.name += suffix;
  tasks_.push_back(std::move(t));
  begin.reset();
  return Status::Ok();
}

Status DeviceTimeline::Collect(TraceRecorder& recorder) {
  FERRY_RETURN_IF_ERROR(device_.Synchronize(anchor_after_));
  const double host = anchor_host_s_;
  FERRY_ASSIGN_OR_RETURN(const double window,
                         device_.ElapsedSeconds(anchor_before_, anchor_after_));
  recorder.NoteClockError(gpu_, window);
  recorder.NoteEventsCreated(int64_t(std::exchange(created_, 0)));
  for (Task& t : tasks_) {
    FERRY_RETURN_IF_ERROR(device_.Synchronize(events_[t.end]));
    FERRY_ASSIGN_OR_RETURN(const double start,
                           device_.ElapsedSeconds(anchor_before_, events_[t.begin]));
    FERRY_ASSIGN_OR_RETURN(const double end,
                           device_.ElapsedSeconds(anchor_before_, events_[t.end]));
    recorder.Add({.name = std::move(t.name),
                  .kind = t.kind,
                  .lane = {LaneOf(t.stream), gpu_},
                  .step = recorder.step(),
                  .stage = t.stage,
                  .micro_batch = t.micro_batch,
                  .bytes = t.bytes,
                  .start_s = host + start,
                  .end_s = host + end});
  }
  tasks_.clear();
  return Status::Ok();
}

}  // namespace ferry::exec
