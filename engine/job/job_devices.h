// The devices a job runs on, as `--devices` names them and as the machine has them: the option's
// text (ParseDevicesOption, DevicesOptionText), the GPUs this process sees (GpuCensus, taken by
// engine/exec/job_device_factory.h), and the choice that settles a job's "auto" kind and dtype
// against them (ResolveJobDevices). Pure functions over values: a census is passed in, so every
// rule is tested on a machine without a GPU.
//
// --devices takes a count or a list of one kind:
//   2                 two devices: GPUs 0 and 1 when the machine has GPUs, else two CPU devices
//   cpu,cpu           two CPU devices, whatever GPUs there are
//   cuda:0,cuda:1     GPUs 0 and 1 ("cuda" alone is "cuda:0")
//   cuda:0,cuda:0     two logical devices sharing GPU 0, each with half its free memory (for the
//                     multi-device executor on a one-GPU machine)
// CPU and CUDA devices never mix in one job: a hand-off between stages is an event, and events
// wait across devices of one kind only (kernels/device.h).
//
// Plain values; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/job/job_spec.h"
#include "kernels/status.h"

namespace ferry {

// Sets job.devices, job.device_kind and job.gpus from `text`. Errors: InvalidArgument naming the
// item that is wrong and showing the forms above.
Status ParseDevicesOption(std::string_view text, JobSpec& job);

// The option's text for the job's devices, read back equal by ParseDevicesOption: the count for
// "auto", else the list ("cpu,cpu", "cuda:0,cuda:0").
std::string DevicesOptionText(const JobSpec& job);

// A --dtype name as the job keeps it: "fp16" and "fp32" (`ferry plan`'s spellings) are "f16" and
// "f32"; any other name is returned as given.
inline std::string CanonicalDtypeName(std::string name) {
  if (name == "fp16") return "f16";
  if (name == "fp32") return "f32";
  return name;
}

// Whether the job stores f16 on its devices (and so scales its loss): "f16" and "fp16acc".
inline bool F16Storage(const JobSpec& job) { return job.dtype == "f16" || job.dtype == "fp16acc"; }

// Checks the three fields against each other (count in [1, 64]; a GPU per device exactly when
// the kind is "cuda"; ordinals >= 0) and the dtype's name. ValidateJobSpec calls it.
Status ValidateJobDevices(const JobSpec& job);

// One GPU as the CUDA runtime describes it.
struct GpuInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA GeForce RTX 4090"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;     // what this process may still allocate
  int compute_capability = 0;  // major * 10 + minor
};

// The GPUs this process can use, or why there are none.
struct GpuCensus {
  std::vector<GpuInfo> gpus;
  std::string none_reason;  // set when gpus is empty: "this build has no CUDA", CUDA's reason
};

// Settles `job`'s devices against `census`: an "auto" kind becomes "cuda" (GPUs 0..N-1) when
// the census has GPUs, else "cpu"; an "auto" dtype becomes bf16 on GPUs and f32 on CPU devices.
// Returns one line for the start of a run saying which devices and why ("2 CPU devices (no GPU:
// ...)", "cuda:0 (NVIDIA H200, 139.8 GiB free, sm_90)").
// Errors (InvalidArgument, each saying what to give instead): a GPU the census lacks; more devices
// than GPUs with an "auto" kind; --dtype f32 on GPUs.
Result<std::string> ResolveJobDevices(JobSpec& job, const GpuCensus& census);

// The job's devices counted as its start lines and errors say them: "1 CPU device", "2 CUDA
// devices" (CPU unless the kind is "cuda").
std::string DevicesCountText(const JobSpec& job);

// The name of each of the job's devices, in order: "cpu0", "cpu1"; "cuda0", "cuda1"; GPUs that
// several devices share get "cuda0.0", "cuda0.1". REQUIRES: ValidateJobDevices(job) is ok.
std::vector<std::string> JobDeviceNames(const JobSpec& job);

// The share of a GPU's free memory a job's devices take (the rest stays with the CUDA context and
// the libraries' own allocations outside the arena), as CudaDeviceOptions::memory_fraction.
inline constexpr double kGpuMemoryFraction = 0.9;

// What each of a "cuda" job's devices may allocate: the least, over its GPUs, of
// kGpuMemoryFraction of the GPU's free memory split evenly between the devices sharing it (the
// job's --gpu-memory may lower it: engine/train/training_runner.h). 0 for a GPU the census lacks.
// REQUIRES: job.device_kind == "cuda".
uint64_t GpuDeviceBytes(const JobSpec& job, const GpuCensus& census);

}  // namespace ferry
