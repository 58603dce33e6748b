// TrainingRunner: the devices and the runner `ferry train` trains with (RunTraining). One path
// for any device count and kind (--devices, engine/job/job_devices.h): the job's devices are
// settled against the GPUs this process sees (ResolveJobDevices: GPUs when present, else CPU
// devices), the planner (engine/plan/planner.h) plans the job for them (CpuDevicesProfile or
// GpuDevicesProfile; the job's compute dtype, op scratch for the device kind, the job's
// micro-batch count), each device gets exactly the plan's per-device bytes, and a PipelineRunner
// (engine/exec/pipeline_runner.h) runs the plan's stages round robin over them. One CPU device is
// a plan of one stage (the whole model fits its budget); one GPU streams what does not fit.
// With `trace`, the pipeline records what its devices ran into a TraceRecorder
// (engine/exec/trace_recorder.h).
// The profile's host RAM is --host-memory (else physical RAM) and its NVMe the free space of
// --nvme-dir (else none); the plan may put saved activations there (the runner's activation
// store, in ActivationsDir) and optimizer state (then optimizer_nvme_dir() tells the Trainer
// where), and a LoRA job's frozen base, which the executor then streams from the model's files
// each step.
//
// Ownership: TrainingRunner owns its devices, the trace and the runner (declared after them, so
// destroyed first). Thread-safety: one host thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/exec/trace_recorder.h"
#include "engine/job/job_devices.h"
#include "engine/job/job_spec.h"
#include "engine/job/run_folder.h"
#include "engine/model/generator.h"
#include "engine/model/model_config.h"
#include "engine/model/model_runner.h"
#include "engine/plan/hardware_profile.h"
#include "engine/plan/planner.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/status.h"
#include "offload/nvme_store.h"

namespace ferry {

// A run's hold on one of its NVMe folders (its activation store's, its optimizer state's): the
// folder's lock file "<dir>/.ferry-lock" held (FileLock), so two runs never share a folder (two
// runs of the same --out name and --nvme-dir would otherwise overwrite each other's files).
// Move-only; destroying it releases the lock and leaves the folder as it is.
class NvmeFolderLock {
 public:
  // Creates `dir` (0700) when missing. Errors: InvalidArgument when it holds a file ferry did not
  // write (naming it; nothing touched); FailedPrecondition when another process holds it; NoSpace;
  // IOError.
  static Result<NvmeFolderLock> Take(const std::string& dir);

  bool held() const { return lock_.held(); }
  const std::string& dir() const { return dir_; }
  // Removes what ferry wrote in the folder (its stores' files, then the lock file), the folder
  // when that leaves it empty, and releases the lock; a failure is a warning on stderr. Does
  // nothing when not held.
  void RemoveFolder();

 private:
  std::string dir_;
  FileLock lock_;
};

// Closes a scratch store, then removes its folder (NvmeFolderLock::RemoveFolder).
struct ScratchStoreDeleter {
  mutable NvmeFolderLock folder;
  void operator()(NvmeStore* store) const;
};
using ScratchStore = std::unique_ptr<NvmeStore, ScratchStoreDeleter>;

// An NVMe store for one run's scratch in options.directory, held under the folder's lock
// (NvmeFolderLock::Take, whose errors it returns); a killed run's store files there are removed
// first. Errors: also IOError; NvmeStore::Open's.
Result<ScratchStore> OpenScratchStore(NvmeStoreOptions options);
// Removes a killed run's NVMe folder in `dir` (its store files, lock and folder) when no process
// holds it, so its space counts as free; anything else (no such folder, another run's, a folder
// with other files) is left as it is. Errors: IOError.
Status ClearScratchLeftovers(const std::string& dir);
// The space the store files in `dir` take (their sizes; 0 for none).
uint64_t ScratchStoreBytes(const std::string& dir);

struct TrainingRunner {
  std::vector<std::unique_ptr<Device>> devices;
  std::optional<plan::Plan> plan;              // the plan the pipeline runs
  plan::HardwareProfile profile;               // the one it was planned on (nominal rates)
  std::unique_ptr<exec::TraceRecorder> trace;  // when asked for: what the pipeline ran
  // When the plan puts saved activations on NVMe: their store, in ActivationsDir (removed with
  // it); else null.
  ScratchStore activation_store;
  std::unique_ptr<ModelRunner> runner;
  // One line for the log: how many devices of which kind, stages, bytes per device.
  std::string summary;
  // When the plan puts optimizer state on NVMe: the folder the Trainer keeps it in
  // (OptimizerStateDir), held for this run (a finished run removes it); not held: host RAM. A
  // Trainer using it must be destroyed before the TrainingRunner, or it would write into a folder
  // no longer held.
  NvmeFolderLock optimizer_folder;
  // Where the Trainer keeps optimizer state (OptimizerStateOptions::nvme_dir): the folder held
  // above, or "" (host RAM).
  std::string optimizer_nvme_dir() const {
    return optimizer_folder.held() ? optimizer_folder.dir() : std::string();
  }
};

// Where a run keeps optimizer state the plan puts on NVMe: "<nvme_dir>/<run folder name>
// .optimizer-state" (a resume rebuilds it from the checkpoint; a finished run removes it).
std::string OptimizerStateDir(const JobSpec& job);
// Where a run keeps the saved activations the plan puts on NVMe: "<nvme_dir>/<run folder name>
// .activations", scratch for the run's lifetime.
std::string ActivationsDir(const JobSpec& job);

// A hardware profile for `count` CPU devices of `device_bytes` each (rates are nominal: they only
// steer the partition; host RAM is this machine's).
plan::HardwareProfile CpuDevicesProfile(int count, uint64_t device_bytes);
// The same for `count` CUDA devices of `device_bytes` each on GPUs named `gpu_model` (nominal
// rates too: `ferry plan` with a probed profile predicts a GPU's times).
plan::HardwareProfile GpuDevicesProfile(int count, uint64_t device_bytes,
                                        const std::string& gpu_model);

// What each of a settled job's CUDA devices may use: its share of its GPU (GpuDeviceBytes), or
// the job's --gpu-memory, which may only lower it. 0 for CPU devices.
// Errors (InvalidArgument, naming --gpu-memory): not a size (plan::ParseByteSize), zero, given for
// CPU devices, or more than the share.
Result<uint64_t> JobGpuBudget(const JobSpec& job, const GpuCensus& census);

// The plan of a settled job (ResolveJobDevices) on its devices: CPU devices bounded by the whole
// model (one stage on one CPU device), CUDA devices by JobGpuBudget (a budget below the model's
// bytes streams stages through the devices round-robin); the job's --host-memory and --nvme-dir.
// `forward_only` and `data`: as CreateTrainingRunner's. Errors: JobGpuBudget's;
// InvalidArgument when no plan fits (naming the binding constraint).
// `generate_positions` > 0: a generation plan (forward only, a KV cache of that many positions,
// plan::PlanJob::generate_positions; job.seq_len is the longest step).
// `profile` (optional) receives the profile it planned on.
Result<plan::Plan> PlanJobDevices(const JobSpec& job, const ModelConfig& model, int threads,
                                  bool forward_only, const GpuCensus& census,
                                  const plan::DataCounts& data = {}, int64_t generate_positions = 0,
                                  plan::HardwareProfile* profile = nullptr);

// The bytes of the whole model as one stage on one CPU device of `threads` threads, every
// activation saved (on the device itself for one device: the "keep" policy; or, `forward_only`,
// nothing saved), by the memory model
// (engine/plan/memory_model.h), with one gradient accumulator: no stage of a plan of `job` with
// one accumulator per device needs more, so it bounds each CPU device's budget (a plan with two
// is weighed too, and chosen only where the second fits within it: not for this one stage).
uint64_t WholeModelBytes(const JobSpec& job, const ModelConfig& model, int threads,
                         bool forward_only = false, int64_t generate_positions = 0);

// The host bytes of the CPU devices CreateTrainingRunner creates for `job`: --devices N times the
// plan's per-device bytes (what `ferry train` checks against physical memory before it touches
// the run folder). Without a plan: N times the whole model's one-stage bytes (each stage fits in
// them; CreateTrainingRunner then says why there is no plan). 0 when the job runs on GPUs.
// `forward_only`: as CreateTrainingRunner's.
// `generate_positions`: as PlanJobDevices'.
uint64_t TrainingDevicesBytes(const JobSpec& job, const ModelConfig& model, int threads,
                              bool forward_only = false, int64_t generate_positions = 0);

// `trace`: record what the pipeline runs (TrainingRunner::trace, sized for job.steps steps).
// `forward_only`: a forward-only plan (evaluation, `ferry eval`: no gradients, no optimizer
// state; memory_model.h): the runner's EvaluateLoss runs, its AccumulateStep fails.
// `data`: what the data tells the plan (TrainingData::Counts): its documents
// (plan::PlanJob::documents_in_rows; empty: one per sequence), which size the CUDA attention, and
// its rows' host bytes, which the plan counts (data.rows).
// `job`'s devices and dtype may still be "auto" (settled here as ResolveJobDevices does).
// Errors: those of ResolveJobDevices; InvalidArgument when the planner finds no plan for the
// devices (naming the binding constraint); those of the device and runner factories.
Result<TrainingRunner> CreateTrainingRunner(const JobSpec& job, const ModelConfig& model,
                                            int threads, bool trace = false,
                                            bool forward_only = false,
                                            const plan::DataCounts& data = {});

// What `ferry generate` runs: the job's devices and a generation plan of the model over them
// (PlanJobDevices with `positions`: prompt and new tokens; job.seq_len is the prompt, the longest
// step; batch 1), run by the pipeline executor (engine/exec/planned_generator.h). One CPU device
// holds the whole model as one stage and uploads its weights once per sequence; several stream
// the stages through them token by token, each keeping its blocks' KV cache.
struct GenerationRunner {
  std::vector<std::unique_ptr<Device>> devices;
  plan::Plan plan;
  std::unique_ptr<Generator> generator;  // borrows the devices: declared after them
  std::string summary;                   // one line for the log
};

// `weights`: borrowed by the generator (LoadModelFolder's), which must not outlive them.
// Errors: those of ResolveJobDevices; InvalidArgument for GPUs (generation keeps an f32 KV cache:
// CPU devices only for now) or when no plan fits (naming the binding constraint); those of the
// device factory and the executor.
Result<GenerationRunner> CreateGenerationRunner(const JobSpec& job, const ModelConfig& model,
                                                const HostTensors& weights, int threads,
                                                int64_t positions);

}  // namespace ferry
