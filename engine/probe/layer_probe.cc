#include "engine/probe/layer_probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <utility>

#include "engine/exec/pipeline_executor.h"
#include "engine/exec/trace_recorder.h"
#include "engine/model/master_weights.h"
#include "engine/plan/memory_model.h"
#include "engine/probe/device_probe.h"
#include "engine/probe/machine_probe.h"
#include "kernels/arena.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry {
namespace {

// The duration of the span of `kind` on `lane` that started last in trace step `step` (a stage's
// gradient zeroing is traced as its first compute span, before the layer's), or -1 without one.
double LastSpan(const std::vector<exec::TraceSpan>& spans, int64_t step, plan::LaneKind lane,
                plan::TaskKind kind) {
  const exec::TraceSpan* last = nullptr;
  for (const exec::TraceSpan& s : spans) {
    if (s.step != step || s.lane.kind != lane || s.kind != kind) continue;
    if (last == nullptr || s.start_s >= last->start_s) last = &s;
  }
  return last != nullptr ? last->end_s - last->start_s : -1.0;
}

// The timed rounds' durations of one probe run, seconds.
struct RoundTimes {
  std::vector<double> block_forward, block_backward, head_forward, head_backward;
  std::vector<double> embedding_forward, embedding_backward;
};

std::string ShapeText(BatchShape micro) {
  return std::to_string(micro.batch) + " x " + std::to_string(micro.seq_len) + " tokens";
}

// Runs `plan` (LayerProbePlan of `one`, a one-block model) on a device of `make_device`:
// warmup + repeats rounds of a traced Step and Evaluate; the timed rounds' layer times in `out`.
Status RunProbe(const ModelConfig& one, const plan::Plan& plan,
                const ProbeDeviceFactory& make_device, const LayerProbeOptions& o,
                RoundTimes& out) {
  const plan::PlanJob& job = plan.job;
  const std::vector<LayerSpec> layers = BuildLayerSpecs(one, job.lora, job.compute_dtype);
  HostTensors weights = InitMasterWeights(layers, o.seed);
  FERRY_RETURN_IF_ERROR(QuantizeFrozenBase(layers, weights));  // QLoRA's NF4
  HostTensors grads;
  bool embedding_trainable = false;
  for (const ParamSpec* p : StorageParams(layers)) {
    if (p->trainable) grads.tensors[p->name].resize(size_t(p->numel()));
  }
  for (const ParamSpec& p : layers.front().params) embedding_trainable |= p.trainable;
  const BatchShape micro = plan::MicroBatchShape(job, plan.micro_batch_size);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, int32_t(one.vocab_size - 1));
  std::vector<int32_t> tokens(size_t(micro.tokens())), targets(tokens.size());
  for (int32_t& t : tokens) t = token(rng);
  for (int32_t& t : targets) t = token(rng);
  const MicroBatchInput mb{.tokens = tokens,
                           .targets = targets,
                           .normalizer = double(micro.tokens()),
                           .overwrite_grads = true};

  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Device> d, make_device(size_t(plan.memory.gpu.total())));
  const int rounds = o.warmup + o.repeats;
  exec::TraceRecorder trace(plan, 2 * rounds);
  FERRY_ASSIGN_OR_RETURN(
      std::unique_ptr<exec::PipelineExecutor> e,
      exec::PipelineExecutor::Create({d.get()}, one, plan, nullptr, &trace, nullptr, nullptr,
                                     /*isolate_compute=*/true));
  const std::span<const MicroBatchInput> batches(&mb, 1);
  for (int r = 0; r < rounds; ++r) {
    FERRY_RETURN_IF_ERROR(e->Step(weights, batches, grads).status());
    FERRY_RETURN_IF_ERROR(e->Evaluate(weights, batches).status());
  }
  const std::vector<exec::TraceSpan> spans = trace.spans();
  using plan::LaneKind, plan::TaskKind;
  for (int r = o.warmup; r < rounds; ++r) {
    const int64_t step = 2 * int64_t(r), eval = step + 1;  // trace steps: each Run is one
    const double f = LastSpan(spans, step, LaneKind::kCompute, TaskKind::kForward);
    const double b = LastSpan(spans, step, LaneKind::kCompute, TaskKind::kBackward);
    const double tail = LastSpan(spans, step, LaneKind::kCompute, TaskKind::kTail);
    const double loss = LastSpan(spans, eval, LaneKind::kCompute, TaskKind::kTail);
    const double ef = LastSpan(spans, step, LaneKind::kHostMemory, TaskKind::kForward);
    const double eb = LastSpan(spans, step, LaneKind::kHostMemory, TaskKind::kBackward);
    if (f < 0 || b < 0 || tail < 0 || loss < 0 || ef < 0 || (embedding_trainable && eb < 0)) {
      return Status::Internal("layer probe: the executor's trace of round " + std::to_string(r) +
                              " lacks a layer's span");
    }
    out.block_forward.push_back(f);
    out.block_backward.push_back(b);
    out.head_forward.push_back(loss);
    out.head_backward.push_back(std::max(0.0, tail - loss));
    out.embedding_forward.push_back(ef);
    out.embedding_backward.push_back(embedding_trainable ? eb : 0.0);
  }
  return Status::Ok();
}

}  // namespace

plan::Plan LayerProbePlan(const ModelConfig& model, const plan::PlanJob& job, BatchShape micro,
                          const LayerProbeOptions& o) {
  ModelConfig one = model;
  one.num_layers = 1;
  plan::Plan p;
  p.model_name = "layer probe";
  p.gpus = 1;
  p.job = job;
  p.job.global_batch = micro.batch;
  p.job.seq_len = micro.seq_len;
  p.job.micro_batches = 1;
  p.job.scratch = {.cuda = !o.device_memory_is_host, .cpu_threads = o.cpu_threads};
  p.job.data_host_bytes = 0;  // the probe holds no data (the job's rows are resident already)
  // MicroBatchShape(p.job, B) is then `micro`, its most documents included.
  if (p.job.documents_in_rows.size() > size_t(micro.batch)) {
    p.job.documents_in_rows.resize(size_t(micro.batch));
  }
  p.micro_batches = 1;
  p.micro_batch_size = micro.batch;
  p.stages = {{1, 2}};
  p.recompute.assign(3, false);
  p.activation_policy = "save";
  p.memory = plan::ComputeMemory(plan::MemoryInputOf(one, p));
  return p;
}

LayerProbeBytes LayerProbeNeeds(const plan::Plan& plan) {
  LayerProbeBytes b;
  b.device = plan.memory.gpu.total();
  b.host = plan.memory.pinned_host.total();
  for (const plan::Allocation& a : plan.memory.pageable_host.allocations) {
    if (a.name != "optimizer.moments") b.host += a.bytes;  // no update runs
  }
  return b;
}

uint64_t AvailableHostMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream in(line);
    std::string name;
    uint64_t kib = 0;
    if (in >> name >> kib && name == "MemAvailable:") return kib * 1024;
  }
  return uint64_t(::sysconf(_SC_AVPHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGESIZE));
}

Result<std::vector<LayerProbeEntry>> ProbeLayerTimes(const ModelConfig& model,
                                                     const plan::PlanJob& job, int gpus,
                                                     const ProbeDeviceFactory& make_device,
                                                     const LayerProbeOptions& o) {
  FERRY_RETURN_IF_ERROR(ValidateModelConfig(model));
  FERRY_RETURN_IF_ERROR(ValidateTrainingLora(job.lora));
  // Each layer runs in the plan's storage dtype, as the executor's stages hold it (CPU devices
  // do the math in f32 whatever the storage).
  if (job.fp16_accumulate) {
    return Status::InvalidArgument(
        "fp16acc: the layer probe does not measure fp16-accumulating GEMMs yet (plan prices them "
        "at the profile's fp16-accumulate rate); probe with --dtype f16");
  }
  if (job.global_batch < 1 || job.seq_len < 1 || gpus < 1 || o.repeats < 1 || o.warmup < 0 ||
      (job.micro_batches > 0 && job.global_batch % job.micro_batches != 0)) {
    return Status::InvalidArgument(
        "layer probe: batch, sequence length and repeats must be at least 1 and --micro-batches "
        "must divide --batch-size");
  }
  const std::vector<LayerSpec> all = BuildLayerSpecs(model, job.lora, job.compute_dtype);
  const std::vector<plan::LayerTimeQuery> queries = plan::LayerTimeQueries(model, job, gpus);
  const uint64_t available = o.host_memory_bytes > 0 ? o.host_memory_bytes : AvailableHostMemory();
  // One run per micro-batch shape, in the order the queries first ask for it.
  std::vector<plan::Plan> runs;
  std::vector<BatchShape> shapes;
  std::vector<LayerProbeEntry> out;
  std::vector<size_t> run_of;  // per entry
  for (const plan::LayerTimeQuery& q : queries) {
    auto same = [&](const BatchShape& s) {
      return s.batch == q.micro.batch && s.seq_len == q.micro.seq_len &&
             s.max_documents == q.micro.max_documents;
    };
    size_t r = size_t(std::find_if(shapes.begin(), shapes.end(), same) - shapes.begin());
    if (r == shapes.size()) {
      shapes.push_back(q.micro);
      runs.push_back(LayerProbePlan(model, job, q.micro, o));
      const LayerProbeBytes bytes = LayerProbeNeeds(runs.back());
      const uint64_t need = bytes.host + (o.device_memory_is_host ? bytes.device : 0);
      if (need > available) {
        return Status::OutOfMemory(
            "layer probe: " + all[1].name + " at " + ShapeText(q.micro) + " needs " +
            FormatBytes(need) +
            " of host memory (its one-device plan of the embedding, one block "
            "and the head: " +
            FormatBytes(bytes.host) + " pinned staging, weights and gradients" +
            (o.device_memory_is_host ? " + " + FormatBytes(bytes.device) + " device arena" : "") +
            "), " + FormatBytes(available) +
            " available; probe a shorter --seq-len, fewer sequences per micro-batch (more "
            "--micro-batches) or on a machine with more RAM");
      }
    }
    const LayerSpec& layer = all[size_t(q.layer)];
    out.push_back({{q.key, 0, 0}, layer.name, q.micro, LayerProbeNeeds(runs[r])});
    run_of.push_back(r);
  }
  ModelConfig one = model;
  one.num_layers = 1;
  for (size_t r = 0; r < runs.size(); ++r) {
    RoundTimes t;
    FERRY_RETURN_IF_ERROR(RunProbe(one, runs[r], make_device, o, t)
                              .WithContext("layer probe at " + ShapeText(shapes[r])));
    for (size_t i = 0; i < out.size(); ++i) {
      if (run_of[i] != r) continue;
      const LayerKind kind = all[size_t(queries[i].layer)].kind;
      plan::MeasuredLayerTime& m = out[i].time;
      const bool head = kind == LayerKind::kHead, embedding = kind == LayerKind::kEmbedding;
      m.forward_s = plan::MedianOf(head        ? t.head_forward
                                   : embedding ? t.embedding_forward
                                               : t.block_forward);
      m.backward_s = plan::MedianOf(head        ? t.head_backward
                                    : embedding ? t.embedding_backward
                                                : t.block_backward);
    }
  }
  return out;
}

void MergeLayerTimes(const std::vector<LayerProbeEntry>& times, plan::HardwareProfile& profile) {
  for (const LayerProbeEntry& e : times) {
    auto same = [&](const plan::MeasuredLayerTime& t) { return t.key == e.time.key; };
    auto it = std::find_if(profile.layer_times.begin(), profile.layer_times.end(), same);
    if (it != profile.layer_times.end()) {
      *it = e.time;
    } else {
      profile.layer_times.push_back(e.time);
    }
  }
}

Result<std::string> PriceOnCpuDevices(const ModelConfig& model,
                                      const plan::HardwareProfile& profile, int threads,
                                      plan::Plan& plan) {
  const auto start = std::chrono::steady_clock::now();
  if (threads < 1) return Status::InvalidArgument("pricing a plan needs at least one thread");
  plan::HardwareProfile hw = profile;
  const int each = std::max(1, threads / std::max(1, plan.gpus));
  auto make_device = [each](size_t bytes) -> Result<std::unique_ptr<Device>> {
    FERRY_ASSIGN_OR_RETURN(
        std::unique_ptr<CpuDevice> d,
        CpuDevice::Create({.name = "probe", .memory_bytes = bytes, .compute_threads = each}));
    return std::unique_ptr<Device>(std::move(d));
  };
  plan::PlanJob job = plan.job;
  job.micro_batches = plan.micro_batches;  // the plan's shape only
  FERRY_ASSIGN_OR_RETURN(const std::vector<LayerProbeEntry> times,
                         ProbeLayerTimes(model, job, plan.gpus, make_device,
                                         {.host_memory_bytes = std::min(
                                              AvailableHostMemory(), profile.host.ram_usable_bytes),
                                          .cpu_threads = each}));
  MergeLayerTimes(times, hw);
  // 16 MiB each way: past the caches' share of one copy, a few milliseconds.
  constexpr size_t kCopyBytes = size_t(16) << 20;
  {
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Device> d,
                           make_device(2 * kCopyBytes));  // its two halves
    FERRY_ASSIGN_OR_RETURN(const plan::CopyRates copy, plan::ProbeCopyRates(*d, kCopyBytes));
    hw.pcie.h2d_pinned = copy.h2d_pinned;
    hw.pcie.d2h_pinned = copy.d2h_pinned;
    hw.pcie.h2d_pageable = copy.h2d_pageable;
    hw.pcie.d2h_pageable = copy.d2h_pageable;
  }
  const plan::ProbeOptions quick = plan::QuickProbeOptions();
  FERRY_ASSIGN_OR_RETURN(hw.host.memory_bandwidth,
                         plan::ProbeTriadBandwidth(threads, quick.triad_bytes));
  FERRY_ASSIGN_OR_RETURN(hw.optimizer.cpu_adamw_params_per_s,
                         plan::ProbeAdamWRate(threads, quick.adamw_params));
  hw.name = profile.name + ", rates measured here";
  FERRY_RETURN_IF_ERROR(plan::PricePlan(model, hw, plan));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char line[320];
  std::snprintf(line, sizeof line,
                "predicted %.3g s a step on this machine's rates, measured in %.2f s: %zu layer "
                "time%s on %d thread%s, copies %.1f GB/s, host memory %.1f GB/s and AdamW %.2f "
                "G params/s on %d thread%s",
                plan.step_s, took, times.size(), times.size() == 1 ? "" : "s", each,
                each == 1 ? "" : "s", hw.pcie.h2d_pinned / 1e9, hw.host.memory_bandwidth / 1e9,
                hw.optimizer.cpu_adamw_params_per_s / 1e9, threads, threads == 1 ? "" : "s");
  return std::string(line);
}

}  // namespace ferry
