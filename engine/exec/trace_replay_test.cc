// The simulator against the executor (issue 17, "True"): the pipeline executor runs a step of the
// tiny model on CPU devices with throttled links (so copies cost about what compute does), its
// trace is replayed through the plan's round-robin schedule (engine/exec/trace_replay.h), for plans
// that differ in stage count, micro-batches, recomputation and device count. Asserted: every task
// of the schedule is in the trace (bar the optimizer's, not run here) and every span maps to a
// task. The replayed / recorded step ratio is printed and recorded, not asserted (see below).
//
// Tiers: every case keeps activations, optimizer state and weights in host RAM. NVMe tiers are not
// covered: the executor refuses a plan that puts a group on NVMe (pipeline_executor.cc, Validate).
// The CPU optimizer is not run (the Trainer's, not the executor's): its "U…" tasks are the only
// ones the replay may find missing.
#include "engine/exec/trace_replay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "engine/exec/pipeline_executor.h"
#include "engine/model/master_weights.h"
#include "engine/plan/memory_model.h"
#include "engine/plan/pipeline_schedules.h"
#include "engine/train/training_runner.h"
#include "kernels/cpu/cpu_device.h"

namespace ferry::exec {
namespace {

constexpr int kThreads = 1;        // per device: two devices already share the machine's cores
constexpr double kLinkRate = 5e8;  // bytes/s each way: a block's f32 weights take ~3.5 ms

struct Case {
  const char* name;
  std::vector<plan::LayerRange> stages;  // over the tiny model's blocks 1..4
  std::vector<int> recomputed;           // block layers recomputed in backward
  int micro_batches;
  int devices;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

plan::Plan MakePlan(const ModelConfig& model, const Case& c) {
  plan::Plan p;
  p.model_name = "tiny";
  p.gpus = c.devices;
  p.job.global_batch = 2 * c.micro_batches;
  p.job.seq_len = 32;
  p.job.micro_batches = c.micro_batches;
  p.job.compute_dtype = DType::kF32;
  p.job.scratch = {.cuda = false, .cpu_threads = kThreads};
  p.micro_batches = c.micro_batches;
  p.micro_batch_size = 2;
  p.stages = c.stages;
  p.recompute.assign(size_t(model.num_layers) + 2, false);
  for (int li : c.recomputed) p.recompute[size_t(li)] = true;
  p.activation_policy = c.recomputed.empty() ? "save" : "per-layer";
  plan::MemoryPlanInput in;
  in.model = model;
  in.micro_batch = {p.micro_batch_size, p.job.seq_len};
  in.micro_batches = c.micro_batches;
  in.gpus = c.devices;
  in.compute_dtype = p.job.compute_dtype;
  in.stages = p.stages;
  in.recompute = p.recompute;
  in.scratch = p.job.scratch;
  p.memory = plan::ComputeMemory(in);
  return p;
}

class TraceReplayTest : public ::testing::TestWithParam<Case> {};

// Runs four steps (the first creates what later steps reuse) and replays the other three; the
// median ratio is printed (see below why it is not asserted).
TEST_P(TraceReplayTest, EveryRecordedTaskMapsAndTheStepReplays) {
  const Case& c = GetParam();
  const ModelConfig model = TinyLlamaPreset();
  const plan::Plan p = MakePlan(model, c);
  std::vector<std::unique_ptr<CpuDevice>> devices;
  std::vector<Device*> raw;
  for (int i = 0; i < c.devices; ++i) {
    Result<std::unique_ptr<CpuDevice>> d = CpuDevice::Create({.name = "cpu" + std::to_string(i),
                                                              .memory_bytes = p.memory.gpu.total(),
                                                              .compute_threads = kThreads,
                                                              .upload_bytes_per_s = kLinkRate,
                                                              .download_bytes_per_s = kLinkRate});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    raw.push_back(d->get());
    devices.push_back(std::move(*d));
  }
  constexpr int kSteps = 4;
  TraceRecorder trace(p, kSteps);
  Result<std::unique_ptr<PipelineExecutor>> e =
      PipelineExecutor::Create(raw, model, p, nullptr, &trace);
  ASSERT_TRUE(e.ok()) << e.status().ToString();

  const std::vector<LayerSpec> layers = BuildLayerSpecs(model, {});
  const HostTensors weights = InitMasterWeights(layers, 3);
  HostTensors grads;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& ps : l.params) {
      if (ps.trainable && ps.tied_to.empty()) grads.tensors[ps.name].resize(size_t(ps.numel()));
    }
  }
  const size_t tokens = size_t(p.micro_batch_size * p.job.seq_len);
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> ids(size_t(c.micro_batches));
  std::vector<MicroBatchInput> batches;
  for (std::vector<int32_t>& v : ids) {
    for (size_t n = 0; n < tokens; ++n) v.push_back(int32_t(rng() % uint32_t(model.vocab_size)));
    batches.push_back({.tokens = v, .targets = v, .normalizer = double(c.micro_batches * tokens)});
  }
  batches[0].overwrite_grads = true;
  for (int step = 0; step < kSteps; ++step) {
    Result<double> loss = (*e)->Step(weights, batches, grads);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  }

  const plan::HardwareProfile hw = CpuDevicesProfile(c.devices, p.memory.gpu.total());
  Result<plan::Schedule> schedule =
      plan::BuildRoundRobinSchedule(plan::RoundRobinJobOf(model, p, hw));
  ASSERT_TRUE(schedule.ok()) << schedule.status().ToString();
  std::vector<double> ratios;
  for (int step = 1; step < kSteps; ++step) {
    Result<StepReplay> r = ReplayStep(*schedule, trace.spans(), step);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const std::string& name : r->missing) {
      EXPECT_EQ(name[0], 'U') << name << ": a schedule task the executor did not run";
    }
    EXPECT_TRUE(r->unmatched.empty()) << "first: " << r->unmatched.front();
    std::printf("[ replay ] %-40s step %d recorded %7.1f ms  replayed %7.1f ms  ratio %.3f\n",
                c.name, step, r->recorded_step_s * 1e3, r->replayed_step_s * 1e3, r->ratio());
    ratios.push_back(r->ratio());
  }
  // The ratio is printed and recorded, not asserted: on 2 shared cores the host work the
  // simulator does not model (packing a stage's weights on the enqueueing thread) and whatever
  // else runs (other tests, other builds) stretch the recorded step by 8-17% and more, so a 15%
  // bound here is a timing assertion that fails by load. Quiet-machine ratios: 1.02-1.09,
  // 0.94-0.97, 0.88-0.93, 1.10-1.11 (cases 0-3). What is asserted is that the mapping is whole.
  std::sort(ratios.begin(), ratios.end());
  ::testing::Test::RecordProperty("median_ratio", std::to_string(ratios[ratios.size() / 2]));
  EXPECT_GT(ratios[ratios.size() / 2], 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Plans, TraceReplayTest,
    ::testing::Values(
        Case{"1 stage, 3 micro-batches, saved, 2 devices", {{1, 5}}, {}, 3, 2},
        Case{"2 stages, 4 micro-batches, recompute, 2 devices",
             {{1, 3}, {3, 5}},
             {1, 2, 3, 4},
             4,
             2},
        Case{"4 stages, 3 micro-batches, mixed, 2 devices",
             {{1, 2}, {2, 3}, {3, 4}, {4, 5}},
             {2, 4},
             3,
             2},
        Case{"2 stages, 2 micro-batches, saved, 3 devices", {{1, 3}, {3, 5}}, {}, 2, 3}),
    [](const ::testing::TestParamInfo<Case>& i) { return "case" + std::to_string(i.index); });

}  // namespace
}  // namespace ferry::exec
