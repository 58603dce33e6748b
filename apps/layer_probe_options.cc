#include "apps/layer_probe_options.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "apps/job_options.h"
#include "apps/plan_command.h"
#include "engine/exec/job_device_factory.h"
#include "engine/job/job_devices.h"
#include "engine/probe/layer_probe.h"

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
  // On GPU 0 when the machine has one and the dtype is a GPU's; on a CPU device otherwise.
  const GpuCensus census = exec::TakeGpuCensus();
  const bool gpu = !census.gpus.empty() && job.scratch.cuda;
  const std::string where = gpu ? "cuda:0 (" + census.gpus[0].name + ")"
                                : "a CPU device, " + std::to_string(cores) + " threads";
  const std::string why = gpu                   ? ""
                          : census.gpus.empty() ? " (no GPU: " + census.none_reason + ")"
                                                : " (--dtype f32 runs on CPU devices only)";
  std::printf("probing layers on %s%s\n", where.c_str(), why.c_str());
  o.device_memory_is_host = !gpu;
  auto make_device = [&](size_t bytes) -> Result<std::unique_ptr<Device>> {
    JobSpec one;
    one.device_kind = gpu ? "cuda" : "cpu";
    if (gpu) one.gpus = {0};
    FERRY_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Device>> d,
                           exec::CreateJobDevices(one, bytes, cores));
    return std::move(d.at(0));
  };
  FERRY_ASSIGN_OR_RETURN(std::vector<LayerProbeEntry> times,
                         ProbeLayerTimes(model, job, profile.gpu.count, make_device, o));
  for (const LayerProbeEntry& e : times) {
    std::printf("%-10s B=%-3lld T=%-5lld forward %9.3f ms  backward %9.3f ms\n", e.layer.c_str(),
                static_cast<long long>(e.micro.batch), static_cast<long long>(e.micro.seq_len),
                1e3 * e.time.forward_s, 1e3 * e.time.backward_s);
  }
  MergeLayerTimes(times, profile);
  std::printf("%zu layer times for %s (on %s); plan with the same job options and --dtype %s\n",
              times.size(), cmd.job.model.c_str(), where.c_str(), cmd.dtype.c_str());
  return Status::Ok();
}

}  // namespace ferry
