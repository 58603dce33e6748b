#include "engine/train/training_runner.h"

#include <unistd.h>

#include "engine/exec/pipeline_runner.h"
#include "engine/plan/planner.h"
#include "engine/train/run_training.h"
#include "kernels/arena.h"

namespace ferry {

plan::HardwareProfile CpuDevicesProfile(int count, uint64_t device_bytes) {
  const std::string src = "ferry train --devices: CPU devices, nominal rates";
  plan::HardwareProfile h;
  h.name = "cpu-devices";
  h.description = std::to_string(count) + " CPU devices";
  h.gpu = {.model = "cpu",
           .count = count,
           .memory_label_bytes = device_bytes,
           .memory_reserve_bytes = 0,
           .memory_usable_bytes = device_bytes,
           .bf16_flops = 1e11,
           .fp16_fp16acc_flops = 0,
           .matmul_efficiency = 0.5,
           .memory_bandwidth = 1e10,
           .peer_access = false,
           .source = src};
  h.pcie = {4, 16, 1e10, 1e10, 1e10, 1e10, src};
  const uint64_t ram = uint64_t(::sysconf(_SC_PHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGESIZE));
  h.host = {ram, ram, 1e10, 1, 1, src};
  h.nvme = {"", 0, 1e9, 1e9, 1e9, 0, src};
  h.optimizer = {1e9, src};
  return h;
}

namespace {

ModelRunnerOptions RunnerOptions(const JobSpec& job) {
  ModelRunnerOptions o;
  o.shape = {job.micro_batch_size(), job.seq_len};
  o.compute_dtype = job.dtype == "bf16" ? DType::kBF16 : DType::kF32;  // ValidateJobSpec'd
  return o;
}

size_t OneDeviceBytes(const JobSpec& job, const ModelConfig& model, int threads) {
  const ModelRunnerOptions o = RunnerOptions(job);
  return EstimateDeviceBytes(model, job.lora, o.shape, o.loss_chunk_tokens, threads);
}

// The plan of a --devices N job (N > 1) on N CPU devices.
Result<plan::Plan> PlanCpuDevices(const JobSpec& job, const ModelConfig& model, int threads) {
  plan::PlanJob pj;
  pj.global_batch = job.batch_size;
  pj.seq_len = job.seq_len;
  pj.micro_batches = job.micro_batches;
  pj.lora = job.lora;
  pj.compute_dtype = RunnerOptions(job).compute_dtype;
  pj.stale_updates = job.stale_updates;
  pj.scratch = {.cuda = false, .cpu_threads = threads};
  // A stage never needs more than the whole model on one device: that bounds the budget.
  FERRY_ASSIGN_OR_RETURN(
      plan::PlanOutcome outcome,
      plan::MakePlan(job.model, model, pj,
                     CpuDevicesProfile(int(job.devices), OneDeviceBytes(job, model, threads)),
                     /*suggest=*/false));
  if (!outcome.feasible) {
    return Status::InvalidArgument("no plan fits " + std::to_string(job.devices) +
                                   " CPU devices: " + outcome.binding + "; use --devices 1");
  }
  const plan::Plan& p = outcome.plan;
  if (p.micro_batches != job.micro_batches || p.micro_batch_size != job.micro_batch_size()) {
    return Status::Internal("the plan runs " + std::to_string(p.micro_batches) + " x " +
                            std::to_string(p.micro_batch_size) + " sequences, the job " +
                            std::to_string(job.micro_batches) + " x " +
                            std::to_string(job.micro_batch_size()));
  }
  return std::move(outcome.plan);
}

}  // namespace

uint64_t TrainingDevicesBytes(const JobSpec& job, const ModelConfig& model, int threads) {
  const uint64_t one_device = OneDeviceBytes(job, model, threads);
  if (job.devices <= 1) return one_device;
  Result<plan::Plan> p = PlanCpuDevices(job, model, threads);
  // Without a plan, CreateTrainingRunner reports why; the one device bounds each stage.
  if (!p.ok()) return one_device;
  return uint64_t(job.devices) * p->memory.gpu.total();
}

Result<TrainingRunner> CreateTrainingRunner(const JobSpec& job, const ModelConfig& model,
                                            int threads, bool trace) {
  TrainingRunner t;
  if (job.stale_updates && job.devices <= 1) {
    return Status::InvalidArgument(
        "--stale-updates overlaps the optimizer with the next step of a pipeline: use it with "
        "--devices N (N > 1); one device runs every step on the newest weights");
  }
  if (trace && job.devices <= 1) {
    return Status::InvalidArgument(
        "a trace records the pipeline executor's streams: give --devices 2 or more (one device "
        "runs without the executor)");
  }
  if (job.devices <= 1) {
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> d,
                           CpuDevice::Create({.name = "cpu0",
                                              .memory_bytes = OneDeviceBytes(job, model, threads),
                                              .compute_threads = threads}));
    FERRY_ASSIGN_OR_RETURN(t.runner, ModelRunner::Create(*d, model, job.lora, RunnerOptions(job)));
    t.devices.push_back(std::move(d));
    t.summary = "1 CPU device";
    return t;
  }
  FERRY_ASSIGN_OR_RETURN(const plan::Plan p, PlanCpuDevices(job, model, threads));
  std::vector<Device*> raw;
  for (int64_t i = 0; i < job.devices; ++i) {
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> d,
                           CpuDevice::Create({.name = "cpu" + std::to_string(i),
                                              .memory_bytes = p.memory.gpu.total(),
                                              .compute_threads = threads}));
    raw.push_back(d.get());
    t.devices.push_back(std::move(d));
  }
  if (trace) t.trace = std::make_unique<exec::TraceRecorder>(p, job.steps);
  FERRY_ASSIGN_OR_RETURN(t.runner, exec::CreatePipelineRunner(raw, model, p, t.trace.get()));
  t.summary = std::to_string(job.devices) + " CPU devices, " + std::to_string(p.stages.size()) +
              " stages, activations " + p.activation_policy + ", " +
              FormatBytes(p.memory.gpu.total()) + " per device";
  t.plan = p;
  return t;
}

}  // namespace ferry
