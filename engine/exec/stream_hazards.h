// StreamHazards: orders work on one device's three streams (compute, upload, download) by the
// device buffers each piece of work reads and writes, so the streams overlap wherever their
// buffers allow and nowhere else.
//
// A buffer is a name for one or more device buffers (the executor's are the plan's allocations).
// For every buffer and stream the tracker keeps the last read and the last write that stream
// enqueued, each as an event (created once, at Create, and re-recorded). Work about to be enqueued
// on stream s waits for
//  - the other streams' last writes of what it reads (read after write), and
//  - the other streams' last reads and writes of what it writes (write after read or write);
// work on one stream is ordered by the stream itself. A wait on an event covers everything its
// stream enqueued before that record, so the tracker remembers, per pair of streams, the latest
// record already waited for and skips the waits it implies (each stream's records are numbered in
// enqueue order).
//
// Usage: Before(s, reads, writes); enqueue the work on s; After(s, reads, writes).
//
// Ownership: borrows the device (it must outlive the tracker); owns its events.
// Thread-safety: one host thread at a time (the thread that enqueues the work).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry::exec {

class StreamHazards {
 public:
  using Names = std::initializer_list<std::string_view>;

  StreamHazards() = default;
  StreamHazards(StreamHazards&&) = default;
  StreamHazards& operator=(StreamHazards&&) = default;

  // Events for each of `buffers` on `device`. Errors: those of Device::CreateEvent.
  static Result<StreamHazards> Create(Device& device, std::span<const std::string_view> buffers);

  // Makes `stream` wait for the conflicting accesses of the other streams. REQUIRES: every name
  // was given to Create (an unknown name is a programmer's mistake: InvalidArgument).
  Status Before(StreamId stream, Names reads, Names writes);
  // Records that work just enqueued on `stream` read `reads` and wrote `writes`.
  Status After(StreamId stream, Names reads, Names writes);

 private:
  struct Access {
    Event event;
    uint64_t seq = 0;  // the record's number on its stream; 0 = never recorded
  };
  struct Buffer {
    Access read[kNumStreams], write[kNumStreams];
  };

  Result<Buffer*> Find(std::string_view name);
  Status WaitFor(StreamId waiter, int source, const Access& a);
  Status Mark(StreamId stream, Access& a);

  Device* device_ = nullptr;
  std::map<std::string, Buffer, std::less<>> buffers_;
  uint64_t recorded_[kNumStreams] = {};             // records made on each stream so far
  uint64_t waited_[kNumStreams][kNumStreams] = {};  // [waiter][source]: latest record waited for
};

}  // namespace ferry::exec
