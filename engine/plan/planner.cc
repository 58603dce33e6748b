#include "engine/plan/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <tuple>

#include "engine/model/converted_base.h"
#include "engine/plan/byte_size.h"
#include "engine/plan/simulator.h"

namespace ferry::plan {
namespace {

constexpr double kF32 = 4;

// Per-layer numbers the search needs, for one micro-batch.
struct LayerNumbers {
  double fwd_s = 0, bwd_s = 0;  // compute at the profile's effective rate
  double input = 0, saved = 0, output = 0;
  double weights = 0;            // bytes uploaded: the device layout (aligned; NF4 as stored)
  double trainable_weights = 0;  // of which trainable (what an update changes)
  double grads = 0;              // fp32 gradient bytes downloaded
  double pack = 0;               // host bytes of packing the weights for upload
  // A base streamed from NVMe: packing all of the weights, packing the trainable ones only, and
  // the drive's blocks the frozen base takes there (LayerBaseBytes).
  double full_pack = 0, trainable_pack = 0, base_read = 0;
  double trainable = 0;   // parameters the optimizer updates
  bool measured = false;  // fwd_s, bwd_s from the profile's layer_times
  // The embedding (on the host) when not measured: host bytes its gather / scatter-add move.
  double host_fwd_bytes = 0, host_bwd_bytes = 0;
};

// The embedding's host traffic per micro-batch of N tokens (fp32 master tables, fp32 hidden
// states): the gather reads a row of each table (token; position too when learned) and writes the
// hidden state; the scatter-add reads the hidden state's gradient and reads and writes a row of
// each trainable table's gradient.
void EmbeddingHostBytes(const ModelConfig& model, const LayerSpec& layer, BatchShape micro,
                        LayerNumbers& n) {
  const double row = double(micro.tokens()) * double(model.hidden_size) * kF32;
  double tables = 0, trainable = 0;
  for (const ParamSpec& p : layer.params) {
    tables += 1;
    if (p.trainable) trainable += 1;
  }
  n.host_fwd_bytes = (tables + 1) * row;
  n.host_bwd_bytes = trainable > 0 ? (1 + 2 * trainable) * row : 0;
}

struct Context {
  const ModelConfig& model;
  const PlanJob& job;
  const HardwareProfile& hw;
  std::vector<LayerSpec> layers;
};

bool LoraStep(const PlanJob& job) { return job.lora.enabled() && !job.forward_only; }

std::vector<LayerNumbers> NumbersFor(const Context& c, BatchShape micro) {
  const double rate = c.hw.gpu.EffectiveFlops(c.job.fp16_accumulate);
  const StreamedBaseSource base_source = StreamedBaseSourceOf(c.model, c.job);
  std::vector<LayerNumbers> out(c.layers.size());
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerCost cost =
        ComputeLayerCost(c.model, c.job.lora, c.layers[i], micro, c.job.compute_dtype);
    LayerNumbers& n = out[i];
    n.fwd_s = cost.forward_flops / rate;
    n.bwd_s = cost.backward_flops / rate;
    if (c.layers[i].kind == LayerKind::kEmbedding) {  // host work, not GPU FLOPs
      n.fwd_s = n.bwd_s = 0;
      EmbeddingHostBytes(c.model, c.layers[i], micro, n);
    }
    if (!c.hw.layer_times.empty()) {  // measured beats formulas
      const MeasuredLayerTime* t =
          c.hw.FindLayerTime(LayerTimeKey(c.model, c.job, c.layers[i], micro));
      if (t != nullptr) {
        n.fwd_s = t->forward_s;
        n.bwd_s = t->backward_s;
        n.measured = true;
      }
    }
    n.input = double(cost.input_bytes);
    n.saved = double(cost.saved_bytes);
    n.output = double(cost.output_bytes);
    // What the copies move: the device layout the executor uploads (compute dtype, or an NF4
    // weight's codes and quant state; LoRA groups packed) and the fp32 gradients it downloads.
    if (c.layers[i].kind != LayerKind::kEmbedding) {
      const LayerDeviceBytes d = DeviceBytesOf(c.layers[i], c.job.compute_dtype);
      n.weights = double(d.weights);
      n.trainable_weights = double(d.trainable_weights);
      n.grads = double(d.grads);
      // A LoRA job's steps repack the adapters only: the host mirror keeps the frozen base.
      n.pack = double(LoraStep(c.job) ? d.trainable_pack : d.pack);
      n.full_pack = double(d.pack);
      n.trainable_pack = double(d.trainable_pack);
      n.base_read = LayerBaseBytes(c.layers[i], base_source);
    }
    for (const ParamSpec& p : c.layers[i].params) {
      if (p.trainable && p.tied_to.empty()) n.trainable += double(p.numel());
    }
  }
  return out;
}

// Contiguous partition of blocks 1..N into `stages` ranges minimizing the
// largest stage's forward + backward time (dynamic programming; N is at most a
// few hundred).
std::vector<LayerRange> Partition(const std::vector<LayerNumbers>& n, int blocks, int stages) {
  std::vector<double> prefix(size_t(blocks) + 1, 0);
  for (int i = 0; i < blocks; ++i) {
    prefix[size_t(i) + 1] = prefix[size_t(i)] + n[size_t(i) + 1].fwd_s + n[size_t(i) + 1].bwd_s;
  }
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: smallest max-stage cost covering the first i blocks with s
  // stages.
  std::vector<std::vector<double>> best(size_t(stages) + 1,
                                        std::vector<double>(size_t(blocks) + 1, inf));
  std::vector<std::vector<int>> cut(best.size(), std::vector<int>(size_t(blocks) + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int i = s; i <= blocks; ++i) {
      for (int j = s - 1; j < i; ++j) {
        const double v =
            std::max(best[size_t(s - 1)][size_t(j)], prefix[size_t(i)] - prefix[size_t(j)]);
        if (v < best[size_t(s)][size_t(i)]) {
          best[size_t(s)][size_t(i)] = v;
          cut[size_t(s)][size_t(i)] = j;
        }
      }
    }
  }
  std::vector<LayerRange> ranges(static_cast<size_t>(stages));
  int i = blocks;
  for (int s = stages; s >= 1; --s) {
    const int j = cut[size_t(s)][size_t(i)];
    ranges[size_t(s - 1)] = {j + 1, i + 1};  // layer indices: block b is layer b + 1
    i = j;
  }
  return ranges;
}

std::vector<int64_t> MicroBatchCandidates(const PlanJob& job, int gpus) {
  if (job.micro_batches > 0) return {job.micro_batches};
  std::vector<int64_t> out;
  const int64_t want = std::min<int64_t>(gpus + 1, job.global_batch);
  for (int64_t d = want; d <= job.global_batch && out.size() < 4; ++d) {
    if (job.global_batch % d == 0) out.push_back(d);
  }
  if (out.empty() || out.back() != job.global_batch) out.push_back(job.global_batch);
  return out;
}

std::vector<int> StageCountCandidates(int blocks) {
  std::vector<int> out;
  for (int per = 1; per <= blocks; per *= 2) out.push_back((blocks + per - 1) / per);
  out.push_back(1);  // the whole model as one stage
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Per-layer choice: recompute a layer when its forward is faster than moving
// its saved set over PCIe (down in forward, up in backward: the slower
// direction bounds it).
std::vector<bool> RecomputePolicy(const std::string& policy, const std::vector<LayerNumbers>& n,
                                  const HardwareProfile& hw) {
  std::vector<bool> r(n.size(), false);
  const double link = std::min(hw.pcie.h2d_pinned, hw.pcie.d2h_pinned);
  for (size_t i = 1; i + 1 < n.size(); ++i) {  // blocks; the head is fused, never recomputed
    if (policy == "recompute") r[i] = true;
    if (policy == "per-layer") r[i] = n[i].fwd_s < n[i].saved / link;
  }
  return r;
}

struct Candidate {
  std::vector<LayerRange> stages;
  int64_t micro_batches = 1;
  std::string policy;
  std::vector<bool> recompute;
  Tier activations = Tier::kHost, optimizer = Tier::kHost, frozen = Tier::kHost;
  bool keep = false;  // policy "keep": the devices keep every saved activation
  int tail_parts = 1;
  int grad_accumulators = 1;
};

// How far over its budget each tier is (need / budget); <= 1 everywhere: fits.
struct Fit {
  double gpu = 0, host = 0, nvme = 0;
  double worst() const { return std::max({gpu, host, nvme}); }
  // The tightest tier: 0 GPU, 1 host, 2 NVMe.
  int tightest_tier() const { return gpu >= host && gpu >= nvme ? 0 : (host >= nvme ? 1 : 2); }
  const char* tightest() const {
    return std::array{"GPU memory", "host memory", "NVMe space"}[size_t(tightest_tier())];
  }
};
Fit FitOf(const MemoryEstimate& m, const HardwareProfile& hw) {
  auto ratio = [](double need, double have) {
    if (need <= 0) return 0.0;
    return have <= 0 ? std::numeric_limits<double>::infinity() : need / have;
  };
  Fit f;
  f.gpu = ratio(double(m.gpu.total()), double(hw.gpu.memory_usable_bytes));
  f.host = ratio(double(m.pinned_host.total() + m.pageable_host.total()),
                 double(hw.host.ram_usable_bytes));
  f.nvme = ratio(double(m.nvme.total()), hw.HasNvme() ? double(hw.nvme.space_bytes) : 0.0);
  return f;
}

// The host passes over a stage's gradient bytes when its landed gradients are added to the
// master gradients: the landing mirror read and the gradient written (the Trainer's first
// micro-batch asks the step to store, not add: MicroBatchInput::overwrite_grads).
constexpr double kGradAddPasses = 2;

// `keep`: the device keeps every block's input and saved set (policy "keep"): only stage inputs
// and outputs cross the host.
std::vector<StageCost> StageCosts(const std::vector<LayerNumbers>& n,
                                  const std::vector<LayerRange>& stages,
                                  const std::vector<bool>& recompute, bool backward, bool keep) {
  std::vector<StageCost> out;
  for (const LayerRange& s : stages) {
    StageCost sc;
    for (int i = s.first; i < s.last; ++i) {
      const LayerNumbers& l = n[size_t(i)];
      const double kept = keep ? 0 : l.input + (recompute[size_t(i)] ? 0 : l.saved);
      sc.weight_bytes += l.weights;
      sc.trainable_weight_bytes += l.trainable_weights;
      sc.full_pack.bytes += l.full_pack;
      sc.trainable_pack.bytes += l.trainable_pack;
      sc.base_read_bytes += l.base_read;
      if (!backward) {
        sc.fwd_s += l.fwd_s;
        sc.pack.bytes += l.pack;  // the backward stage over these layers reuses the mirror
        if (!keep) sc.output_bytes += l.output + (recompute[size_t(i)] ? 0 : l.saved);
      } else {
        sc.bwd_s += l.bwd_s + (recompute[size_t(i)] ? l.fwd_s : 0);
        sc.input_bytes += kept;
        sc.grad_bytes += l.grads;
        sc.add_grads.bytes += kGradAddPasses * l.grads;
        sc.param_count += l.trainable;
      }
    }
    const LayerNumbers& first = n[size_t(s.first)];
    if (!backward) sc.input_bytes = first.input;
    if (!backward && keep) sc.output_bytes = n[size_t(s.last - 1)].output;
    if (backward) {
      sc.input_bytes += n[size_t(s.last - 1)].output;  // dY
      sc.output_bytes = first.input;                   // dX
    }
    out.push_back(sc);
  }
  return out;
}

// `lora_step`: a LoRA training step, whose stages find their layers' frozen base in their
// weight slots where an earlier step left it (ResidentBases, as the executor places them): they
// upload the adapters only; and whose frozen embedding needs no input gradient: the last
// backward stage downloads none.
RoundRobinJob BuildJob(const std::vector<LayerNumbers>& n, const Candidate& k, int gpus,
                       bool lora_step) {
  RoundRobinJob job;
  job.gpus = gpus;
  job.micro_batches = int(k.micro_batches);
  job.tail_parts = k.tail_parts;
  job.grad_accumulators = k.grad_accumulators;
  job.executor_buffers = true;  // as the executor runs its plans
  job.input_slots = 2;
  job.forward = StageCosts(n, k.stages, k.recompute, false, k.keep);
  std::vector<LayerRange> reversed(k.stages.rbegin(), k.stages.rend());
  job.backward = StageCosts(n, reversed, k.recompute, true, k.keep);
  const LayerNumbers& head = n.back();
  job.tail.fwd_s = head.fwd_s;
  job.tail.bwd_s = head.bwd_s;
  job.tail.weight_bytes = head.weights;
  job.tail.trainable_weight_bytes = head.trainable_weights;
  job.streamed_base = k.frozen == Tier::kNvme;
  if (lora_step) {
    job.backward.back().output_bytes = 0;
    job.base_resident = ResidentBases(StepStageRanges(int(k.stages.size()), k.tail_parts), gpus);
  }
  job.tail.input_bytes = head.input;
  job.tail.output_bytes = head.input;  // dh
  job.tail.grad_bytes = head.grads;
  job.tail.pack.bytes = head.pack;
  job.tail.full_pack.bytes = head.full_pack;
  job.tail.trainable_pack.bytes = head.trainable_pack;
  job.tail.base_read_bytes = head.base_read;
  job.tail.add_grads.bytes = kGradAddPasses * head.grads;
  job.tail.param_count = head.trainable;
  job.backward.back().param_count += n.front().trainable;  // the embedding, updated on the host
  const LayerNumbers& embedding = n.front();  // measured seconds, else host bytes (formula)
  job.embedding_forward = {embedding.fwd_s, embedding.measured ? 0 : embedding.host_fwd_bytes};
  job.embedding_backward = {embedding.bwd_s, embedding.measured ? 0 : embedding.host_bwd_bytes};
  return job;
}

struct Timing {
  double makespan = 0, bubble = 0, h2d = 0, d2h = 0;
  double stale = 0;  // the step with one-step-stale updates (see planner.h)
  double pack = 0, grad_add = 0, embedding = 0;  // the host thread's work (Plan::host_pack_s...)
};

// When a simulated schedule's last task that is not the optimizer's ends, and its last compute.
struct LastEnds {
  double non_optimizer = 0, compute = 0;
};
LastEnds LastEndsOf(const Schedule& schedule, const SimResult& sim) {
  LastEnds e;
  for (size_t i = 0; i < schedule.tasks.size(); ++i) {
    const SimTask& task = schedule.tasks[i];
    const double end = sim.timing[i].end_s;
    if (task.kind != TaskKind::kOptimizer) e.non_optimizer = std::max(e.non_optimizer, end);
    if (task.lane.kind == LaneKind::kCompute) e.compute = std::max(e.compute, end);
  }
  return e;
}

Result<Timing> SimulateJob(const RoundRobinJob& job, const HardwareProfile& hw) {
  FERRY_ASSIGN_OR_RETURN(Schedule schedule, BuildRoundRobinSchedule(job));
  FERRY_ASSIGN_OR_RETURN(SimResult sim, Simulate(schedule, LaneRatesFromProfile(hw, true)));
  Timing t;
  t.makespan = sim.makespan_s;
  t.bubble = sim.mean_bubble_fraction;
  double first_upload = 0;  // the first stage's weights
  for (size_t i = 0; i < schedule.tasks.size(); ++i) {
    const SimTask& task = schedule.tasks[i];
    if (task.lane.kind == LaneKind::kHostToDevice) t.h2d += task.bytes;
    if (task.lane.kind == LaneKind::kDeviceToHost) t.d2h += task.bytes;
    const double busy = sim.timing[i].end_s - sim.timing[i].start_s;
    if (task.kind == TaskKind::kWeightPack) t.pack += busy;
    if (task.kind == TaskKind::kGradientAdd) t.grad_add += busy;
    if (task.lane.kind == LaneKind::kHostMemory &&
        (task.kind == TaskKind::kForward || task.kind == TaskKind::kBackward)) {
      t.embedding += busy;
    }
    if (task.kind == TaskKind::kWeightUpload && task.stage == 0) first_upload += busy;
  }
  // Stale: the next step starts once this one's last transfer or compute ends; the optimizer
  // overlaps it but must still keep up. Its first stage's weights were read ahead (unless the
  // base streams from NVMe): packed and uploaded at this step's end, after its last compute, so
  // the step is at least that compute's end plus their upload.
  if (job.streamed_base) {
    t.stale = LastEndsOf(schedule, sim).non_optimizer;
  } else {
    RoundRobinJob ahead = job;
    ahead.first_weights_ahead = true;
    FERRY_ASSIGN_OR_RETURN(Schedule s2, BuildRoundRobinSchedule(ahead));
    FERRY_ASSIGN_OR_RETURN(SimResult sim2, Simulate(s2, LaneRatesFromProfile(hw, true)));
    const LastEnds e = LastEndsOf(s2, sim2);
    t.stale = std::max(e.non_optimizer, e.compute + first_upload);
  }
  t.stale = std::max(t.stale, sim.BusySeconds({LaneKind::kCpuOptimizer, 0}));
  return t;
}

// NVMe traffic per step of the groups a candidate places there.
void NvmeTraffic(const Context& c, const MemoryEstimate& m, Plan& p) {
  if (p.frozen_weights == Tier::kNvme) {
    const StreamedBaseSource source = StreamedBaseSourceOf(c.model, c.job);
    p.nvme_read_bytes += StreamedBaseBytes(c.layers, source, p.stages, p.gpus, p.tail_parts);
    // Without the files' layout a streamed weight the files serve is counted at the most.
    p.base_reads_at_most =
        source.file_layout == nullptr && std::ranges::any_of(c.layers, [&](const LayerSpec& l) {
          return l.kind != LayerKind::kEmbedding &&
                 std::ranges::any_of(l.params, [&](const ParamSpec& q) {
                   return !q.trainable && source.FromFiles(q);
                 });
        });
  }
  for (const Allocation& a : m.nvme.allocations) {
    if (a.name == "activations.saved") {  // each entry written and read once; a.bytes is space
      p.nvme_write_bytes += double(m.nvme_activation_step_bytes);
      p.nvme_read_bytes += double(m.nvme_activation_step_bytes);
    }
    if (a.name == "optimizer.slots") {  // one of each layer's two slots read, the other written
      p.nvme_write_bytes += double(a.bytes) / 2;
      p.nvme_read_bytes += double(a.bytes) / 2;
    }
  }
}

// A plan's step and traffic from its simulated timing on `hw` (its NVMe traffic already set: the
// disk's time bounds the step too).
void ApplyTiming(const Timing& t, const HardwareProfile& hw, Plan& p) {
  const double nvme_s = hw.HasNvme() ? p.nvme_read_bytes / hw.nvme.read_rate +
                                           p.nvme_write_bytes / hw.nvme.sustained_write_rate
                                     : 0.0;
  p.sync_step_s = std::max(t.makespan, nvme_s);
  p.stale_step_s = std::max(t.stale, nvme_s);
  p.step_s = p.job.stale_updates ? p.stale_step_s : p.sync_step_s;
  p.bubble_fraction = t.bubble;
  p.pcie_h2d_bytes = t.h2d;
  p.pcie_d2h_bytes = t.d2h;
  p.host_pack_s = t.pack;
  p.host_grad_add_s = t.grad_add;
  p.host_embedding_s = t.embedding;
}

// A plan of candidate `k`'s choices (its stages, tiers, policies, tail parts and accumulators),
// nothing else set: CandidateOf's inverse.
Plan PlanOf(const Candidate& k) {
  Plan p;
  p.stages = k.stages;
  p.micro_batches = int(k.micro_batches);
  p.activation_policy = k.policy;
  p.recompute = k.recompute;
  p.activations = k.activations;
  p.optimizer_state = k.optimizer;
  p.frozen_weights = k.frozen;
  p.keep_activations = k.keep;
  p.tail_parts = k.tail_parts;
  p.grad_accumulators = k.grad_accumulators;
  return p;
}

// The candidate a plan was made from: PlanOf's inverse.
Candidate CandidateOf(const Plan& plan) {
  Candidate k{plan.stages, plan.micro_batches, plan.activation_policy, plan.recompute};
  k.activations = plan.activations;
  k.optimizer = plan.optimizer_state;
  k.frozen = plan.frozen_weights;
  k.keep = plan.keep_activations;
  k.tail_parts = plan.tail_parts;
  k.grad_accumulators = plan.grad_accumulators;
  return k;
}

// Candidate `k`'s memory on `gpus` devices: the memory model's input as a plan of it gives it.
MemoryEstimate MemoryOf(const Context& c, const Candidate& k, int gpus) {
  Plan p = PlanOf(k);
  p.job = c.job;
  p.gpus = gpus;
  p.micro_batch_size = c.job.global_batch / k.micro_batches;
  return ComputeMemory(MemoryInputOf(c.model, p));
}

Status ValidateInputs(const ModelConfig& model, const PlanJob& job, const HardwareProfile& hw) {
  FERRY_RETURN_IF_ERROR(ValidateModelConfig(model));
  // A quantized base alone has nothing to train: evaluation only.
  FERRY_RETURN_IF_ERROR(job.forward_only ? ValidateLoraConfig(job.lora)
                                         : ValidateTrainingLora(job.lora));
  FERRY_RETURN_IF_ERROR(ValidateHardwareProfile(hw));
  if (job.global_batch < 1) return Status::InvalidArgument("--batch-size must be at least 1");
  if (job.seq_len < 1) return Status::InvalidArgument("--seq-len must be at least 1");
  if (job.max_stages < 0) return Status::InvalidArgument("max_stages must be 0 (any) or more");
  if (job.max_tail_parts < 0) {
    return Status::InvalidArgument("max_tail_parts must be 0 (any) or more");
  }
  if (job.micro_batches < 0 || (job.micro_batches > 0 && job.global_batch % job.micro_batches)) {
    return Status::InvalidArgument("--micro-batches " + std::to_string(job.micro_batches) +
                                   " must divide --batch-size " + std::to_string(job.global_batch) +
                                   " (or be 0 for auto)");
  }
  if (job.generate_positions != 0) {
    if (!job.forward_only || job.global_batch != 1 || job.micro_batches > 1 ||
        job.generate_positions < job.seq_len || job.logit_rows < 1 ||
        job.logit_rows > job.seq_len) {
      return Status::InvalidArgument(
          "a generation plan is forward only, of one sequence in one micro-batch, with a KV cache "
          "of at least seq_len tokens and 1 to seq_len logit rows");
    }
    if (job.compute_dtype != DType::kF32) {
      return Status::InvalidArgument(
          "generation computes in f32 (decode attention keeps its KV cache in f32)");
    }
  }
  // f32 only for CPU devices (they compute in f32 today; engine/exec runs such plans).
  if (job.compute_dtype == DType::kF32 && job.scratch.cuda) {
    return Status::InvalidArgument("compute dtype must be bf16 or fp16 (f32: CPU devices only)");
  }
  if (job.fp16_accumulate) {
    if (job.compute_dtype != DType::kF16 || !job.scratch.cuda) {
      return Status::InvalidArgument(
          "fp16acc (fp16 GEMMs with fp16 accumulation) is a GPU mode of fp16 compute");
    }
    if (!(hw.gpu.fp16_fp16acc_flops > 0)) {
      return Status::InvalidArgument("--dtype fp16acc: the hardware profile '" + hw.name +
                                     "' gives no fp16-accumulate rate (gpu.fp16_fp16acc_flops)");
    }
  }
  return Status::Ok();
}

// When `hw` has layer times but none that a plan of `job` looks up: a warning saying this plan
// prices its layers with the FLOP formulas, and how to use the times — plan with another
// --dtype when they were measured for this job in that dtype (`ferry probe --model` measures
// f32), else probe with this job's options. Empty when some time serves the job or there are none.
std::string UnusedLayerTimesWarning(const ModelConfig& model, const PlanJob& job,
                                    const HardwareProfile& hw) {
  if (hw.layer_times.empty()) return "";
  const auto measured_for = [&](const PlanJob& j) {
    const std::vector<LayerTimeQuery> queries = LayerTimeQueries(model, j, hw.gpu.count);
    return std::any_of(queries.begin(), queries.end(),
                       [&](const LayerTimeQuery& q) { return hw.FindLayerTime(q.key) != nullptr; });
  };
  if (measured_for(job)) return "";
  const std::string dtype = ComputeModeName(job);
  std::vector<std::string> others;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    PlanJob other = job;
    other.compute_dtype = t;
    other.fp16_accumulate = false;
    if (ComputeModeName(other) != dtype && measured_for(other)) others.emplace_back(DTypeName(t));
  }
  if (others.empty()) {
    return "none of the hardware profile's " + std::to_string(hw.layer_times.size()) +
           " measured layer times is for this job (the model, micro-batch shape, dtype or "
           "LoRA differ): this plan uses the FLOP formulas; run `ferry probe --model` with this "
           "plan's job options to measure them";
  }
  std::string list = others.front();
  for (size_t i = 1; i < others.size(); ++i) list += ", " + others[i];
  return "the hardware profile has measured layer times for this job in " + list +
         " only: this plan (" + dtype + ") uses the FLOP formulas; plan with --dtype " +
         others.front() + " to use them";
}

}  // namespace

StreamedBaseSource StreamedBaseSourceOf(const ModelConfig& model, const PlanJob& job) {
  return {.from_files = job.frozen_base_from_files,
          .files = model.weights_dtype,
          .upload = job.compute_dtype,
          .file_layout = job.base_file_layout};
}

double StreamedBaseBytes(const std::vector<LayerSpec>& layers, const StreamedBaseSource& source,
                         const std::vector<LayerRange>& stages, int gpus, int tail_parts) {
  auto base_of = [&](LayerRange r) {
    double bytes = 0;
    for (int i = r.first; i < r.last; ++i) bytes += LayerBaseBytes(layers[size_t(i)], source);
    return bytes;
  };
  const int S = int(stages.size()), head = int(layers.size()) - 1;
  const std::vector<int> ranges = StepStageRanges(S, tail_parts);
  const std::vector<bool> resident = ResidentBases(ranges, gpus);
  double bytes = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (resident[i]) continue;
    bytes += base_of(ranges[i] < S ? stages[size_t(ranges[i])] : LayerRange{head, head + 1});
  }
  return bytes;
}

double LayerBaseBytes(const LayerSpec& layer, const StreamedBaseSource& source) {
  if (layer.kind == LayerKind::kEmbedding) return 0;  // gathered on the host, never streamed
  double bytes = 0;
  for (const ParamSpec& p : layer.params) {
    if (!p.trainable) bytes += double(source.DriveBytes(p));
  }
  return bytes;
}

bool CanStreamBase(const PlanJob& job) { return job.lora.enabled() && !job.forward_only; }

MemoryPlanInput MemoryInputOf(const ModelConfig& model, const Plan& plan) {
  MemoryPlanInput in;
  in.model = model;
  in.lora = plan.job.lora;
  in.micro_batch = MicroBatchShape(plan.job, plan.micro_batch_size);
  in.micro_batches = plan.micro_batches;
  in.gpus = plan.gpus;
  in.compute_dtype = plan.job.compute_dtype;
  in.stages = plan.stages;
  in.tail_parts = plan.tail_parts;
  in.grad_accumulators = plan.grad_accumulators;
  in.recompute = plan.recompute;
  in.activations_on_nvme = plan.activations == Tier::kNvme;
  in.keep_activations = plan.keep_activations;
  in.optimizer_on_nvme = plan.optimizer_state == Tier::kNvme;
  in.frozen_weights_on_nvme = plan.frozen_weights == Tier::kNvme;
  in.scratch = plan.job.scratch;
  in.frozen_base_from_files = plan.job.frozen_base_from_files;
  in.forward_only = plan.job.forward_only;
  in.generate_positions = plan.job.generate_positions;
  in.logit_rows = plan.job.logit_rows;
  in.data_bytes = plan.job.data_host_bytes;
  return in;
}

BatchShape MicroBatchShape(const PlanJob& job, int64_t micro_batch_size) {
  BatchShape s{micro_batch_size, job.seq_len};
  if (micro_batch_size >= 1 && size_t(micro_batch_size) <= job.documents_in_rows.size()) {
    s.max_documents = job.documents_in_rows[size_t(micro_batch_size) - 1];
  }
  return s;
}

std::string ComputeModeName(const PlanJob& job) {
  return job.fp16_accumulate ? std::string(kFp16AccumulateName)
                             : std::string(DTypeName(job.compute_dtype));
}

std::string LayerTimeKey(const ModelConfig& model, const PlanJob& job, const LayerSpec& layer,
                         BatchShape micro) {
  const char* kind = layer.kind == LayerKind::kBlock  ? "block"
                     : layer.kind == LayerKind::kHead ? "head"
                                                      : "embedding";
  std::string key = std::string(kind) + " " + std::string(ModelFamilyName(model.family));
  for (auto [name, v] : {std::pair{"C", model.hidden_size}, std::pair{"I", model.intermediate_size},
                         std::pair{"H", model.num_heads}, std::pair{"KV", model.num_kv_heads},
                         std::pair{"D", model.head_dim}, std::pair{"V", model.vocab_size},
                         std::pair{"B", micro.batch}, std::pair{"T", micro.seq_len}}) {
    key += " " + std::string(name) + "=" + std::to_string(v);
  }
  if (layer.kind == LayerKind::kBlock) {
    if (model.qk_norm) key += " qknorm";
    std::string bias;
    if (model.qkv_bias) bias += ",qkv";
    if (model.o_bias) bias += ",o";
    if (model.mlp_bias) bias += ",mlp";
    if (!bias.empty()) key += " bias=" + bias.substr(1);
    if (model.sliding_window > 0 && model.sliding_window < micro.seq_len) {
      key += " window=" + std::to_string(model.sliding_window);
    }
    // Only the blocks' projections are quantized; the dequantize runs in the layer's time.
    if (job.lora.quantize == BaseQuant::kNf4) key += " nf4";
  }
  key += " " + ComputeModeName(job);
  key += job.lora.enabled() ? " lora r=" + std::to_string(job.lora.rank) + " " +
                                  LoraTargetsToString(job.lora.targets)
                            : std::string(" full");
  return key;
}

std::vector<LayerTimeQuery> LayerTimeQueries(const ModelConfig& model, const PlanJob& job,
                                             int gpus) {
  const std::vector<LayerSpec> layers = BuildLayerSpecs(model, job.lora, job.compute_dtype);
  std::vector<LayerTimeQuery> out;
  for (int64_t m : MicroBatchCandidates(job, gpus)) {
    const BatchShape micro = MicroBatchShape(job, job.global_batch / m);
    for (size_t i = 0; i < layers.size(); ++i) {
      std::string key = LayerTimeKey(model, job, layers[i], micro);
      auto same = [&](const LayerTimeQuery& q) { return q.key == key; };
      if (std::none_of(out.begin(), out.end(), same)) {
        out.push_back({std::move(key), int(i), micro});
      }
    }
  }
  return out;
}

std::string_view Plan::LayerTimeSource() const {
  const auto measured = std::count(measured_times.begin(), measured_times.end(), true);
  if (measured == 0) return "formulas";
  return size_t(measured) == measured_times.size() ? "measured" : "mixed";
}

Result<PlanOutcome> MakePlan(const std::string& model_name, const ModelConfig& model,
                             const PlanJob& job, const HardwareProfile& hw, bool suggest,
                             bool explain) {
  FERRY_RETURN_IF_ERROR(ValidateInputs(model, job, hw));
  Context c{model, job, hw, BuildLayerSpecs(model, job.lora, job.compute_dtype)};
  const int gpus = hw.gpu.count;
  const int blocks = int(model.num_layers);
  const std::vector<Tier> tiers =
      hw.HasNvme() ? std::vector<Tier>{Tier::kHost, Tier::kNvme} : std::vector<Tier>{Tier::kHost};
  const std::vector<Tier> host_only{Tier::kHost};
  const std::vector<Tier>& frozen_tiers =
      !job.host_frozen_weights && CanStreamBase(job) ? tiers : host_only;

  // Every (activations, optimizer state, frozen base) placement a candidate is weighed with.
  struct Tiers {
    Tier act, opt, frozen;
  };
  std::vector<Tiers> placements;
  for (Tier act : tiers) {
    for (Tier opt : tiers) {
      for (Tier frozen : frozen_tiers) placements.push_back({act, opt, frozen});
    }
  }

  PlanOutcome outcome;
  bool have = false;
  Plan best;
  PlanCandidate best_candidate;
  std::optional<size_t> closest;  // the misfit nearest to fitting, in outcome.candidates
  Fit closest_fit;
  // Weighs candidate `k` (its tiers set): records it and, when it fits (or when explaining: what
  // more memory would buy), simulates it, once per base held or streamed and accumulator count
  // (`timing_of`), and keeps it when it beats the best so far. `n`: the layers' numbers at its
  // micro-batch size.
  auto weigh = [&](const Candidate& k, const std::vector<LayerNumbers>& n,
                   std::optional<Timing>(&timing_of)[2][2]) -> Status {
    const MemoryEstimate mem = MemoryOf(c, k, gpus);
    const Fit fit = FitOf(mem, hw);
    const bool fits = fit.worst() <= 1.0;
    const std::array<uint64_t, 3> tier_bytes{
        mem.gpu.total(), mem.pinned_host.total() + mem.pageable_host.total(), mem.nvme.total()};
    PlanCandidate& record = outcome.candidates.emplace_back(
        PlanCandidate{.micro_batches = int(k.micro_batches),
                      .stages = int(k.stages.size()),
                      .tail_parts = k.tail_parts,
                      .grad_accumulators = k.grad_accumulators,
                      .policy = k.policy,
                      .recomputed = int(std::count(k.recompute.begin(), k.recompute.end(), true)),
                      .activations = k.activations,
                      .optimizer = k.optimizer,
                      .frozen = k.frozen,
                      .fits = fits,
                      .need_ratio = fit.worst(),
                      .tightest = fit.tightest(),
                      .tightest_bytes = tier_bytes[size_t(fit.tightest_tier())],
                      .gpu_bytes = tier_bytes[0],
                      .host_bytes = tier_bytes[1],
                      .nvme_bytes = tier_bytes[2]});
    if (!fits) {
      if (!closest || fit.worst() < outcome.candidates[*closest].need_ratio) {
        closest = outcome.candidates.size() - 1;
        closest_fit = fit;
      }
      if (!explain) return Status::Ok();
    }
    std::optional<Timing>& timing = timing_of[k.frozen == Tier::kNvme][k.grad_accumulators - 1];
    if (!timing) {
      Result<Timing> t = SimulateJob(BuildJob(n, k, gpus, LoraStep(c.job)), hw);
      if (!t.ok()) {
        if (fits) return t.status();
        return Status::Ok();  // it could not run anyway: left unsimulated (step_s 0)
      }
      timing = *t;
    }
    Plan p = PlanOf(k);
    p.memory = mem;
    for (const LayerNumbers& l : n) p.measured_times.push_back(l.measured);
    p.job = job;
    p.gpus = gpus;
    NvmeTraffic(c, mem, p);
    ApplyTiming(*timing, hw, p);
    record.step_s = p.step_s;
    record.bubble_fraction = p.bubble_fraction;
    record.nvme_read_bytes = p.nvme_read_bytes;
    if (fits && (!have || Preferred(record, best_candidate))) {
      have = true;
      best_candidate = record;
      best = std::move(p);
    }
    return Status::Ok();
  };
  for (int64_t m : MicroBatchCandidates(job, gpus)) {
    const BatchShape micro = MicroBatchShape(job, job.global_batch / m);
    const std::vector<LayerNumbers> n = NumbersFor(c, micro);
    for (int stage_count : StageCountCandidates(blocks)) {
      if (job.max_stages > 0 && stage_count > job.max_stages) continue;
      const std::vector<LayerRange> stages = Partition(n, blocks, stage_count);
      std::vector<std::vector<bool>> seen;
      // "keep": the devices keep every saved activation (only stage boundaries cross the host;
      // training only).
      for (const char* policy : {"keep", "save", "per-layer", "recompute"}) {
        const bool keep = std::string_view(policy) == "keep";
        // Kept activations stay where their backward stage runs on one or two devices only
        // (memory_model.h).
        if (keep && (gpus > 2 || job.forward_only)) continue;
        Candidate k{stages, m, policy, RecomputePolicy(policy, n, hw)};
        k.keep = keep;
        if (!keep && std::find(seen.begin(), seen.end(), k.recompute) != seen.end()) continue;
        if (!keep) seen.push_back(k.recompute);
        // Kept activations need each backward stage on its forward stage's device: one part
        // (and generation, one micro-batch, has one).
        const int64_t asked = job.max_tail_parts > 0 ? job.max_tail_parts : m;
        const int most_parts = keep ? 1 : int(std::clamp<int64_t>(std::min(asked, m), 1, gpus));
        for (int parts = 1; parts <= most_parts; ++parts) {
          k.tail_parts = parts;
          // Simulated once per base held or streamed and gradient accumulators per device.
          std::optional<Timing> timing_of[2][2];
          for (int accumulators = 1; accumulators <= (job.forward_only ? 1 : 2); ++accumulators) {
            k.grad_accumulators = accumulators;
            for (const Tiers& t : placements) {
              if (keep && t.act != Tier::kHost) continue;
              k.activations = t.act;
              k.optimizer = t.opt;
              k.frozen = t.frozen;
              FERRY_RETURN_IF_ERROR(weigh(k, n, timing_of));
            }
          }
        }
      }
    }
  }
  if (!have) {
    outcome.plan.job = job;  // what the candidates were weighed for (ExplainCandidates)
    if (!closest) return Status::Internal("the planner weighed no candidate");
    const PlanCandidate nearest = outcome.candidates[*closest];
    outcome.binding =
        std::string(closest_fit.tightest()) + " is short: the plan closest to fitting needs " +
        FormatByteSize(nearest.gpu_bytes) + " per GPU (usable " +
        FormatByteSize(hw.gpu.memory_usable_bytes) + "), " + FormatByteSize(nearest.host_bytes) +
        " of host RAM (usable " + FormatByteSize(hw.host.ram_usable_bytes) + "), " +
        FormatByteSize(nearest.nvme_bytes) + " of NVMe (" +
        (hw.HasNvme() ? FormatByteSize(hw.nvme.space_bytes) : "no --nvme-dir") + ")";
    if (suggest) outcome.suggestions = SuggestChanges(model_name, model, job, hw);
    return outcome;
  }
  best.model_name = model_name;
  best.hardware_name = hw.name;
  best.gpus = gpus;
  best.micro_batch_size = job.global_batch / best.micro_batches;
  best.gpu_budget = hw.gpu.memory_usable_bytes;
  best.host_budget = hw.host.ram_usable_bytes;
  best.nvme_budget = hw.HasNvme() ? hw.nvme.space_bytes : 0;
  best.tokens_per_s = double(job.global_batch * job.seq_len) / best.step_s;
  if (best.optimizer_state == Tier::kNvme || best.activations == Tier::kNvme) {
    const double per_day = best.nvme_write_bytes / best.step_s * 86400.0;
    std::string w = "NVMe: " + FormatByteSize(uint64_t(best.nvme_write_bytes)) +
                    " of hot data written per step (" + FormatByteSize(uint64_t(per_day)) +
                    " per day of training)";
    if (hw.nvme.endurance_bytes_written > 0) {
      w += "; the drive's rated endurance lasts " +
           std::to_string(int64_t(double(hw.nvme.endurance_bytes_written) / per_day)) + " days";
    }
    best.warnings.push_back(w);
  }
  if (std::string w = UnusedLayerTimesWarning(model, job, hw); !w.empty()) {
    best.warnings.push_back(std::move(w));
  }
  outcome.feasible = true;
  outcome.plan = std::move(best);
  return outcome;
}

bool Preferred(const PlanCandidate& a, const PlanCandidate& b) {
  auto key = [](const PlanCandidate& k) {
    return std::tuple{k.step_s,     k.frozen == Tier::kNvme,
                      k.nvme_bytes, k.nvme_read_bytes,
                      k.host_bytes, k.gpu_bytes};
  };
  return key(a) < key(b);
}

RoundRobinJob RoundRobinJobOf(const ModelConfig& model, const Plan& plan,
                              const HardwareProfile& hw) {
  Context c{model, plan.job, hw, BuildLayerSpecs(model, plan.job.lora, plan.job.compute_dtype)};
  const std::vector<LayerNumbers> n =
      NumbersFor(c, MicroBatchShape(plan.job, plan.micro_batch_size));
  return BuildJob(n, CandidateOf(plan), plan.gpus, LoraStep(plan.job));
}

Status PricePlan(const ModelConfig& model, const HardwareProfile& hw, Plan& plan) {
  FERRY_RETURN_IF_ERROR(ValidateInputs(model, plan.job, hw));
  if (hw.gpu.count != plan.gpus) {
    return Status::InvalidArgument("the plan runs on " + std::to_string(plan.gpus) +
                                   (plan.gpus == 1 ? " device" : " devices") + ", the profile '" +
                                   hw.name + "' has " + std::to_string(hw.gpu.count));
  }
  Context c{model, plan.job, hw, BuildLayerSpecs(model, plan.job.lora, plan.job.compute_dtype)};
  const std::vector<LayerNumbers> n =
      NumbersFor(c, MicroBatchShape(plan.job, plan.micro_batch_size));
  if (n.size() != plan.recompute.size()) {
    return Status::InvalidArgument("the plan has " + std::to_string(plan.recompute.size()) +
                                   " layers, the model " + std::to_string(n.size()));
  }
  FERRY_ASSIGN_OR_RETURN(
      const Timing t,
      SimulateJob(BuildJob(n, CandidateOf(plan), plan.gpus, LoraStep(plan.job)), hw));
  ApplyTiming(t, hw, plan);
  plan.measured_times.clear();
  for (const LayerNumbers& l : n) plan.measured_times.push_back(l.measured);
  plan.tokens_per_s = double(plan.job.global_batch * plan.job.seq_len) / plan.step_s;
  plan.hardware_name = hw.name;
  return Status::Ok();
}

std::vector<StageCost> BaselineStagesOf(const ModelConfig& model, const PlanJob& job,
                                        int micro_batches, const HardwareProfile& hw) {
  Context c{model, job, hw, BuildLayerSpecs(model, job.lora, job.compute_dtype)};
  const std::vector<LayerNumbers> n =
      NumbersFor(c, {job.global_batch / micro_batches, job.seq_len});
  const int gpus = hw.gpu.count;
  const int blocks = int(model.num_layers);
  std::vector<LayerRange> ranges = Partition(n, blocks, std::min(gpus, blocks));
  ranges.back().last += 1;  // the head joins the last stage
  std::vector<StageCost> out;
  // AdamW on the GPU is memory-bound: 30 bytes of traffic per parameter
  // (simulator.h).
  for (const LayerRange& s : ranges) {
    StageCost sc;
    for (int i = s.first; i < s.last; ++i) {
      sc.fwd_s += n[size_t(i)].fwd_s;
      sc.bwd_s += n[size_t(i)].bwd_s;
      sc.weight_bytes += n[size_t(i)].weights;
      sc.param_count += n[size_t(i)].trainable;
    }
    sc.output_bytes = n[size_t(s.last - 1)].output;
    sc.gpu_optimizer_s = sc.param_count * kAdamWBytesPerParameter / hw.gpu.memory_bandwidth;
    out.push_back(sc);
  }
  return out;
}

uint64_t BaselineGpuBytes(const ModelConfig& model, const PlanJob& job, int micro_batches,
                          int gpus) {
  const std::vector<LayerSpec> layers = BuildLayerSpecs(model, job.lora, job.compute_dtype);
  const BatchShape micro = MicroBatchShape(job, job.global_batch / micro_batches);
  double weights = 0, trainable = 0, saved = 0;
  for (const LayerSpec& l : layers) {
    if (l.kind == LayerKind::kEmbedding) continue;
    for (const ParamSpec& p : l.params) {
      weights +=
          p.nf4 ? double(p.bytes()) : double(p.numel()) * double(DTypeSize(job.compute_dtype));
      if (p.trainable) trainable += double(p.numel());
    }
    const LayerCost cost = ComputeLayerCost(model, job.lora, l, micro, job.compute_dtype);
    saved += double(cost.input_bytes + cost.saved_bytes);
  }
  const double in_flight = std::min(gpus, micro_batches);  // 1F1B: GPU 0 holds p micro-batches
  const double bytes = (weights + trainable * 16.0 + saved * in_flight) / double(gpus);
  return uint64_t(std::ceil(bytes));
}

}  // namespace ferry::plan
