// The simulator against the executor (issue 17, "True"): the pipeline executor runs steps of the
// tiny model on CPU devices, its trace is replayed through the plan's round-robin schedule
// (engine/exec/trace_replay.h), for plans that differ in stage count, micro-batches,
// recomputation, device count, compute dtype (bf16 halves the bytes moved), LoRA (the base
// stays in the slots and the host mirrors; adapters move), the tail's parts (its micro-batches
// split over devices), two gradient accumulators per device, saved activations on NVMe and a
// LoRA base streamed from NVMe.
// Asserted: every task of the schedule is in the trace (bar the optimizer's, not run here), every
// span maps to a task, and the replayed step is within 15% of the recorded one.
//
// The devices run on a virtual clock (kernels/cpu/virtual_clock.h): each kernel takes its work at
// fixed rates (kFlopsPerS, kMemoryBytesPerS, plus kLaunchS), each copy its bytes over the link
// rate (so copies cost about what compute does), host work nothing. The recorded times are then a
// function of what the executor enqueued, in what order, and where it waited: the test is
// deterministic and asserts no wall-clock time. What the ratio measures is the simulator's
// dependency and resource model against the executor's, with every task's duration taken from the
// recording. One case also runs on real time and prints its ratio (not asserted: on 2 shared cores
// host work and load stretch the recorded step).
//
// Where the ratios come from (0.983, 1.004, 1.000, 1.094, 1.002, 0.999, 1.006 for cases 0-6; the
// tail split in parts, cases 7 and 8: 1.060 and 1.038; two accumulators, cases 9 and 10: 1.005
// and 1.007): the schedule's tasks are whole stages per micro-batch, while the executor works layer
// by layer inside a stage: a forward stage downloads each block's saved set and output as soon as
// the block has run (its "O" spans overlap its later blocks' compute), and a backward stage starts
// its last block once that block's inputs are up (its "I" spans overlap its compute). The replay
// waits for the whole transfer each time, so it runs long where those transfers are on the critical
// path (case 3: 2 micro-batches, little else to hide them behind). A replayed step shorter than the
// recorded one would mean a dependency of the executor's that the schedule lacks: cases 2 and 5
// (then numbered 2 and 4) were at 0.973 and 0.979 until the schedule learnt that a stage's
// gradient zeroing waits for the gradient download of the device's stage before it (one
// accumulator per device). Cases 9, 10 and 12 were at 0.990, 0.986 and 0.953 until the executor
// turned its forward hidden buffers over from one stage to the next on a device (each stage
// restarted at hidden.0, so a stage's first input waited for the device's stage before it to
// finish its last micro-batch, which used that buffer); the recorded steps of cases 8, 9, 10, 12
// and 14 got 1.3-2.1% shorter. Then the saved-set slots: a block's set went to slot (block % 2),
// so in a stage of one block micro-batch m + 1 computed into the slot m's set was still
// downloading from, a wait the schedule modelled for such stages; the forward stages now alternate
// the slots with one counter per device over their blocks and micro-batches (backward stages from
// slot 1 each, as the head's set is in slot 0), and the schedule dropped that wait. Cases 2 and 12
// recorded 6.7% and 8.6% shorter steps and replay at 1.000 and 0.996. Cases 0, 5 and 12 replay up
// to 1.7% short: within the bound. Case 0's is traced: the backward stage's first upload (dY into
// hidden.0) waits in the executor for the forward stage's last download, which read hidden.0
// (three hidden buffers turn over), a wait the schedule lacks. Adding
// it to every stage's first upload overshoots (case 0 1.068, case 4 1.094): the schedule starts a
// stage's downloads after its whole compute where the executor starts them block by block, so the
// wait it adds is longer than the executor's.
//
// Tiers: cases 11 and 12 save their activations in an NVMe store (ratios 1.008 and 0.996); the
// others keep them in host RAM. The schedule has no task for those NVMe reads and writes (the
// planner bounds the step by the drive's time for a step's traffic instead), and on the virtual
// clock host work, the store's included, takes no time: what these cases check is that the
// executor's device work around the spill (its staging slots, uploads of sets read back) keeps the
// schedule's order: both record and replay the very steps they do with their activations in RAM
// (checked by running them so: the spill adds no wait on the device's streams). Cases 13 and 14
// stream a LoRA job's base from a copy converted to NVMe (ratios 1.002 and 1.019): the schedule
// reads each stage's base in an "R" task on the NVMe read lane before its packing ("P"), unless the
// device's slot or image holds it; the executor traces the reads its packing did as that "R" (their
// summed time, then the rest as "P"), and every one of them is in both. On the virtual clock the
// reads and the packing take no time, so these cases check the order around them: each image packed
// once its last upload is done, each read skipped where the schedule skips it. Optimizer state
// stays in RAM: the CPU optimizer is not run here (the Trainer's, not the executor's): its "U…"
// tasks are the only ones the replay may find missing.
#include "engine/exec/trace_replay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "engine/exec/pipeline_executor.h"
#include "engine/model/converted_base.h"
#include "engine/model/master_weights.h"
#include "engine/plan/memory_model.h"
#include "engine/plan/pipeline_schedules.h"
#include "engine/train/training_runner.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/virtual_clock.h"
#include "offload/nvme_store.h"
#include "offload/offload_test_util.h"

namespace ferry::exec {
namespace {

constexpr int kThreads = 1;        // per device: two devices already share the machine's cores
constexpr double kLinkRate = 5e8;  // bytes/s each way: a block's f32 weights take ~3.5 ms
// The virtual kernel cost: a block's forward for one micro-batch (~50 MFLOP) takes ~2.5 ms.
constexpr double kFlopsPerS = 2e10;
constexpr double kMemoryBytesPerS = 1e10;
constexpr double kLaunchS = 5e-6;
constexpr double kBound = 0.15;  // |replayed / recorded - 1| (issue 17, goal 3)

double KernelSeconds(std::string_view, const KernelWork& w) {
  return kLaunchS + w.flops / kFlopsPerS + w.bytes / kMemoryBytesPerS;
}

struct Case {
  const char* name;
  std::vector<plan::LayerRange> stages;  // over the tiny model's blocks 1..4
  std::vector<int> recomputed;           // block layers recomputed in backward
  int micro_batches;
  int devices;
  DType dtype = DType::kF32;  // compute dtype: bf16 halves the weights' and activations' bytes
  int lora_rank = 0;          // > 0: a LoRA job (every projection adapted; the base frozen)
  int tail_parts = 1;         // the tail's micro-batches over this many devices
  int grad_accumulators = 1;  // per device
  bool activations_on_nvme = false;  // saved activations in an NVMe store (Tier::kNvme)
  bool base_streamed = false;        // a LoRA job's seeded base streamed from a copy on NVMe
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

plan::Plan MakePlan(const ModelConfig& model, const Case& c) {
  plan::Plan p;
  p.model_name = "tiny";
  p.gpus = c.devices;
  p.job.global_batch = 2 * c.micro_batches;
  p.job.seq_len = 32;
  p.job.micro_batches = c.micro_batches;
  p.job.compute_dtype = c.dtype;
  if (c.lora_rank > 0) p.job.lora = {.rank = c.lora_rank, .alpha = 2.0 * c.lora_rank};
  p.job.scratch = {.cuda = false, .cpu_threads = kThreads};
  p.micro_batches = c.micro_batches;
  p.micro_batch_size = 2;
  p.stages = c.stages;
  p.tail_parts = c.tail_parts;
  p.grad_accumulators = c.grad_accumulators;
  p.recompute.assign(size_t(model.num_layers) + 2, false);
  for (int li : c.recomputed) p.recompute[size_t(li)] = true;
  p.activation_policy = c.recomputed.empty() ? "save" : "per-layer";
  p.activations = c.activations_on_nvme ? Tier::kNvme : Tier::kHost;
  p.frozen_weights = c.base_streamed ? Tier::kNvme : Tier::kHost;
  p.memory = plan::ComputeMemory(plan::MemoryInputOf(model, p));
  return p;
}

class TraceReplayTest : public ::testing::TestWithParam<Case> {};

constexpr int kSteps = 4;

// Runs kSteps steps of the case's plan on CPU devices (on `clock` when given) and replays all but
// the first (which creates what later steps reuse); `spans`, when given, gets the recording.
void RunAndReplay(const Case& c, VirtualClock* clock, std::vector<StepReplay>& replays,
                  std::vector<TraceSpan>* spans = nullptr) {
  const ModelConfig model = TinyLlamaPreset();
  const plan::Plan p = MakePlan(model, c);
  std::vector<std::unique_ptr<CpuDevice>> devices;
  std::vector<Device*> raw;
  for (int i = 0; i < c.devices; ++i) {
    Result<std::unique_ptr<CpuDevice>> d = CpuDevice::Create({.name = "cpu" + std::to_string(i),
                                                              .memory_bytes = p.memory.gpu.total(),
                                                              .compute_threads = kThreads,
                                                              .upload_bytes_per_s = kLinkRate,
                                                              .download_bytes_per_s = kLinkRate,
                                                              .virtual_clock = clock});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    raw.push_back(d->get());
    devices.push_back(std::move(*d));
  }
  TraceRecorder::ClockFn trace_clock;
  if (clock != nullptr) trace_clock = [clock] { return clock->Now(); };
  TraceRecorder trace(p, kSteps, trace_clock);
  testing::TempDir nvme;
  std::unique_ptr<NvmeStore> store;
  if (c.activations_on_nvme) {
    ASSERT_FALSE(nvme.path().empty());
    NvmeStoreOptions o = ActivationStoreOptions(p, nvme.path() + "/activations");
    o.log = [](std::string_view) {};
    Result<std::unique_ptr<NvmeStore>> s = NvmeStore::Open(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store = std::move(*s);
  }
  Result<std::unique_ptr<PipelineExecutor>> e =
      PipelineExecutor::Create(raw, model, p, nullptr, &trace, /*host_pool=*/nullptr, store.get());
  ASSERT_TRUE(e.ok()) << e.status().ToString();

  const std::vector<LayerSpec> layers = BuildLayerSpecs(model, p.job.lora);
  HostTensors weights = InitMasterWeights(layers, 3);
  if (c.base_streamed) {  // converted once; each stage's packing reads its base from the drive
    Result<ConvertedBase> moved =
        MoveBaseToNvme(layers, c.dtype, DType::kF32, nvme.path(), weights);
    ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  }
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
  // The NVMe tier ran: every step wrote saved sets to the store and read them back.
  if (store != nullptr) {
    EXPECT_GT(store->stats().disk_bytes_written, 0u);
    EXPECT_GT(store->stats().disk_bytes_read, 0u);
  }

  const plan::HardwareProfile hw = CpuDevicesProfile(c.devices, p.memory.gpu.total());
  Result<plan::Schedule> schedule =
      plan::BuildRoundRobinSchedule(plan::RoundRobinJobOf(model, p, hw));
  ASSERT_TRUE(schedule.ok()) << schedule.status().ToString();
  for (int step = 1; step < kSteps; ++step) {
    Result<StepReplay> r = ReplayStep(*schedule, trace.spans(), step);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const std::string& name : r->missing) {
      EXPECT_EQ(name[0], 'U') << name << ": a schedule task the executor did not run";
    }
    EXPECT_TRUE(r->unmatched.empty()) << "first: " << r->unmatched.front();
    // A streamed base: the schedule reads each stage's base in an "R" task on the NVMe read lane
    // (none missing, above), and the trace has each with the blocks the drive read.
    size_t reads = 0, traced = 0;
    for (const plan::SimTask& t : r->schedule.tasks) {
      reads += t.lane.kind == plan::LaneKind::kNvmeRead;
    }
    for (const TraceSpan& s : trace.spans()) {
      if (s.step != step || s.lane.kind != plan::LaneKind::kNvmeRead) continue;
      ++traced;
      // The blocks the packing read are the plan's for that stage (StreamedBaseSource).
      for (const plan::SimTask& t : schedule->tasks) {
        if (t.name == s.name) {
          EXPECT_EQ(s.bytes, t.bytes) << s.name;
        }
      }
    }
    EXPECT_EQ(reads > 0, c.base_streamed) << reads;
    EXPECT_EQ(traced, reads);

    std::printf("[ replay ] %-48s %s step %d recorded %7.2f ms  replayed %7.2f ms  ratio %.3f\n",
                c.name, clock ? "virtual" : "real", step, r->recorded_step_s * 1e3,
                r->replayed_step_s * 1e3, r->ratio());
    replays.push_back(*std::move(r));
  }
  if (spans != nullptr) *spans = trace.spans();
}

// On the virtual clock every replayed step is within kBound of the recorded one, and the
// recording is the same run after run.
TEST_P(TraceReplayTest, TheReplayedStepIsWithinBoundOfTheRecordedOne) {
  const Case& c = GetParam();
  std::vector<StepReplay> replays, again;
  {
    VirtualClock clock(&KernelSeconds);
    ASSERT_NO_FATAL_FAILURE(RunAndReplay(c, &clock, replays));
  }
  {
    VirtualClock clock(&KernelSeconds);
    ASSERT_NO_FATAL_FAILURE(RunAndReplay(c, &clock, again));
  }
  ASSERT_EQ(replays.size(), again.size());
  for (size_t i = 0; i < replays.size(); ++i) {
    SCOPED_TRACE("replayed step " + std::to_string(i + 1));
    EXPECT_GT(replays[i].recorded_step_s, 0);
    EXPECT_NEAR(replays[i].ratio(), 1.0, kBound)
        << "recorded " << replays[i].recorded_step_s << " s, replayed "
        << replays[i].replayed_step_s << " s";
    // Deterministic: a second run records the same step (to rounding of the summed times).
    EXPECT_NEAR(again[i].recorded_step_s, replays[i].recorded_step_s,
                1e-9 * replays[i].recorded_step_s);
    EXPECT_NEAR(again[i].replayed_step_s, replays[i].replayed_step_s,
                1e-9 * replays[i].replayed_step_s);
  }
  ::testing::Test::RecordProperty("ratio", std::to_string(replays.front().ratio()));
}

// Two gradient accumulators per device, on the virtual clock: a stage's first compute (its
// zeroing) starts while the gradients of its device's stage before it still download, which with
// one accumulator it never does. Per step after the first, per gradient download: does a later
// stage on its device start computing before it ends?
TEST(TraceReplayVirtualClock, TwoAccumulatorsOverlapAStageWithTheDownloadBeforeIt) {
  for (const int accumulators : {1, 2}) {
    Case c{"2 stages, 3 micro-batches, saved, 1 device", {{1, 3}, {3, 5}}, {}, 3, 1};
    c.grad_accumulators = accumulators;
    std::vector<StepReplay> replays;
    std::vector<TraceSpan> spans;
    {
      VirtualClock clock(&KernelSeconds);
      ASSERT_NO_FATAL_FAILURE(RunAndReplay(c, &clock, replays, &spans));
    }
    int downloads = 0, overlapped = 0;
    for (const TraceSpan& g : spans) {
      if (g.step < 1 || g.kind != plan::TaskKind::kGradientDownload) continue;
      ++downloads;
      for (const TraceSpan& s : spans) {
        if (s.step == g.step && s.lane == plan::LaneId{plan::LaneKind::kCompute, g.lane.gpu} &&
            s.stage > g.stage && s.start_s < g.end_s) {
          ++overlapped;
          break;
        }
      }
    }
    EXPECT_GT(downloads, 0);
    if (accumulators == 1) {
      EXPECT_EQ(overlapped, 0) << "a stage zeroed the one accumulator while it downloaded";
    } else {
      EXPECT_GT(overlapped, 0) << "no stage ran while the one before it downloaded";
    }
    for (const StepReplay& r : replays) EXPECT_NEAR(r.ratio(), 1.0, kBound);
  }
}

// The tail's head overwrites its per-token losses each micro-batch, so it downloads them before
// the micro-batch's input gradient: on the virtual clock (the head computes longer than a hidden
// state takes to download) the next micro-batch's head starts while that gradient still
// downloads. Downloading the losses last makes every head wait for both copies of the one before.
TEST(TraceReplayVirtualClock, TheTailsNextHeadStartsWhileTheGradientBeforeDownloads) {
  const Case c{"2 stages, 3 micro-batches, saved, 1 device", {{1, 3}, {3, 5}}, {}, 3, 1};
  std::vector<StepReplay> replays;
  std::vector<TraceSpan> spans;
  {
    VirtualClock clock(&KernelSeconds);
    ASSERT_NO_FATAL_FAILURE(RunAndReplay(c, &clock, replays, &spans));
  }
  int pairs = 0, overlapped = 0;
  for (int64_t step = 1; step < kSteps; ++step) {
    for (int m = 0; m + 1 < c.micro_batches; ++m) {
      double gradient_end = -1, head_start = -1;  // the larger "OT.m" copy: the gradient
      double gradient_bytes = 0;
      for (const TraceSpan& s : spans) {
        if (s.step != step) continue;
        if (s.name == "OT." + std::to_string(m) && s.bytes > gradient_bytes) {
          gradient_bytes = s.bytes;
          gradient_end = s.end_s;
        }
        if (s.name == "T." + std::to_string(m + 1) && s.lane.kind == plan::LaneKind::kCompute &&
            (head_start < 0 || s.start_s < head_start)) {
          head_start = s.start_s;
        }
      }
      ASSERT_GT(gradient_end, 0) << "no gradient download of micro-batch " << m;
      ASSERT_GE(head_start, 0) << "no head of micro-batch " << m + 1;
      ++pairs;
      if (head_start < gradient_end) ++overlapped;
    }
  }
  EXPECT_EQ(pairs, (kSteps - 1) * (c.micro_batches - 1));
  EXPECT_GT(overlapped, 0) << "every head waited for the gradient download before it";
}

// The first case on real time (throttled links): the mapping is whole; the ratio is printed, not
// asserted (quiet-machine ratios were 0.88-1.11 over the cases; load stretches the recording).
TEST(TraceReplayRealTime, EveryRecordedTaskMapsAndTheStepReplays) {
  const Case c{"1 stage, 3 micro-batches, saved, 2 devices", {{1, 5}}, {}, 3, 2};
  std::vector<StepReplay> replays;
  ASSERT_NO_FATAL_FAILURE(RunAndReplay(c, nullptr, replays));
  ASSERT_EQ(replays.size(), size_t(kSteps - 1));
  for (const StepReplay& r : replays) EXPECT_GT(r.ratio(), 0.0);
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
        Case{"2 stages, 2 micro-batches, saved, 3 devices", {{1, 3}, {3, 5}}, {}, 2, 3},
        Case{"2 stages, 3 micro-batches, LoRA, 2 devices",
             {{1, 3}, {3, 5}},
             {},
             3,
             2,
             DType::kF32,
             4},
        Case{"2 stages, 3 micro-batches, mixed, 1 device", {{1, 3}, {3, 5}}, {1, 4}, 3, 1},
        Case{"3 stages, 4 micro-batches, saved, 2 devices, bf16",
             {{1, 2}, {2, 4}, {4, 5}},
             {},
             4,
             2,
             DType::kBF16},
        Case{"2 stages, 4 micro-batches, the tail in 3 parts, 3 devices",
             {{1, 3}, {3, 5}},
             {2},
             4,
             3,
             DType::kF32,
             0,
             3},
        Case{"3 stages, 3 micro-batches, the tail in 2 parts, 2 devices",
             {{1, 2}, {2, 4}, {4, 5}},
             {},
             3,
             2,
             DType::kF32,
             0,
             2},
        Case{"3 stages, 3 micro-batches, 2 accumulators, tail in 2, 2 devices",
             {{1, 2}, {2, 4}, {4, 5}},
             {2},
             3,
             2,
             DType::kF32,
             0,
             2,
             2},
        Case{"2 stages, 3 micro-batches, 2 accumulators, 1 device",
             {{1, 3}, {3, 5}},
             {},
             3,
             1,
             DType::kF32,
             0,
             1,
             2},
        Case{"2 stages, 3 micro-batches, activations on NVMe, 2 devices",
             {{1, 3}, {3, 5}},
             {},
             3,
             2,
             DType::kF32,
             0,
             1,
             1,
             true},
        Case{"3 stages, 4 micro-batches, mixed, activations on NVMe, 1 device",
             {{1, 2}, {2, 4}, {4, 5}},
             {3},
             4,
             1,
             DType::kF32,
             0,
             1,
             1,
             true},
        Case{"3 stages, 3 micro-batches, LoRA, the base streamed, 2 devices",
             {{1, 2}, {2, 4}, {4, 5}},
             {},
             3,
             2,
             DType::kF32,
             4,
             1,
             1,
             false,
             true},
        Case{"2 stages, 3 micro-batches, LoRA, the base streamed, 1 device",
             {{1, 3}, {3, 5}},
             {2},
             3,
             1,
             DType::kF32,
             4,
             1,
             1,
             false,
             true}),
    [](const ::testing::TestParamInfo<Case>& i) { return "case" + std::to_string(i.index); });

}  // namespace
}  // namespace ferry::exec
