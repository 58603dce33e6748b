// The Device interface: what the executor drives. One interface, two implementations (CpuDevice
// in kernels/cpu, CudaDevice in kernels/cuda) with identical semantics: the executor never asks
// which it has, and a bug that would race on a GPU must fail on the CPU device too.
//
// A device has
//  - an arena with a hard cap: every allocation is named; one past the cap fails with
//    OutOfMemory naming the requester, the size, what is in use and the cap. Nothing allocates
//    inside a step: the plan sizes everything before the first one.
//  - three ordered streams (compute, upload, download). Work enqueued on a stream runs in order;
//    streams run concurrently with each other and with the host.
//  - events with CUDA's rules:
//      * Record(e, s) captures the work enqueued on s so far; e completes when that work has.
//      * Wait(s, e) makes later work on s wait for e's latest Record *at the time Wait is
//        enqueued*; a later Record of e does not affect that wait. Waiting on a never-recorded
//        event is a no-op. Events may be waited on by streams of any device of the same kind.
//      * Synchronize(e) blocks the host until e's latest record completes.
//  - errors raised inside a stream (a failed kernel, a host function returning an error) come
//    back as the Status of the next Synchronize (of the event, the stream or the device) that
//    covers the failed work. The stream is poisoned: its later work is skipped, events recorded
//    after the failure complete with the error, and streams that wait on those events are
//    poisoned too. Device::Synchronize() returns the first error and clears every stream's error
//    so the device can be used again.
//  - copies only between device memory and host-pool memory (HostSpan).
//
// Ownership: a DeviceBuffer must be destroyed before its Device; freeing a buffer while enqueued
// work still uses it is the caller's bug (synchronize first), exactly as with cudaFree.
// Thread-safety: a Device may be called from several host threads; each stream's enqueue order
// is the order in which the calls returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/host_memory.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

enum class DeviceKind { kCpu, kCuda };

enum class StreamId : int { kCompute = 0, kUpload = 1, kDownload = 2 };
inline constexpr int kNumStreams = 3;
std::string_view StreamName(StreamId s);

// Device-kind-specific state behind an Event.
class EventImpl {
 public:
  virtual ~EventImpl() = default;
};

// A move-only event handle, created by Device::CreateEvent.
class Event {
 public:
  Event() = default;
  explicit Event(std::unique_ptr<EventImpl> impl) : impl_(std::move(impl)) {}
  bool valid() const { return impl_ != nullptr; }
  EventImpl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<EventImpl> impl_;
};

// One named allocation, as logged by the arena (the planner's tests compare against it).
struct ArenaRecord {
  std::string requester;
  size_t offset = 0;
  size_t bytes = 0;     // as requested
  size_t reserved = 0;  // rounded up to the alignment
  bool live = true;
};

struct ArenaStats {
  size_t capacity = 0;
  size_t alignment = 0;
  size_t in_use = 0;       // reserved bytes of live allocations
  size_t peak = 0;         // high-water mark of in_use since creation or ResetPeak()
  size_t allocations = 0;  // live allocations
};

class Device;

// An arena block. Move-only; returns its bytes to the arena when destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  DevicePtr<std::byte> data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool valid() const { return device_ != nullptr; }
  // A view of the start of the buffer. REQUIRES: shape.numel() * size(dtype) <= bytes().
  Tensor View(DType dtype, Shape shape, size_t byte_offset = 0) const;

 private:
  friend class Device;
  void Release();
  Device* device_ = nullptr;
  DevicePtr<std::byte> data_;
  size_t bytes_ = 0;
  size_t handle_ = 0;  // the arena's record index
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceKind kind() const = 0;
  virtual const std::string& name() const = 0;
  // Bytes the arena may hand out (what a program can use, not the card's label).
  virtual size_t capacity() const = 0;
  // Host RAM this device's memory occupies now: a CPU device's arena pages that have been touched
  // (its arena is host memory, mapped whole and filled as used); 0 for a GPU.
  virtual size_t host_resident_bytes() const { return 0; }

  // ---- memory ----------------------------------------------------------------------------
  // REQUIRES: bytes > 0. Errors: OutOfMemory naming requester, size, in-use and capacity.
  virtual Result<DeviceBuffer> Allocate(size_t bytes, std::string_view requester) = 0;
  virtual ArenaStats arena_stats() const = 0;
  // Every allocation since creation (or the last ResetPeak), live or freed, in order.
  virtual std::vector<ArenaRecord> arena_log() const = 0;
  virtual void ResetPeak() = 0;

  // Makes host memory copyable at full speed (cudaHostRegister on CUDA; nothing to pin on the
  // CPU) until the returned registration is destroyed (before the device). A range that overlaps
  // one already registered is refused, on the CPU device as by CUDA
  // (cudaErrorHostMemoryAlreadyRegistered): register each buffer once per process.
  virtual Result<std::unique_ptr<HostRegistration>> RegisterHost(const HostAllocation& a) = 0;

  // ---- streams, events, copies (all enqueue and return at once) ---------------------------
  virtual Result<Event> CreateEvent() = 0;
  virtual Status Record(Event& event, StreamId stream) = 0;
  virtual Status Wait(StreamId stream, const Event& event) = 0;
  // Host blocks until the event's latest record completes; returns errors from that work.
  virtual Status Synchronize(const Event& event) = 0;
  // Host blocks until all work enqueued on the stream so far completes.
  virtual Status Synchronize(StreamId stream) = 0;
  // All streams; returns the first error and clears the error state.
  virtual Status Synchronize() = 0;
  // True when the event's latest record has completed (or it was never recorded).
  virtual Result<bool> Query(const Event& event) = 0;
  // An event that can also be timed (CUDA: created without cudaEventDisableTiming, which makes
  // its records cost more; CreateEvent's events order work only and cannot be timed).
  virtual Result<Event> CreateTimedEvent() = 0;
  // Seconds from when this device's stream reached `from`'s latest record to when it reached
  // `to`'s (cudaEventElapsedTime; negative when `to` ran first), on one clock for all of the
  // device's streams. The times are the stream's: when the work before each record had run, not
  // when the host enqueued it. REQUIRES: both timed events of this device, recorded on it.
  // Errors: InvalidArgument for an untimed event or one of another device; FailedPrecondition
  // when either was never recorded or its record has not completed (synchronize first).
  virtual Result<double> ElapsedSeconds(const Event& from, const Event& to) = 0;

  // REQUIRES: dst and src hold at least `bytes`.
  virtual Status CopyToDevice(DevicePtr<std::byte> dst, HostSpan src, size_t bytes,
                              StreamId stream = StreamId::kUpload) = 0;
  virtual Status CopyToHost(HostSpan dst, DevicePtr<const std::byte> src, size_t bytes,
                            StreamId stream = StreamId::kDownload) = 0;
  // Sets `bytes` of device memory to zero, in stream order.
  virtual Status Zero(DevicePtr<std::byte> dst, size_t bytes,
                      StreamId stream = StreamId::kCompute) = 0;
  // Runs `fn` on the host in stream order (cudaLaunchHostFunc). A non-ok return poisons the
  // stream like a failed kernel. `fn` must not call back into this device's streams.
  virtual Status LaunchHostFunc(StreamId stream, std::function<Status()> fn) = 0;

 protected:
  friend class DeviceBuffer;
  Device() = default;
  // For implementations: hand out and take back arena blocks through DeviceBuffer.
  static DeviceBuffer MakeBuffer(Device* device, DevicePtr<std::byte> data, size_t bytes,
                                 size_t handle);
  virtual void Free(size_t handle) = 0;
};

}  // namespace ferry
