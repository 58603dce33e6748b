#include "engine/exec/stream_hazards.h"

namespace ferry::exec {

Result<StreamHazards> StreamHazards::Create(Device& device,
                                            std::span<const std::string_view> buffers) {
  StreamHazards h;
  h.device_ = &device;
  for (std::string_view name : buffers) {
    Buffer& b = h.buffers_[std::string(name)];
    for (int s = 0; s < kNumStreams; ++s) {
      FERRY_ASSIGN_OR_RETURN(b.read[s].event, device.CreateEvent());
      FERRY_ASSIGN_OR_RETURN(b.write[s].event, device.CreateEvent());
    }
  }
  return h;
}

Result<StreamHazards::Buffer*> StreamHazards::Find(std::string_view name) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) {
    return Status::InvalidArgument("stream hazards: no buffer '" + std::string(name) + "'");
  }
  return &it->second;
}

Status StreamHazards::WaitFor(StreamId waiter, int source, const Access& a) {
  uint64_t& waited = waited_[int(waiter)][source];
  if (a.seq <= waited) return Status::Ok();  // never recorded, or implied by a later wait
  waited = a.seq;
  return device_->Wait(waiter, a.event);
}

Status StreamHazards::Mark(StreamId stream, Access& a) {
  a.seq = ++recorded_[int(stream)];
  return device_->Record(a.event, stream);
}

Status StreamHazards::Before(StreamId stream, Names reads, Names writes) {
  for (int s = 0; s < kNumStreams; ++s) {
    if (s == int(stream)) continue;
    for (std::string_view name : reads) {
      FERRY_ASSIGN_OR_RETURN(Buffer * b, Find(name));
      FERRY_RETURN_IF_ERROR(WaitFor(stream, s, b->write[s]));
    }
    for (std::string_view name : writes) {
      FERRY_ASSIGN_OR_RETURN(Buffer * b, Find(name));
      // The later of the two records covers the earlier (one stream, in order).
      FERRY_RETURN_IF_ERROR(
          WaitFor(stream, s, b->read[s].seq > b->write[s].seq ? b->read[s] : b->write[s]));
    }
  }
  return Status::Ok();
}

Status StreamHazards::After(StreamId stream, Names reads, Names writes) {
  for (std::string_view name : writes) {
    FERRY_ASSIGN_OR_RETURN(Buffer * b, Find(name));
    FERRY_RETURN_IF_ERROR(Mark(stream, b->write[int(stream)]));
  }
  for (std::string_view name : reads) {
    FERRY_ASSIGN_OR_RETURN(Buffer * b, Find(name));
    FERRY_RETURN_IF_ERROR(Mark(stream, b->read[int(stream)]));
  }
  return Status::Ok();
}

}  // namespace ferry::exec
