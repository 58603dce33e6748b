#include "engine/train/layer_probe.h"

#include <gtest/gtest.h>

#include <set>
#include <string_view>

#include "engine/testing/tiny_models.h"
#include "engine/train/training_runner.h"
#include "kernels/cpu/cpu_device.h"

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
  EXPECT_EQ(devices.made, 2);    // the embedding runs on the host
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

// A layer that does not fit the memory the probe may use is refused before anything runs, with
// the layer and the bytes it needs in the message.
TEST(LayerProbe, RefusesALayerThatDoesNotFit) {
  const ModelConfig m = Tiny("llama");
  LayerProbeOptions o = Quick();
  o.host_memory_bytes = uint64_t(1) << 20;  // 1 MiB: the device arena alone takes more
  Devices devices;
  Result<std::vector<LayerProbeEntry>> times =
      ProbeLayerTimes(m, CpuJob(2, 16, 1), 1, devices.factory(), o);
  ASSERT_FALSE(times.ok());
  EXPECT_EQ(times.status().code(), StatusCode::kOutOfMemory);
  const std::string msg = times.status().message();
  EXPECT_NE(msg.find("block.0 at 2 x 16 tokens needs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1.00 MiB (1048576 bytes) available"), std::string::npos) << msg;
  EXPECT_EQ(devices.made, 0);
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
