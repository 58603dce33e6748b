// CpuDevice: the Device interface on the host, with GPU semantics (see kernels/device.h).
//
//  - The arena is one real fixed-size allocation; a plan that does not fit fails loudly.
//  - Each stream is a worker thread running its queue in order; a timed event's record takes
//    steady_clock on that thread when the stream reaches it (ElapsedSeconds).
//  - Compute runs on a ThreadPool owned by the device.
//  - An optional link model throttles host<->device copies to a configured bandwidth, so overlap
//    and transfer priorities are testable without a GPU.
//  - Test hook: random delays before each stream task (seeded) to shake out missing
//    synchronization; a race on a GPU must fail here too.
//  - Opt-in virtual time (kernels/cpu/virtual_clock.h): each stream operation also takes a fixed
//    virtual duration, timed events report virtual seconds and copies are not throttled, so a
//    run's timing is deterministic. Without a clock the device reads steady_clock, as above.
//
// Thread-safety: as Device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/cpu/thread_pool.h"
#include "kernels/device.h"
#include "kernels/ops/kernel_work.h"

namespace ferry {

class VirtualClock;

struct CpuDeviceOptions {
  std::string name = "cpu0";
  size_t memory_bytes = size_t(256) << 20;  // arena capacity
  size_t alignment = 256;                   // every allocation is rounded up to this
  int compute_threads = 1;                  // size of the device's ThreadPool
  double upload_bytes_per_s = 0;            // link model host->device; 0 = unthrottled
  double download_bytes_per_s = 0;          // link model device->host; 0 = unthrottled
  uint32_t max_random_delay_us = 0;         // test hook: 0 = off
  uint64_t random_delay_seed = 1;
  // Borrowed (it must outlive the device); shared by every device of a run. null = real time.
  VirtualClock* virtual_clock = nullptr;
};

class CpuDevice final : public Device {
 public:
  // Errors: InvalidArgument for a zero capacity, threads < 1 or a non-power-of-two alignment;
  // OutOfMemory when the arena cannot be mapped.
  static Result<std::unique_ptr<CpuDevice>> Create(const CpuDeviceOptions& options);
  ~CpuDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  const std::string& name() const override;
  size_t capacity() const override;
  size_t host_resident_bytes() const override;

  Result<DeviceBuffer> Allocate(size_t bytes, std::string_view requester) override;
  ArenaStats arena_stats() const override;
  std::vector<ArenaRecord> arena_log() const override;
  void ResetPeak() override;
  Result<std::unique_ptr<HostRegistration>> RegisterHost(const HostAllocation& a) override;

  Result<Event> CreateEvent() override;
  Status Record(Event& event, StreamId stream) override;
  Status Wait(StreamId stream, const Event& event) override;
  Status Synchronize(const Event& event) override;
  Status Synchronize(StreamId stream) override;
  Status Synchronize() override;
  Result<bool> Query(const Event& event) override;
  Result<Event> CreateTimedEvent() override;
  Result<double> ElapsedSeconds(const Event& from, const Event& to) override;

  Status CopyToDevice(DevicePtr<std::byte> dst, HostSpan src, size_t bytes,
                      StreamId stream = StreamId::kUpload) override;
  Status CopyToHost(HostSpan dst, DevicePtr<const std::byte> src, size_t bytes,
                    StreamId stream = StreamId::kDownload) override;
  Status Zero(DevicePtr<std::byte> dst, size_t bytes,
              StreamId stream = StreamId::kCompute) override;
  Status LaunchHostFunc(StreamId stream, std::function<Status()> fn) override;

  // Enqueues a kernel on the compute stream; used by the op dispatchers (kernels/ops). `op`
  // names the kernel in errors. The kernel gets the device's pool. `work` prices it under a
  // virtual clock (ignored without one).
  Status EnqueueCompute(std::string_view op, std::function<Status(ThreadPool&)> kernel,
                        const KernelWork& work = {});
  ThreadPool& pool();
  const CpuDeviceOptions& options() const;
  // How many events CreateEvent has made (tests check that a step creates none).
  int64_t events_created() const;

 private:
  struct Impl;
  explicit CpuDevice(std::unique_ptr<Impl> impl);
  void Free(size_t handle) override;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
