#include "engine/plan/roundpipe_schedule.h"

#include <algorithm>
#include <limits>
#include <string>

#include "engine/model/param_spec.h"
#include "engine/plan/simulator.h"

namespace ferry::plan {
namespace {

// One candidate stage size cut the way RoundPipe cuts it; stages in RoundPipePartition's order.
RoundPipePartition CutStages(const std::vector<RoundPipeLayer>& layers, double stage_s,
                             double stage_bytes) {
  const int n = static_cast<int>(layers.size());
  auto total = [&](int l) { return layers[size_t(l)].fwd_s + layers[size_t(l)].bwd_s; };
  auto fwd_size = [&](int l) { return layers[size_t(l)].bytes; };
  auto bwd_size = [&](int l) { return layers[size_t(l)].bytes + layers[size_t(l)].grad_bytes; };
  RoundPipePartition p;
  p.stage_s = stage_s;
  // The fused tail: the deepest layers whose recompute + backward fits one stage.
  int end = n;
  double sum = 0, size = 0;
  for (int l = n - 1; l >= 0; --l) {
    if (sum + total(l) > stage_s || size + bwd_size(l) > stage_bytes) break;
    sum += total(l);
    size += bwd_size(l);
    end = l;
  }
  p.tail = {end, n};
  // Forward stages over [0, end), filled from the deepest layer down.
  std::vector<LayerRange> reversed;
  sum = size = std::numeric_limits<double>::infinity();
  for (int l = end - 1; l >= 0; --l) {
    if (sum + layers[size_t(l)].fwd_s > stage_s || size + fwd_size(l) > stage_bytes) {
      reversed.push_back({l, l + 1});
      sum = size = 0;
    }
    reversed.back().first = l;
    sum += layers[size_t(l)].fwd_s;
    size += fwd_size(l);
  }
  p.forward.assign(reversed.rbegin(), reversed.rend());
  // Backward stages over [0, end), filled from layer 0 up, run deepest first.
  std::vector<LayerRange> up;
  sum = size = std::numeric_limits<double>::infinity();
  for (int l = 0; l < end; ++l) {
    if (sum + total(l) > stage_s || size + bwd_size(l) > stage_bytes) {
      up.push_back({l, l + 1});
      sum = size = 0;
    }
    up.back().last = l + 1;
    sum += total(l);
    size += bwd_size(l);
  }
  p.backward.assign(up.rbegin(), up.rend());
  return p;
}

// Host traffic of RoundPipe's per-step parameter refresh (sync_optim_param): every fp32
// optimizer parameter read, its compute-dtype copy written.
double ParamCopyBytes(double params, double dtype_bytes) { return params * (4 + dtype_bytes); }

// Two iterations of `one` back to back as RoundPipe's stale mode runs them (see the header):
// the second's stages continue the device counter (GPU rotated by the first's stage count) and
// queue behind the first's on every lane; it launches once the first's tail has finished every
// micro-batch, its last backward stage has begun uploading (first chunk landed) and the
// parameters were refreshed (a host-memory task of `copy_bytes`). Returns the second
// iteration's first task index.
int AppendOverlappedIteration(Schedule& two, const Schedule& one, int stages, double copy_bytes) {
  const int n = static_cast<int>(one.tasks.size());
  int tail_end = -1, last_upload = -1;
  for (int i = 0; i < n; ++i) {
    const SimTask& t = one.tasks[i];
    if (t.kind == TaskKind::kTail) tail_end = i;  // the last micro-batch's comes last
    if (t.kind == TaskKind::kWeightUpload && t.stage == stages - 1 && last_upload < 0) {
      last_upload = i;
    }
  }
  SimTask copy;
  copy.name = "P";  // parameters refreshed from the optimizer's copy
  copy.kind = TaskKind::kOther;
  copy.lane = {LaneKind::kHostMemory, 0};
  copy.bytes = copy_bytes;
  for (int d : {tail_end, last_upload}) {
    if (d >= 0) copy.deps.push_back(d);
  }
  const int gate = two.Add(std::move(copy));
  const int base = static_cast<int>(two.tasks.size());
  for (SimTask t : one.tasks) {
    if (IsPerGpuLane(t.lane.kind)) t.lane.gpu = (t.lane.gpu + stages) % one.gpus;
    for (int& d : t.deps) d += base;
    if (t.deps.empty()) t.deps.push_back(gate);
    t.name += "'";
    two.Add(std::move(t));
  }
  return base;
}

}  // namespace

Result<double> OverlappedIterationPeriod(const Schedule& one, int stages, double refresh_bytes,
                                         const LaneRates& rates) {
  if (stages < 1) return Status::InvalidArgument("overlapped iterations: stages must be >= 1");
  Schedule two = one;
  two.name = one.name + ", two overlapped iterations";
  const int second = AppendOverlappedIteration(two, one, stages, refresh_bytes);
  FERRY_ASSIGN_OR_RETURN(SimResult both, Simulate(two, rates));
  double end_first = 0, end_second = 0;
  for (size_t i = 0; i < two.tasks.size(); ++i) {
    if (two.tasks[i].kind == TaskKind::kOptimizer) continue;  // overlaps the next step
    double& end = static_cast<int>(i) < second ? end_first : end_second;
    end = std::max(end, both.timing[i].end_s);
  }
  return end_second - end_first;
}

Result<RoundPipePartition> PartitionLikeRoundPipe(const std::vector<RoundPipeLayer>& layers,
                                                  int min_stages, double upper_threshold,
                                                  double stage_memory_bytes) {
  if (layers.empty()) return Status::InvalidArgument("RoundPipe partition: no layers");
  if (min_stages < 1) return Status::InvalidArgument("RoundPipe partition: min_stages < 1");
  if (!(upper_threshold >= 1)) {
    return Status::InvalidArgument("RoundPipe partition: upper_threshold must be >= 1");
  }
  double slowest = 0, largest = 0;
  for (const RoundPipeLayer& l : layers) {
    slowest = std::max({slowest, l.fwd_s, l.fwd_s + l.bwd_s});
    largest = std::max(largest, l.bytes + l.grad_bytes);
  }
  // RoundPipe raises its memory limit (with a warning) when one layer exceeds it.
  const double stage_bytes = std::max(stage_memory_bytes, largest);
  // Candidate stage sizes: every run of consecutive layers (forward times, or recompute +
  // backward times) between the slowest layer and upper_threshold times it.
  std::vector<double> candidates;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t start = 0; start < layers.size(); ++start) {
      double sum = 0;
      for (size_t end = start; end < layers.size(); ++end) {
        sum += pass == 0 ? layers[end].fwd_s : layers[end].fwd_s + layers[end].bwd_s;
        if (sum > slowest * upper_threshold) break;
        if (sum >= slowest) candidates.push_back(sum);
      }
    }
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  RoundPipePartition best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (double stage_s : candidates) {
    RoundPipePartition p = CutStages(layers, stage_s, stage_bytes);
    const int stages = static_cast<int>(p.forward.size() + 1 + p.backward.size());
    const double cost = std::max(stages, min_stages) * stage_s;
    if (cost < best_cost) {
      best_cost = cost;
      best = std::move(p);
    }
  }
  return best;
}

RoundRobinJob RoundPipeJobOf(const std::vector<RoundPipeLayer>& layers,
                             const RoundPipePartition& partition, int gpus, int micro_batches) {
  auto at = [&](int l) -> const RoundPipeLayer& { return layers[size_t(l)]; };
  // Layers whose input the backward keeps on the host: where a backward stage (or the tail)
  // starts.
  std::vector<bool> kept(layers.size(), false);
  for (const LayerRange& r : partition.backward) kept[size_t(r.first)] = true;
  if (partition.tail.first < static_cast<int>(layers.size()))
    kept[size_t(partition.tail.first)] = true;

  RoundRobinJob job;
  job.gpus = gpus;
  job.micro_batches = micro_batches;
  for (const LayerRange& r : partition.forward) {
    StageCost c;
    for (int l = r.first; l < r.last; ++l) {
      c.fwd_s += at(l).fwd_s;
      c.weight_bytes += at(l).bytes;
      // Inputs kept for backward stages starting inside this one go to the host as well.
      if (l > r.first && kept[size_t(l)]) c.output_bytes += at(l).input_bytes;
    }
    c.input_bytes = at(r.first).input_bytes;
    c.output_bytes += at(r.last - 1).output_bytes;
    job.forward.push_back(c);
  }
  const LayerRange& t = partition.tail;
  for (int l = t.first; l < t.last; ++l) {
    job.tail.fwd_s += at(l).fwd_s;
    job.tail.bwd_s += at(l).bwd_s;  // fused: no recomputation
    job.tail.weight_bytes += at(l).bytes;
    job.tail.grad_bytes += at(l).grad_bytes;
  }
  job.tail.input_bytes = at(t.first).input_bytes;
  job.tail.output_bytes = t.first > 0 ? at(t.first).input_bytes : 0;  // dX
  for (const LayerRange& r : partition.backward) {
    StageCost c;
    for (int l = r.first; l < r.last; ++l) {
      c.bwd_s += at(l).fwd_s + at(l).bwd_s;  // recompute, then backward
      c.weight_bytes += at(l).bytes;
      c.grad_bytes += at(l).grad_bytes;
    }
    c.input_bytes = at(r.first).input_bytes + at(r.last - 1).output_bytes;  // X and dY
    c.output_bytes = r.first > 0 ? at(r.first).input_bytes : 0;             // dX
    job.backward.push_back(c);
  }
  return job;
}

PlanJob RoundPipeBenchmarkJob() {
  PlanJob job;
  job.global_batch = 20;
  job.seq_len = 2048;
  job.micro_batches = 10;
  job.compute_dtype = DType::kF16;
  job.fp16_accumulate = true;
  return job;
}

std::vector<RoundPipeLayer> RoundPipeLayersOf(const ModelConfig& model, const PlanJob& job,
                                              const HardwareProfile& hw, int micro_batches) {
  const BatchShape micro = MicroBatchShape(job, job.global_batch / micro_batches);
  const double rate = hw.gpu.EffectiveFlops(job.fp16_accumulate);
  const double dtype_bytes = double(DTypeSize(job.compute_dtype));
  std::vector<RoundPipeLayer> out;
  for (const LayerSpec& spec : BuildLayerSpecs(model, job.lora, job.compute_dtype)) {
    const LayerCost cost = ComputeLayerCost(model, job.lora, spec, micro, job.compute_dtype);
    RoundPipeLayer l;
    if (spec.kind != LayerKind::kEmbedding) {  // a gather: no GEMM time
      l.fwd_s = cost.forward_flops / rate;
      l.bwd_s = cost.backward_flops / rate;
    }
    for (const ParamSpec& p : spec.params) {
      l.bytes += double(p.numel()) * dtype_bytes;
      if (p.trainable) l.grad_bytes += double(p.numel()) * dtype_bytes;
      if (p.trainable && p.tied_to.empty()) l.params += double(p.numel());
    }
    l.input_bytes = double(cost.input_bytes);
    l.output_bytes = double(cost.output_bytes);
    out.push_back(l);
  }
  return out;
}

Result<RoundPipeReplay> ReplayRoundPipe(const ModelConfig& model, const PlanJob& job,
                                        const HardwareProfile& hw,
                                        const RoundPipeSettings& settings) {
  FERRY_RETURN_IF_ERROR(ValidateModelConfig(model));
  FERRY_RETURN_IF_ERROR(ValidateHardwareProfile(hw));
  if (job.lora.enabled()) {
    return Status::InvalidArgument(
        "RoundPipe replay: full fine-tuning only (RoundPipe's "
        "published figures are for full fine-tuning)");
  }
  if (job.micro_batches < 1 || job.global_batch % job.micro_batches != 0 || job.seq_len < 1) {
    return Status::InvalidArgument("RoundPipe replay: micro_batches must divide the batch");
  }
  if (job.fp16_accumulate && !(hw.gpu.fp16_fp16acc_flops > 0)) {
    return Status::InvalidArgument("RoundPipe replay: the profile has no fp16-accumulate rate");
  }
  const int gpus = hw.gpu.count;
  const int m = int(job.micro_batches);
  const std::vector<RoundPipeLayer> layers = RoundPipeLayersOf(model, job, hw, m);
  RoundPipeReplay r;
  FERRY_ASSIGN_OR_RETURN(
      r.partition,
      PartitionLikeRoundPipe(layers, settings.min_stages > 0 ? settings.min_stages : gpus,
                             settings.upper_threshold,
                             settings.memory_fraction * double(hw.gpu.memory_usable_bytes) / 2));
  FERRY_ASSIGN_OR_RETURN(Schedule one,
                         BuildRoundRobinSchedule(RoundPipeJobOf(layers, r.partition, gpus, m)));
  one.name = "RoundPipe";
  const LaneRates rates = LaneRatesFromProfile(hw);
  FERRY_ASSIGN_OR_RETURN(SimResult sim, Simulate(one, rates));
  double params = 0;
  for (const RoundPipeLayer& l : layers) params += l.params;
  const double copy_bytes = ParamCopyBytes(params, double(DTypeSize(job.compute_dtype)));
  r.makespan_s = sim.makespan_s;
  r.bubble_fraction = sim.mean_bubble_fraction;
  r.optimizer_s = params * kAdamWBytesPerParameter / rates.cpu_optimizer;
  r.param_copy_s = copy_bytes / rates.host_memory;
  // Sync: the optimizer starts once the last gradient landed and the next step once the
  // parameters are refreshed.
  r.sync_step_s = r.makespan_s + r.optimizer_s + r.param_copy_s;
  // Stale: the period of overlapped iterations, unless the optimizer (and the refresh that
  // waits for it) takes longer.
  FERRY_ASSIGN_OR_RETURN(
      r.period_s,
      OverlappedIterationPeriod(
          one, static_cast<int>(r.partition.forward.size() + 1 + r.partition.backward.size()),
          copy_bytes, rates));
  r.stale_step_s = std::max(r.period_s, r.optimizer_s + r.param_copy_s);
  const double tokens = double(job.global_batch * job.seq_len);
  r.sync_tokens_per_s = tokens / r.sync_step_s;
  r.stale_tokens_per_s = tokens / r.stale_step_s;
  return r;
}

}  // namespace ferry::plan
