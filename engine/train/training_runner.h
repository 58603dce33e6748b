// TrainingRunner: the devices and the runner `ferry train` trains with (RunTraining). One path
// for any device count (--devices N, N >= 1): the planner (engine/plan/planner.h) plans the job
// for N CPU devices (CpuDevicesProfile; the job's compute dtype, f32, bf16 or f16, op scratch for
// `threads` threads, the job's micro-batch count), each device gets exactly the plan's per-device
// bytes, and a PipelineRunner (engine/exec/pipeline_runner.h) runs the plan's stages round robin
// over them. One device is a plan of one device (one stage when the whole model fits, which
// bounds the budget).
// With `trace`, the pipeline records what its devices ran into a TraceRecorder
// (engine/exec/trace_recorder.h).
// The profile's host RAM is --host-memory (else physical RAM) and its NVMe the free space of
// --nvme-dir (else none); the plan may put optimizer state there (only that: PlanJob::
// nvme_optimizer_only), and then optimizer_nvme_dir tells the Trainer where.
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
  std::optional<plan::Plan> plan;              // the plan the pipeline runs
  std::unique_ptr<exec::TraceRecorder> trace;  // when asked for: what the pipeline ran
  std::unique_ptr<ModelRunner> runner;
  std::string summary;  // one line for the log: devices, stages, bytes per device
  // When the plan puts optimizer state on NVMe: the folder the Trainer keeps it in
  // (OptimizerStateDir); empty: host RAM.
  std::string optimizer_nvme_dir;
};

// Where a run keeps optimizer state the plan puts on NVMe: "<nvme_dir>/<run folder name>
// .optimizer-state" (a resume rebuilds it from the checkpoint; a finished run removes it).
std::string OptimizerStateDir(const JobSpec& job);

// A hardware profile for `count` CPU devices of `device_bytes` each (rates are nominal: they only
// steer the partition; host RAM is this machine's).
plan::HardwareProfile CpuDevicesProfile(int count, uint64_t device_bytes);

// The bytes of the whole model as one stage on one CPU device of `threads` threads, every
// activation saved (or, `forward_only`, nothing saved), by the memory model
// (engine/plan/memory_model.h): no stage of any plan of `job` needs more, so it bounds each CPU
// device's budget.
uint64_t WholeModelBytes(const JobSpec& job, const ModelConfig& model, int threads,
                         bool forward_only = false);

// The bytes of all the CPU devices CreateTrainingRunner creates for `job`: --devices N times the
// plan's per-device bytes (what `ferry train` checks against physical memory before it touches
// the run folder). Without a plan: N times the whole model's one-stage bytes (each stage fits in
// them; CreateTrainingRunner then says why there is no plan).
// `forward_only`: as CreateTrainingRunner's.
uint64_t TrainingDevicesBytes(const JobSpec& job, const ModelConfig& model, int threads,
                              bool forward_only = false);

// `trace`: record what the pipeline runs (TrainingRunner::trace, sized for job.steps steps).
// `forward_only`: a forward-only plan (evaluation, `ferry eval`: no gradients, no optimizer
// state; memory_model.h): the runner's EvaluateLoss runs, its AccumulateStep fails.
// Errors: InvalidArgument when the planner finds no plan for the devices (naming the binding
// constraint), and those of the device and runner factories.
Result<TrainingRunner> CreateTrainingRunner(const JobSpec& job, const ModelConfig& model,
                                            int threads, bool trace = false,
                                            bool forward_only = false);

}  // namespace ferry
