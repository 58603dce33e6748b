#include "apps/layer_probe_options.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "apps/job_options.h"
#include "apps/plan_command.h"
#include "engine/train/layer_probe.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry {

void AddLayerProbeOptions(CLI::App& probe, LayerProbeCommand* cmd) {
  cmd->app = &probe;
  AddJobOptions(probe, cmd->job, &cmd->lora_targets);
  probe
      .add_option("--dtype", cmd->dtype,
                  "Storage dtype of the probed layers, as the plan's: f32, bf16 or f16 (CPU "
                  "devices compute in f32 whatever they store)")
      ->capture_default_str();
  probe.add_option("--repeats", cmd->repeats, "Timed runs per layer (the median is kept)")
      ->capture_default_str();
  probe.add_flag("--layers-only", cmd->layers_only,
                 "With --model: skip the machine probes, keep --base's figures (e.g. an earlier "
                 "probe's file) and add the layer times");
}

Status RunLayerProbe(const LayerProbeCommand& cmd, int threads, plan::HardwareProfile& profile) {
  FERRY_ASSIGN_OR_RETURN(ModelConfig model, ResolvePlanModel(cmd.job.model));
  JobSpec spec = cmd.job;
  spec.threads = threads;
  FERRY_RETURN_IF_ERROR(ValidateJobShape(spec, model));
  FERRY_ASSIGN_OR_RETURN(
      plan::PlanJob job,
      PlanJobOf(spec, cmd.lora_targets, cmd.app->count("--micro-batches") > 0, cmd.dtype));
  const int cores = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  LayerProbeOptions o;
  o.repeats = cmd.repeats;
  o.cpu_threads = cores;
  o.seed = cmd.job.seed;
  auto cpu = [&](size_t bytes) -> Result<std::unique_ptr<Device>> {
    FERRY_ASSIGN_OR_RETURN(
        std::unique_ptr<CpuDevice> d,
        CpuDevice::Create({.name = "probe", .memory_bytes = bytes, .compute_threads = cores}));
    return std::unique_ptr<Device>(std::move(d));
  };
  FERRY_ASSIGN_OR_RETURN(std::vector<LayerProbeEntry> times,
                         ProbeLayerTimes(model, job, profile.gpu.count, cpu, o));
  for (const LayerProbeEntry& e : times) {
    std::printf("%-10s B=%-3lld T=%-5lld forward %9.3f ms  backward %9.3f ms\n", e.layer.c_str(),
                static_cast<long long>(e.micro.batch), static_cast<long long>(e.micro.seq_len),
                1e3 * e.time.forward_s, 1e3 * e.time.backward_s);
  }
  MergeLayerTimes(times, profile);
  std::printf(
      "%zu layer times for %s (CPU device, %d threads); plan with the same job options "
      "and --dtype %s\n",
      times.size(), cmd.job.model.c_str(), cores, cmd.dtype.c_str());
  return Status::Ok();
}

}  // namespace ferry
