#include "engine/exec/job_device_factory.h"

#include <string>

#include "kernels/cpu/cpu_device.h"
#include "kernels/ops/backend.h"
#ifdef FERRY_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace ferry::exec {

GpuCensus TakeGpuCensus() {
  GpuCensus census;
#ifdef FERRY_WITH_CUDA
  Result<int> count = CudaDevice::CountDevices();
  if (!count.ok()) {
    census.none_reason = count.status().message();
    return census;
  }
  for (int i = 0; i < *count; ++i) {
    Result<CudaDeviceInfo> info = CudaDevice::Describe(i);
    if (!info.ok()) {
      // A GPU that cannot be described cannot be used; the ones before it still can.
      if (census.gpus.empty()) census.none_reason = info.status().message();
      break;
    }
    census.gpus.push_back({.ordinal = info->ordinal,
                           .name = info->name,
                           .total_bytes = info->total_bytes,
                           .free_bytes = info->free_bytes,
                           .compute_capability = info->compute_capability});
  }
  if (census.gpus.empty() && census.none_reason.empty()) census.none_reason = "CUDA sees none";
#else
  census.none_reason = "this build of ferry has no CUDA (the toolkit was not found at build time)";
#endif
  return census;
}

Result<std::vector<std::unique_ptr<Device>>> CreateJobDevices(const JobSpec& job,
                                                              uint64_t bytes_each, int threads) {
  const std::vector<std::string> names = JobDeviceNames(job);
  std::vector<std::unique_ptr<Device>> devices;
  for (size_t i = 0; i < names.size(); ++i) {
    if (job.device_kind == "cpu") {
      FERRY_ASSIGN_OR_RETURN(
          std::unique_ptr<CpuDevice> d,
          CpuDevice::Create(
              {.name = names[i], .memory_bytes = size_t(bytes_each), .compute_threads = threads}));
      devices.push_back(std::move(d));
      continue;
    }
    if (job.device_kind != "cuda") {
      return Status::Internal("device kind '" + job.device_kind + "' was not resolved");
    }
#ifdef FERRY_WITH_CUDA
    CudaDeviceOptions o;
    o.ordinal = int(job.gpus[i]);
    o.name = names[i];
    o.memory_bytes = size_t(bytes_each);
    // What the plan's "library.workspace" entry counts; the device carves it from its arena.
    o.cublas_workspace_bytes = ScratchReportsFor(DeviceKind::kCuda).library_workspace;
    o.gemm_f16_accumulate = job.dtype == "fp16acc";
    Result<std::unique_ptr<CudaDevice>> d = CudaDevice::Create(o);
    if (!d.ok()) return d.status().WithContext("device " + names[i]);
    devices.push_back(std::move(d).value());
#else
    return Status::Unavailable("device " + names[i] + ": this build of ferry has no CUDA");
#endif
  }
  return devices;
}

}  // namespace ferry::exec
