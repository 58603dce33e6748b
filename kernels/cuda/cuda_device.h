// CudaDevice: the Device interface (kernels/device.h) on one NVIDIA GPU, through the CUDA runtime
// API (never the driver library).
//
//  - The arena is ONE cudaMalloc of the capacity, handed out by the shared offset allocator
//    (kernels/arena.h); the cuBLAS(Lt) workspace is the arena's first allocation
//    ("cublas workspace"), so capacity() counts it and arena_stats() shows it in use.
//  - Streams are three non-blocking cudaStream_t; events wrap cudaEvent_t (timing disabled, except
//    CreateTimedEvent's), so Record/Wait/Query/ElapsedSeconds follow CUDA's own rules, which are
//    the interface's rules.
//  - Errors: a CUDA fault (bad kernel, failed copy) is sticky in the CUDA context and comes back
//    from every later synchronize, named by the call that saw it. A host function's error is kept
//    by ferry per stream (mutex-guarded): it comes back from the next Synchronize of that stream,
//    of an event recorded on it after the failure, or of the device; later host functions on the
//    poisoned stream are skipped, and a stream that waits on an event recorded after the failure
//    is poisoned too. Kernels and copies already enqueued behind a failed host function still run
//    on the GPU (CUDA cannot skip them); their results are not to be used, the error is reported.
//    Device::Synchronize() returns the first error and clears the host-function errors.
//  - A small pinned host block (cudaHostAlloc, kCheckBytes) receives the bytes of
//    EnqueueComputeCheck.
//  - Several CudaDevices may live in one process (one per GPU): every call sets its device first.
//
// Ownership: every CUDA handle (arena memory, streams, events, cuBLAS handles) is owned by a
// RAII member and released in reverse order of creation. DeviceBuffers and Events must be
// destroyed before their device. Thread-safety: as Device; calls enqueueing on one stream from
// several threads are serialized per stream, so a stream's order is the order calls returned.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/device.h"

namespace ferry {

struct CudaContext;  // raw CUDA handles, for kernels only (kernels/cuda/cuda_context.h)

// What the CUDA runtime says about one GPU (CudaDevice::Describe).
struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;        // "NVIDIA H200"
  size_t total_bytes = 0;  // device memory (cudaMemGetInfo's total)
  size_t free_bytes = 0;   // what this process may still allocate, its own context counted
  int multiprocessors = 0;
  int compute_capability = 0;  // major * 10 + minor
  std::string pci_bus_id;      // "0000:01:00.0"
};

struct CudaDeviceOptions {
  int ordinal = 0;   // CUDA device index
  std::string name;  // empty: "cuda<ordinal>"
  // Arena capacity: memory_bytes when non-zero, else memory_fraction of the free memory that
  // cudaMemGetInfo reports at creation; rounded down to the alignment.
  size_t memory_bytes = 0;
  double memory_fraction = 0.9;
  size_t alignment = 256;                            // every allocation is rounded up to this
  size_t cublas_workspace_bytes = size_t(32) << 20;  // carved from the arena; 32 MiB suits sm_90
  // `--dtype fp16acc`: GEMMs whose A, B and C are all f16 accumulate in fp16
  // (CUBLAS_COMPUTE_16F, the consumer cards' doubled-rate mode; kernels/cuda/gemm.cu); every
  // other GEMM keeps fp32 accumulation.
  bool gemm_f16_accumulate = false;
};

class CudaDevice final : public Device {
 public:
  // Number of CUDA devices, or Unavailable (with CUDA's reason) when there is none or no driver.
  static Result<int> CountDevices();
  // Properties and free memory of GPU `ordinal` (creates its CUDA context in this process when
  // none exists yet). Errors: Unavailable when the ordinal names no GPU.
  static Result<CudaDeviceInfo> Describe(int ordinal);
  // Errors: Unavailable when the ordinal names no GPU; InvalidArgument for a bad fraction,
  // alignment or a workspace larger than the capacity; OutOfMemory when the arena cannot be
  // allocated (names the request and the free memory).
  static Result<std::unique_ptr<CudaDevice>> Create(const CudaDeviceOptions& options);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  const std::string& name() const override;
  size_t capacity() const override;
  int ordinal() const;
  bool gemm_f16_accumulate() const;  // CudaDeviceOptions::gemm_f16_accumulate

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

  // Enqueues kernels on the compute stream; used by the op implementations (kernels/cuda/*.cu).
  // `launch` runs on the calling thread with this device current and the compute stream locked
  // against other enqueuers (the cuBLAS handles are not thread-safe), and launches its kernels on
  // context.compute. Launch errors come back named by `op`.
  Status EnqueueCompute(std::string_view op,
                        const std::function<Status(const CudaContext&)>& launch);

  // For ops whose kernels check device data (the LM head's target ids): copies `bytes` of device
  // memory at `src` (written by kernels enqueued before) into a small pinned host block the device
  // owns, then enqueues `check(host)` on the compute stream as a host function: its error fails
  // the stream (LaunchHostFunc's rules) and comes back from the next synchronize covering it. The
  // copy and the check are enqueued together under the compute stream's lock, and a host function
  // holds its stream until it returns, so concurrent checks never see each other's bytes.
  // InvalidArgument when bytes > kCheckBytes or src is outside the arena.
  static constexpr size_t kCheckBytes = 64;
  Status EnqueueComputeCheck(std::string_view op, DevicePtr<const std::byte> src, size_t bytes,
                             std::function<Status(const std::byte* host)> check);

 private:
  struct Impl;
  explicit CudaDevice(std::unique_ptr<Impl> impl);
  void Free(size_t handle) override;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
