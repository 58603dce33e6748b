// The devices of a job, made: the GPUs this process sees (TakeGpuCensus: the CUDA runtime's
// count and each GPU's properties; none on a build without CUDA) and a job's devices created as
// its plan sizes them (CreateJobDevices: CpuDevice or CudaDevice, named by JobDeviceNames).
// Choosing which devices a job gets is engine/job/job_devices.h's, over the census.
//
// Thread-safety: TakeGpuCensus may be called from any thread (it creates the CUDA runtime's
// context of each GPU it describes, once per process).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/job/job_devices.h"
#include "engine/job/job_spec.h"
#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry::exec {

GpuCensus TakeGpuCensus();

// The job's devices, each with an arena of `bytes_each`; CPU devices compute with `threads`
// threads. REQUIRES: ResolveJobDevices settled the job (device_kind "cpu" or "cuda").
// Errors: those of the device factories (a GPU that cannot be opened, an arena that does not
// fit), naming the device; Unavailable for CUDA devices on a build without CUDA.
Result<std::vector<std::unique_ptr<Device>>> CreateJobDevices(const JobSpec& job,
                                                              uint64_t bytes_each, int threads);

}  // namespace ferry::exec
