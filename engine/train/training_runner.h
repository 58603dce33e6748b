// TrainingRunner: the devices and the ModelRunner `ferry train` trains with (RunTraining).
//  - job.devices == 1: one ModelRunner on one CPU device sized by EstimateDeviceBytes.
//  - job.devices == N > 1: the planner (engine/plan/planner.h) plans the job for N CPU devices
//    (CpuDevicesProfile; the job's compute dtype, f32 or bf16, op scratch for `threads` threads,
//    the job's micro-batch count), each device gets exactly the plan's per-device bytes, and a
//    PipelineRunner (engine/exec/pipeline_runner.h) runs the plan's stages round robin over them.
// Forward-only calls (validation loss, logits) need a single device: a job with --devices > 1
// and validation is refused by ValidateJobSpec.
// With `trace` (--devices N > 1 only: a single device runs a ModelRunner, not the executor), the
// pipeline records what its devices ran into a TraceRecorder (engine/exec/trace_recorder.h).
//
// Ownership: TrainingRunner owns its devices, the trace and the runner (declared after them, so
// destroyed first). Thread-safety: one host thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/exec/trace_recorder.h"
#include "engine/job/job_spec.h"
#include "engine/model/model_config.h"
#include "engine/model/model_runner.h"
#include "engine/plan/hardware_profile.h"
#include "engine/plan/planner.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/status.h"

namespace ferry {

struct TrainingRunner {
  std::vector<std::unique_ptr<CpuDevice>> devices;
  std::optional<plan::Plan> plan;              // --devices N > 1: the plan the pipeline runs
  std::unique_ptr<exec::TraceRecorder> trace;  // when asked for: what the pipeline ran
  std::unique_ptr<ModelRunner> runner;
  std::string summary;  // one line for the log: devices, stages, bytes per device
};

// A hardware profile for `count` CPU devices of `device_bytes` each (rates are nominal: they only
// steer the partition; host RAM is this machine's).
plan::HardwareProfile CpuDevicesProfile(int count, uint64_t device_bytes);

// The bytes of all the CPU devices CreateTrainingRunner creates for `job`: the one device's, or
// --devices N times the plan's per-device bytes (what `ferry train` checks against physical
// memory before it touches the run folder). Without a plan: the one device's bytes (each stage
// fits in them; CreateTrainingRunner then says why there is no plan).
uint64_t TrainingDevicesBytes(const JobSpec& job, const ModelConfig& model, int threads);

// `trace`: record what the pipeline runs (TrainingRunner::trace, sized for job.steps steps).
// Errors: InvalidArgument when the planner finds no plan for the devices (naming the binding
// constraint) or a trace is asked of a single device, and those of the device and runner
// factories.
Result<TrainingRunner> CreateTrainingRunner(const JobSpec& job, const ModelConfig& model,
                                            int threads, bool trace = false);

}  // namespace ferry
