#include "engine/probe/layer_probe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <string_view>

#include "engine/exec/pipeline_executor.h"
#include "engine/exec/trace_recorder.h"
#include "engine/model/master_weights.h"
#include "engine/testing/tiny_models.h"
#include "engine/train/training_runner.h"
#include "kernels/arena.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/virtual_clock.h"

namespace ferry {
namespace {

using testing::kTinyModels;
using testing::TinyModel;

// The tiny config of that name (engine/testing/tiny_models.h: llama, llama3, mistral, qwen2,
// qwen3, gpt2), with `layers` blocks.
ModelConfig Tiny(std::string_view name, int layers = 2) {
  for (const TinyModel& m : kTinyModels) {
    if (m.name != name) continue;
    Result<ModelConfig> c = ParseHfConfig(m.config_json);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    c->num_layers = layers;
    return *c;
  }
  ADD_FAILURE() << "no tiny model " << name;
  return {};
}

plan::PlanJob CpuJob(int64_t batch, int64_t seq, int64_t micro_batches) {
  plan::PlanJob job;
  job.global_batch = batch;
  job.seq_len = seq;
  job.micro_batches = micro_batches;
  job.compute_dtype = DType::kF32;
  job.scratch = {.cuda = false, .cpu_threads = 1};
  return job;
}

// A CPU device per layer, counting how many were made.
struct Devices {
  int made = 0;
  ProbeDeviceFactory factory() {
    return [this](size_t bytes) -> Result<std::unique_ptr<Device>> {
      ++made;
      FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> d,
                             CpuDevice::Create({.name = "probe", .memory_bytes = bytes}));
      return std::unique_ptr<Device>(std::move(d));
    };
  }
};

LayerProbeOptions Quick() {
  LayerProbeOptions o;
  o.warmup = 0;
  o.repeats = 1;
  return o;
}

std::set<std::string> Keys(const std::vector<LayerProbeEntry>& entries) {
  std::set<std::string> keys;
  for (const LayerProbeEntry& e : entries) keys.insert(e.time.key);
  return keys;
}

// One entry per key the planner looks up for the job (embedding, the one block shape, head at the
// one micro-batch size), every time measured; a plan made with the profile says its layer times
// are measured, and its stage and tail times are the sums of the probed entries.
TEST(LayerProbe, WritesTheKeysThePlannerUsesAndThePlanUsesThem) {
  const ModelConfig m = Tiny("llama", 3);
  const plan::PlanJob job = CpuJob(4, 16, 2);
  Devices devices;
  Result<std::vector<LayerProbeEntry>> times =
      ProbeLayerTimes(m, job, 1, devices.factory(), Quick());
  ASSERT_TRUE(times.ok()) << times.status().ToString();
  ASSERT_EQ(times->size(), 3u);  // embedding, block (all three alike), head
  EXPECT_EQ(devices.made, 1);    // one executor run for the one micro-batch shape
  std::set<std::string> want;
  for (const plan::LayerTimeQuery& q : plan::LayerTimeQueries(m, job, 1)) want.insert(q.key);
  EXPECT_EQ(Keys(*times), want);
  for (const LayerProbeEntry& e : *times) {
    EXPECT_EQ(e.micro.batch, 2);
    EXPECT_EQ(e.micro.seq_len, 16);
    EXPECT_GT(e.time.forward_s, 0) << e.layer;
    // The head's backward is the fused pass minus the loss-only pass: 0 when noise makes the
    // difference negative on a layer this small.
    EXPECT_GE(e.time.backward_s, 0) << e.layer;
  }

  plan::HardwareProfile hw = CpuDevicesProfile(1, uint64_t(1) << 30);
  hw.layer_times.push_back({"some other layer", 100.0, 100.0});
  MergeLayerTimes(*times, hw);
  MergeLayerTimes(*times, hw);  // same keys: replaced, not duplicated
  ASSERT_EQ(hw.layer_times.size(), 4u);
  Result<plan::PlanOutcome> outcome = plan::MakePlan("tiny", m, job, hw, false);
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  ASSERT_TRUE(outcome->feasible) << outcome->binding;
  const plan::Plan& p = outcome->plan;
  EXPECT_EQ(p.LayerTimeSource(), "measured");
  EXPECT_NE(plan::PlanSummary(p).find("layer times: measured (all 5 layers measured"),
            std::string::npos)
      << plan::PlanSummary(p);

  auto entry = [&](const char* name) {
    for (const LayerProbeEntry& e : *times) {
      if (e.layer.rfind(name, 0) == 0) return e.time;
    }
    return plan::MeasuredLayerTime{};
  };
  const plan::MeasuredLayerTime block = entry("block."), head = entry("head");
  const plan::RoundRobinJob rr = plan::RoundRobinJobOf(m, p, hw);
  ASSERT_EQ(rr.forward.size(), p.stages.size());
  // Sums of the same doubles in the planner's order: exact.
  for (size_t s = 0; s < p.stages.size(); ++s) {
    double fwd = 0, bwd = 0;
    for (int li = p.stages[s].first; li < p.stages[s].last; ++li) {
      fwd += block.forward_s;
    }
    const plan::LayerRange back = p.stages[p.stages.size() - 1 - s];
    for (int li = back.first; li < back.last; ++li) {
      bwd += block.backward_s + (p.recompute[size_t(li)] ? block.forward_s : 0.0);
    }
    EXPECT_EQ(rr.forward[s].fwd_s, fwd) << "stage " << s;
    EXPECT_EQ(rr.backward[s].bwd_s, bwd) << "stage " << s;
  }
  EXPECT_EQ(rr.tail.fwd_s, head.forward_s);
  EXPECT_EQ(rr.tail.bwd_s, head.backward_s);

  // Without the profile's times the same job is priced by the formulas.
  hw.layer_times.clear();
  Result<plan::PlanOutcome> formulas = plan::MakePlan("tiny", m, job, hw, false);
  ASSERT_TRUE(formulas.ok() && formulas->feasible);
  EXPECT_EQ(formulas->plan.LayerTimeSource(), "formulas");
}

// `ferry train`'s re-pricing on CPU devices: the plan made at nominal rates keeps its choices and
// is priced on the layer times, copy rates, host bandwidth and AdamW rate measured here.
TEST(LayerProbe, PriceOnCpuDevicesMeasuresEveryLayerAndKeepsThePlansChoices) {
  const ModelConfig m = Tiny("llama", 3);
  const plan::PlanJob job = CpuJob(4, 16, 2);
  for (int devices : {1, 2}) {
    const plan::HardwareProfile nominal = CpuDevicesProfile(devices, uint64_t(1) << 30);
    Result<plan::PlanOutcome> made = plan::MakePlan("tiny", m, job, nominal, false);
    ASSERT_TRUE(made.ok() && made->feasible) << made.status().ToString();
    plan::Plan p = made->plan;
    ASSERT_EQ(p.LayerTimeSource(), "formulas");
    // One thread per device: the layers on one thread each, the host's rates on all of them.
    Result<std::string> line = PriceOnCpuDevices(m, nominal, devices, p);
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    EXPECT_NE(line->find("3 layer times on 1 thread,"), std::string::npos) << *line;
    EXPECT_NE(line->find(devices == 1 ? "G params/s on 1 thread" : "G params/s on 2 threads"),
              std::string::npos)
        << *line;
    EXPECT_EQ(p.LayerTimeSource(), "measured");
    EXPECT_EQ(p.hardware_name, "cpu-devices, rates measured here");
    EXPECT_GT(p.step_s, 0);
    EXPECT_NE(p.step_s, made->plan.step_s);
    EXPECT_EQ(p.stages, made->plan.stages);
    EXPECT_EQ(p.recompute, made->plan.recompute);
    EXPECT_EQ(p.activation_policy, made->plan.activation_policy);
    EXPECT_EQ(p.memory.gpu.total(), made->plan.memory.gpu.total());
  }
  plan::Plan p =
      plan::MakePlan("tiny", m, job, CpuDevicesProfile(1, uint64_t(1) << 30), false)->plan;
  const double before = p.step_s;
  const Result<std::string> none =
      PriceOnCpuDevices(m, CpuDevicesProfile(1, uint64_t(1) << 30), 0, p);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.step_s, before);
}

// With automatic micro-batches the planner tries several micro-batch sizes: each gets its keys.
TEST(LayerProbe, ProbesEveryMicroBatchSizeThePlannerTries) {
  const ModelConfig m = Tiny("llama");
  const plan::PlanJob job = CpuJob(4, 8, 0);  // 1 GPU: 2 or 4 micro-batches of 2 or 1 rows
  Devices devices;
  Result<std::vector<LayerProbeEntry>> times =
      ProbeLayerTimes(m, job, 1, devices.factory(), Quick());
  ASSERT_TRUE(times.ok()) << times.status().ToString();
  EXPECT_EQ(times->size(), 6u);
  std::set<int64_t> rows;
  for (const LayerProbeEntry& e : *times) rows.insert(e.micro.batch);
  EXPECT_EQ(rows, (std::set<int64_t>{1, 2}));
  plan::HardwareProfile hw = CpuDevicesProfile(1, uint64_t(1) << 30);
  MergeLayerTimes(*times, hw);
  Result<plan::PlanOutcome> outcome = plan::MakePlan("tiny", m, job, hw, false);
  ASSERT_TRUE(outcome.ok() && outcome->feasible);
  EXPECT_EQ(outcome->plan.LayerTimeSource(), "measured");
}

// Every architecture's layers run through the probe, and what changes a block's time beyond its
// sizes gets keys of its own: Qwen3's q/k norms, Qwen2's q/k/v biases, Mistral's sliding window
// shorter than the sequence — each key is the plain Llama block's (same sizes) plus that part.
TEST(LayerProbe, EveryArchitectureAndItsBlockQuirksGetKeysOfTheirOwn) {
  const plan::PlanJob job = CpuJob(2, 8, 1);
  int quirks = 0;
  for (const TinyModel& tiny : kTinyModels) {
    SCOPED_TRACE(tiny.name);
    const ModelConfig m = Tiny(tiny.name, 1);
    Devices devices;
    Result<std::vector<LayerProbeEntry>> times =
        ProbeLayerTimes(m, job, 1, devices.factory(), Quick());
    ASSERT_TRUE(times.ok()) << times.status().ToString();
    EXPECT_EQ(times->size(), 3u);
    std::string key;
    for (const LayerProbeEntry& e : *times) {
      if (e.layer == "block.0") key = e.time.key;
    }
    ModelConfig plain = m;  // the same sizes without the quirk
    std::string part;
    if (m.qk_norm) {
      plain.qk_norm = false;
      part = " qknorm";
    } else if (m.qkv_bias && m.family == ModelFamily::kLlama) {  // GPT-2: biases everywhere
      plain.qkv_bias = false;
      part = " bias=qkv";
    } else if (m.sliding_window > 0) {
      plain.sliding_window = 0;
      part = " window=3";
    }
    const LayerSpec block = BuildLayerSpecs(plain, job.lora, job.compute_dtype)[1];
    const std::string plain_key = plan::LayerTimeKey(plain, job, block, {2, 8});
    if (part.empty()) {
      EXPECT_EQ(key, plain_key);
      continue;
    }
    ++quirks;
    ASSERT_NE(key.find(part), std::string::npos) << key;
    EXPECT_EQ(std::string(key).erase(key.find(part), part.size()), plain_key) << key;
  }
  EXPECT_EQ(quirks, 3);  // qwen3, qwen2, mistral
  // A window no shorter than the sequence computes as full causal attention: no part in the key.
  ModelConfig mistral = Tiny("mistral", 1);
  const LayerSpec block = BuildLayerSpecs(mistral, job.lora, job.compute_dtype)[1];
  mistral.sliding_window = 8;
  const std::string at_length = plan::LayerTimeKey(mistral, job, block, {2, 8});
  mistral.sliding_window = 0;
  EXPECT_EQ(at_length, plan::LayerTimeKey(mistral, job, block, {2, 8}));
}

// Virtual kernel seconds (kernels/cpu/virtual_clock.h): the probe's times become a function of
// the kernels it times.
double KernelSeconds(std::string_view, const KernelWork& w) {
  return 1e-6 + w.flops / 1e10 + w.bytes / 1e10;
}

// The durations of the spans of `kind` on the compute lane in trace step `step`, in start order.
std::vector<double> ComputeSpans(const std::vector<exec::TraceSpan>& spans, int64_t step,
                                 plan::TaskKind kind) {
  std::vector<std::pair<double, double>> found;  // start, duration
  for (const exec::TraceSpan& s : spans) {
    if (s.step == step && s.lane.kind == plan::LaneKind::kCompute && s.kind == kind) {
      found.push_back({s.start_s, s.end_s - s.start_s});
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<double> out;
  for (const auto& f : found) out.push_back(f.second);
  return out;
}

// The probe measures what the executor runs, layer by layer: on a virtual clock, a block's
// probed forward and backward equal each block's spans in a two-block model's training step, the
// head's loss-only pass equals its evaluation's tail and forward + backward its step's fused tail;
// the gradient zeroing a stage's first compute span holds is not counted. The probe's device is
// sized by its plan's GPU map.
TEST(LayerProbe, TimesAreTheExecutorsOwnSpansOfEachLayer) {
  const ModelConfig m = Tiny("llama", 2);
  const plan::PlanJob job = CpuJob(2, 16, 1);
  const LayerProbeOptions o = Quick();
  VirtualClock probe_clock(&KernelSeconds);
  std::vector<size_t> arenas;
  const ProbeDeviceFactory factory = [&](size_t bytes) -> Result<std::unique_ptr<Device>> {
    arenas.push_back(bytes);
    FERRY_ASSIGN_OR_RETURN(
        std::unique_ptr<CpuDevice> d,
        CpuDevice::Create({.name = "probe", .memory_bytes = bytes, .virtual_clock = &probe_clock}));
    return std::unique_ptr<Device>(std::move(d));
  };
  Result<std::vector<LayerProbeEntry>> times = ProbeLayerTimes(m, job, 1, factory, o);
  ASSERT_TRUE(times.ok()) << times.status().ToString();
  const plan::Plan one = LayerProbePlan(m, job, {2, 16}, o);
  ASSERT_EQ(arenas, std::vector<size_t>{size_t(one.memory.gpu.total())});
  std::map<std::string, plan::MeasuredLayerTime> probed;
  for (const LayerProbeEntry& e : *times) {
    probed[e.layer] = e.time;
    EXPECT_EQ(e.bytes.device, one.memory.gpu.total()) << e.layer;
  }
  ASSERT_TRUE(probed.contains("block.0") && probed.contains("head"));

  // The reference: the two-block model as one stage on the same cost model, a step and an
  // evaluation traced.
  plan::Plan p = one;
  p.stages = {{1, 3}};
  p.recompute.assign(4, false);
  p.memory = plan::ComputeMemory(plan::MemoryInputOf(m, p));
  VirtualClock clock(&KernelSeconds);
  Result<std::unique_ptr<CpuDevice>> d = CpuDevice::Create(
      {.name = "ref", .memory_bytes = p.memory.gpu.total(), .virtual_clock = &clock});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  exec::TraceRecorder trace(p, 2);
  Result<std::unique_ptr<exec::PipelineExecutor>> e =
      exec::PipelineExecutor::Create({d->get()}, m, p, nullptr, &trace);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const std::vector<LayerSpec> layers = BuildLayerSpecs(m, job.lora, job.compute_dtype);
  const HostTensors weights = InitMasterWeights(layers, 7);
  HostTensors grads;
  for (const ParamSpec* ps : StorageParams(layers)) {
    grads.tensors[ps->name].resize(size_t(ps->numel()));
  }
  std::vector<int32_t> tokens(32);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = int32_t((7 * i + 3) % size_t(m.vocab_size));
  const MicroBatchInput mb{
      .tokens = tokens, .targets = tokens, .normalizer = 32, .overwrite_grads = true};
  ASSERT_TRUE((*e)->Step(weights, std::span(&mb, 1), grads).ok());
  ASSERT_TRUE((*e)->Evaluate(weights, std::span(&mb, 1)).ok());
  const std::vector<exec::TraceSpan> spans = trace.spans();

  auto near = [](double got, double want) { EXPECT_NEAR(got, want, 1e-9 * want); };
  const plan::MeasuredLayerTime& block = probed["block.0"];
  const plan::MeasuredLayerTime& head = probed["head"];
  const std::vector<double> forward = ComputeSpans(spans, 0, plan::TaskKind::kForward);
  ASSERT_EQ(forward.size(), 2u);  // block 0, block 1
  for (double f : forward) near(block.forward_s, f);
  const std::vector<double> backward = ComputeSpans(spans, 0, plan::TaskKind::kBackward);
  ASSERT_EQ(backward.size(), 3u);  // the gradient zeroing, block 1, block 0
  EXPECT_GT(backward[0], 0);
  near(block.backward_s, backward[1]);
  near(block.backward_s, backward[2]);
  const std::vector<double> tail = ComputeSpans(spans, 0, plan::TaskKind::kTail);
  ASSERT_EQ(tail.size(), 2u);  // the gradient zeroing, the fused pass
  near(head.forward_s + head.backward_s, tail[1]);
  const std::vector<double> loss_only = ComputeSpans(spans, 1, plan::TaskKind::kTail);
  ASSERT_EQ(loss_only.size(), 1u);
  near(head.forward_s, loss_only[0]);
  EXPECT_GT(head.backward_s, 0);
}

// The probe's executor runs isolated: on a virtual clock with a link model, the head's weights,
// which an ordinary step uploads while the block's forward computes, are up before it starts, so
// no weight copy overlaps a kernel span. Without isolation one does (the check can fail).
TEST(LayerProbe, NoWeightCopyRunsBesideAProbedKernel) {
  const ModelConfig m = Tiny("llama", 2);
  const plan::PlanJob job = CpuJob(2, 16, 1);
  const plan::Plan p = LayerProbePlan(m, job, {2, 16}, Quick());
  ModelConfig one = m;
  one.num_layers = 1;
  const std::vector<LayerSpec> layers = BuildLayerSpecs(one, job.lora, job.compute_dtype);
  const HostTensors weights = InitMasterWeights(layers, 7);
  std::vector<int32_t> tokens(32, 5);
  const MicroBatchInput mb{
      .tokens = tokens, .targets = tokens, .normalizer = 32, .overwrite_grads = true};
  for (const bool isolate : {true, false}) {
    SCOPED_TRACE(isolate ? "isolated" : "overlapped");
    VirtualClock clock(&KernelSeconds);
    Result<std::unique_ptr<CpuDevice>> d = CpuDevice::Create({.name = "probe",
                                                              .memory_bytes = p.memory.gpu.total(),
                                                              .upload_bytes_per_s = 1e8,
                                                              .download_bytes_per_s = 1e8,
                                                              .virtual_clock = &clock});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    exec::TraceRecorder trace(p, 1);
    Result<std::unique_ptr<exec::PipelineExecutor>> e = exec::PipelineExecutor::Create(
        {d->get()}, one, p, nullptr, &trace, nullptr, nullptr, isolate);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    HostTensors grads;
    for (const ParamSpec* ps : StorageParams(layers)) {
      grads.tensors[ps->name].resize(size_t(ps->numel()));
    }
    ASSERT_TRUE((*e)->Step(weights, std::span(&mb, 1), grads).ok());
    int overlaps = 0, copies = 0;
    const std::vector<exec::TraceSpan> spans = trace.spans();
    for (const exec::TraceSpan& w : spans) {
      if (w.kind != plan::TaskKind::kWeightUpload) continue;
      ++copies;
      for (const exec::TraceSpan& k : spans) {
        if (k.lane.kind == plan::LaneKind::kCompute && k.start_s < w.end_s && w.start_s < k.end_s) {
          ++overlaps;
        }
      }
    }
    EXPECT_EQ(copies, 2);  // the block's weights, then the head's
    if (isolate) {
      EXPECT_EQ(overlaps, 0);
    } else {
      EXPECT_GT(overlaps, 0);
    }
  }
}

// A run that does not fit the memory the probe may use is refused before anything runs, with the
// block, the micro-batch and the bytes its plan needs in the message: one byte short of the
// plan's host and device maps fails, exactly them runs.
TEST(LayerProbe, RefusesALayerThatDoesNotFit) {
  const ModelConfig m = Tiny("llama");
  LayerProbeOptions o = Quick();
  const LayerProbeBytes bytes = LayerProbeNeeds(LayerProbePlan(m, CpuJob(2, 16, 1), {2, 16}, o));
  const uint64_t need = bytes.host + bytes.device;
  EXPECT_GT(bytes.host, 0u);
  EXPECT_GT(bytes.device, 0u);
  o.host_memory_bytes = need - 1;
  Devices devices;
  Result<std::vector<LayerProbeEntry>> times =
      ProbeLayerTimes(m, CpuJob(2, 16, 1), 1, devices.factory(), o);
  ASSERT_FALSE(times.ok());
  EXPECT_EQ(times.status().code(), StatusCode::kOutOfMemory);
  const std::string msg = times.status().message();
  EXPECT_NE(msg.find("block.0 at 2 x 16 tokens needs " + FormatBytes(need)), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(FormatBytes(need - 1) + " available"), std::string::npos) << msg;
  EXPECT_EQ(devices.made, 0);
  o.host_memory_bytes = need;
  times = ProbeLayerTimes(m, CpuJob(2, 16, 1), 1, devices.factory(), o);
  ASSERT_TRUE(times.ok()) << times.status().ToString();
  EXPECT_EQ(devices.made, 1);
  // fp16 accumulation is a GEMM mode no device has yet: refused, naming what to probe instead.
  plan::PlanJob fp16acc = CpuJob(2, 16, 1);
  fp16acc.compute_dtype = DType::kF16;
  fp16acc.fp16_accumulate = true;
  Result<std::vector<LayerProbeEntry>> acc =
      ProbeLayerTimes(m, fp16acc, 1, devices.factory(), Quick());
  ASSERT_FALSE(acc.ok());
  EXPECT_NE(acc.status().message().find("--dtype f16"), std::string::npos);
}

// The layers run in the plan's storage dtype, as the executor's stages hold them (a bf16 plan is
// priced by bf16 layers, an NF4 base's blocks dequantize into it), keyed as the planner asks.
TEST(LayerProbe, ProbesInThePlansDtype) {
  const ModelConfig m = Tiny("llama", 2);
  for (const auto& [q, dtype] : {std::pair{BaseQuant::kNone, DType::kBF16},
                                 {BaseQuant::kNf4, DType::kBF16},
                                 {BaseQuant::kNf4, DType::kF16}}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)) + (q == BaseQuant::kNf4 ? " nf4" : " plain"));
    plan::PlanJob job = CpuJob(2, 16, 1);
    job.compute_dtype = dtype;
    job.lora = {.rank = 4, .quantize = q};
    Devices devices;
    Result<std::vector<LayerProbeEntry>> times =
        ProbeLayerTimes(m, job, 1, devices.factory(), Quick());
    ASSERT_TRUE(times.ok()) << times.status().ToString();
    std::set<std::string> want;
    for (const plan::LayerTimeQuery& query : plan::LayerTimeQueries(m, job, 1)) {
      want.insert(query.key);
    }
    EXPECT_EQ(Keys(*times), want);
    for (const LayerProbeEntry& e : *times) {
      EXPECT_NE(e.time.key.find(" " + std::string(DTypeName(dtype))), std::string::npos)
          << e.time.key;
      EXPECT_GT(e.time.forward_s, 0) << e.layer;
    }
  }
}

}  // namespace
}  // namespace ferry
