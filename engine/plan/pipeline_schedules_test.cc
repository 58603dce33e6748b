#include "engine/plan/pipeline_schedules.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace ferry::plan {
namespace {

// Simulated times are sums of at most a few hundred doubles of integral value; exact in practice,
// 1e-9 relative leaves room for the simulator's completion epsilon.
constexpr double kTol = 1e-9;

LaneRates FastLinks() {
  LaneRates r;
  r.host_to_device = r.device_to_host = 1e9;
  r.host_memory = 1e12;
  r.cpu_optimizer = 30e9;  // 1e9 parameters/s
  r.nvme_read = r.nvme_write = 1e9;
  return r;
}

std::vector<StageCost> EqualStages(int p, double fwd, double bwd) {
  std::vector<StageCost> stages(p);
  for (StageCost& c : stages) {
    c.fwd_s = fwd;
    c.bwd_s = bwd;
  }
  return stages;
}

TEST(PipelineSchedules, GpipeBubbleMatchesTheFormula) {
  for (int p : {2, 4}) {
    for (int m : {1, 4, 8}) {
      Result<Schedule> s = BuildGpipeSchedule(EqualStages(p, 1.0, 2.0), m);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      Result<SimResult> r = Simulate(*s, FastLinks());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_NEAR(r->makespan_s, (m + p - 1) * 3.0, kTol) << "p=" << p << " m=" << m;
      const double expected = static_cast<double>(p - 1) / (m + p - 1);
      for (int g = 0; g < p; ++g) {
        EXPECT_NEAR(r->gpu_bubble_fraction[g], expected, kTol) << "p=" << p << " m=" << m;
      }
    }
  }
}

TEST(PipelineSchedules, OneFOneBHasGpipesMakespanWithEqualStages) {
  for (int p : {2, 3, 4}) {
    for (int m : {1, 2, 4, 9}) {
      Result<Schedule> g = BuildGpipeSchedule(EqualStages(p, 1.0, 2.0), m);
      Result<Schedule> f = Build1F1BSchedule(EqualStages(p, 1.0, 2.0), m);
      ASSERT_TRUE(g.ok() && f.ok());
      Result<SimResult> rg = Simulate(*g, FastLinks());
      Result<SimResult> rf = Simulate(*f, FastLinks());
      ASSERT_TRUE(rg.ok() && rf.ok()) << rf.status().ToString();
      EXPECT_NEAR(rf->makespan_s, rg->makespan_s, kTol) << "p=" << p << " m=" << m;
      EXPECT_NEAR(rf->mean_bubble_fraction, rg->mean_bubble_fraction, kTol);
    }
  }
}

TEST(PipelineSchedules, BaselineActivationsCrossHostRam) {
  // Two stages, one micro-batch, 1 GB boundary activation at 1 GB/s each way: forward pays a
  // download and an upload (2 s), backward the same for the gradient.
  std::vector<StageCost> stages = EqualStages(2, 1.0, 1.0);
  stages[0].output_bytes = 1e9;
  Result<Schedule> s = BuildGpipeSchedule(stages, 1);
  ASSERT_TRUE(s.ok());
  Result<SimResult> r = Simulate(*s, FastLinks());
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->makespan_s, 1 + 2 + 1 + 1 + 2 + 1, kTol);
}

RoundRobinJob EqualRoundRobin(int gpus, int micro_batches) {
  RoundRobinJob job;
  job.gpus = gpus;
  job.micro_batches = micro_batches;
  job.forward = EqualStages(3, 1.0, 0.0);
  job.tail.fwd_s = 0.5;
  job.tail.bwd_s = 0.5;
  job.backward = EqualStages(4, 0.0, 1.0);
  return job;
}

TEST(PipelineSchedules, RoundRobinWithFreeTransfersHasASmallBubble) {
  // 8 stages of 1 s per micro-batch on 2 GPUs, 16 micro-batches: each GPU computes 64 s; the
  // only idle time is GPU 1 waiting for the first micro-batch and GPU 0 after its last stage.
  Result<Schedule> s = BuildRoundRobinSchedule(EqualRoundRobin(2, 16));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Result<SimResult> r = Simulate(*s, FastLinks());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->makespan_s, 65.0, kTol);
  EXPECT_NEAR(r->gpu_bubble_fraction[0], 1.0 / 65, kTol);
  EXPECT_NEAR(r->gpu_bubble_fraction[1], 1.0 / 65, kTol);
  // Versus 1F1B on the same two GPUs with the same total work (4 s + 4 s... per micro-batch).
  Result<Schedule> b = Build1F1BSchedule(EqualStages(2, 2.0, 2.0), 16);
  ASSERT_TRUE(b.ok());
  Result<SimResult> rb = Simulate(*b, FastLinks());
  ASSERT_TRUE(rb.ok());
  EXPECT_LT(r->mean_bubble_fraction, rb->mean_bubble_fraction);
}

TEST(PipelineSchedules, RoundRobinBubbleShrinksWithMoreMicroBatches) {
  double previous = 1.0;
  for (int m : {2, 4, 8, 32}) {
    Result<Schedule> s = BuildRoundRobinSchedule(EqualRoundRobin(4, m));
    ASSERT_TRUE(s.ok());
    Result<SimResult> r = Simulate(*s, FastLinks());
    ASSERT_TRUE(r.ok());
    EXPECT_LT(r->mean_bubble_fraction, previous) << "m=" << m;
    previous = r->mean_bubble_fraction;
  }
  EXPECT_LT(previous, 0.1);
}

TEST(PipelineSchedules, RoundRobinHidesWeightUploadsBehindCompute) {
  // 2 GB of weights per stage at 1 GB/s = 2 s, each stage computes 16 s: only the first uploads
  // (one per GPU, in parallel) show; the rest load into the second buffer while the GPU computes.
  RoundRobinJob job = EqualRoundRobin(2, 16);
  for (StageCost* c : {&job.forward[0], &job.forward[1], &job.forward[2], &job.tail,
                       &job.backward[0], &job.backward[1], &job.backward[2], &job.backward[3]}) {
    c->weight_bytes = 2e9;
  }
  Result<Schedule> s = BuildRoundRobinSchedule(job);
  ASSERT_TRUE(s.ok());
  Result<SimResult> r = Simulate(*s, FastLinks());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->makespan_s, 65.0 + 2.0, kTol);
}

TEST(PipelineSchedules, RoundRobinDownloadsGradientsAndUpdatesOnTheCpu) {
  RoundRobinJob job = EqualRoundRobin(2, 4);
  job.backward.back().grad_bytes = 3e9;   // 3 s at 1 GB/s
  job.backward.back().param_count = 2e9;  // 2 s at 1e9 parameters/s
  Result<Schedule> s = BuildRoundRobinSchedule(job);
  ASSERT_TRUE(s.ok());
  Result<SimResult> r = Simulate(*s, FastLinks());
  ASSERT_TRUE(r.ok());
  double last_compute = 0;
  for (size_t i = 0; i < s->tasks.size(); ++i) {
    if (s->tasks[i].lane.kind == LaneKind::kCompute) {
      last_compute = std::max(last_compute, r->timing[i].end_s);
    }
  }
  EXPECT_NEAR(r->makespan_s, last_compute + 3.0 + 2.0, kTol);
  EXPECT_NEAR(r->BusySeconds({LaneKind::kCpuOptimizer, 0}), 2.0, kTol);
}

// Executor-faithful buffers: a device's next stage with gradients zeroes the one accumulator, so
// its first micro-batch waits for the gradient download of the device's stage before it.
TEST(PipelineSchedules, RoundRobinZeroesGradientsOnceTheLastOnesAreDownloaded) {
  RoundRobinJob job = EqualRoundRobin(2, 4);  // B0 on GPU 0 (stage 4), then B2 (stage 6)
  job.backward[0].grad_bytes = 5e9;           // GB0: 5 s at 1 GB/s
  job.backward[2].grad_bytes = 1e9;
  auto start_after = [&](bool executor_buffers) {
    job.executor_buffers = executor_buffers;
    Result<Schedule> s = BuildRoundRobinSchedule(job);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    Result<SimResult> r = Simulate(*s, FastLinks());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    double b2 = -1, gb0 = -1;
    for (size_t i = 0; i < s->tasks.size(); ++i) {
      if (s->tasks[i].name == "B2.0") b2 = r->timing[i].start_s;
      if (s->tasks[i].name == "GB0") gb0 = r->timing[i].end_s;
    }
    return b2 - gb0;  // B2.0's start relative to GB0's end
  };
  EXPECT_NEAR(start_after(true), 0.0, kTol);
  EXPECT_LT(start_after(false), -1.0);  // without the executor's buffers it overlaps GB0
}

// Executor-faithful buffers: micro-batch j's input lands in a slot that micro-batch
// j - input_slots read. One GPU, one forward stage of 4 micro-batches, each a 2 s upload (2 GB at
// 1 GB/s) and 1 s of compute. Two slots: the uploads run back to back ([2j, 2j + 2)) and F0.3
// ends at 9, as with no buffers at all. One slot: each upload waits for the compute before it,
// 3 s a micro-batch after the first: F0.3 ends at 12.
TEST(PipelineSchedules, RoundRobinInputUploadsWaitForTheComputeThatFreesTheirSlot) {
  RoundRobinJob job;
  job.micro_batches = 4;
  job.forward = EqualStages(1, 1.0, 0.0);
  job.forward[0].input_bytes = 2e9;
  job.backward = EqualStages(1, 0.0, 0.0);
  auto f3_end = [&](bool executor_buffers, int slots) {
    job.executor_buffers = executor_buffers;
    job.input_slots = slots;
    Result<Schedule> s = BuildRoundRobinSchedule(job);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    Result<SimResult> r = Simulate(*s, FastLinks());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    for (size_t i = 0; i < s->tasks.size(); ++i) {
      if (s->tasks[i].name == "F0.3") return r->timing[i].end_s;
    }
    return -1.0;
  };
  EXPECT_NEAR(f3_end(false, 2), 9.0, kTol);
  EXPECT_NEAR(f3_end(true, 2), 9.0, kTol);
  EXPECT_NEAR(f3_end(true, 1), 12.0, kTol);
}

// A round-robin job's step on FastLinks: its makespan and each task's lane and timing by name
// (the test fails, and the step is empty, when it does not build or simulate).
struct Ran {
  LaneId lane;
  TaskTiming at;
};
struct Step {
  double makespan = 0;
  std::map<std::string, Ran> tasks;
};
Step RunRoundRobin(const RoundRobinJob& job) {
  Step step;
  Result<Schedule> s = BuildRoundRobinSchedule(job);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return step;
  Result<SimResult> r = Simulate(*s, FastLinks());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return step;
  step.makespan = r->makespan_s;
  for (size_t i = 0; i < s->tasks.size(); ++i) {
    step.tasks[s->tasks[i].name] = {s->tasks[i].lane, r->timing[i]};
  }
  return step;
}

// The tail split over devices (RoundRobinJob::tail_parts). Two GPUs, two micro-batches, a forward
// stage of 1 s, a tail of 4 s, a backward stage of 1 s per micro-batch, free transfers. In one
// part: F0 on GPU 0 [0, 2), T.0 and T.1 on GPU 1 [1, 9), B0 on GPU 0 after each: B0.1 ends at 10.
// In two: T.0 on GPU 1 [1, 5), T.1 on GPU 0 once F0.1 is done [2, 6), B0 (stage 3) on GPU 1
// reads micro-batch 0 from the first part and 1 from the second: [5, 6) and [6, 7).
// Each part downloads its gradients (1 GB: 1 s) once its micro-batch is done and the tail's update
// (1e9 parameters: 1 s) follows the last part's: GT0 [5, 6) on GPU 1, GT1 [6, 7) on GPU 0, UT1
// [7, 8).
TEST(PipelineSchedules, RoundRobinSplitsTheTailsMicroBatchesOverDevices) {
  RoundRobinJob job;
  job.gpus = 2;
  job.micro_batches = 2;
  job.forward = EqualStages(1, 1.0, 0.0);
  job.tail.fwd_s = 2.0;
  job.tail.bwd_s = 2.0;
  job.backward = EqualStages(1, 0.0, 1.0);
  auto run = [&](int parts) {
    job.tail_parts = parts;
    return RunRoundRobin(job);
  };
  EXPECT_NEAR(run(1).makespan, 10.0, kTol);
  Step two = run(2);
  EXPECT_NEAR(two.makespan, 7.0, kTol);
  EXPECT_EQ(two.tasks["T.0"].lane, (LaneId{LaneKind::kCompute, 1}));
  EXPECT_EQ(two.tasks["T.1"].lane, (LaneId{LaneKind::kCompute, 0}));
  EXPECT_NEAR(two.tasks["T.1"].at.start_s, 2.0, kTol);
  EXPECT_NEAR(two.tasks["B0.0"].at.start_s, 5.0, kTol);  // not held back by the second part
  EXPECT_EQ(two.tasks["B0.0"].lane, (LaneId{LaneKind::kCompute, 1}));
  job.tail.grad_bytes = 1e9;
  job.tail.param_count = 1e9;
  two = run(2);
  EXPECT_NEAR(two.makespan, 8.0, kTol);
  EXPECT_EQ(two.tasks["GT0"].lane, (LaneId{LaneKind::kDeviceToHost, 1}));
  EXPECT_NEAR(two.tasks["GT0"].at.start_s, 5.0, kTol);
  EXPECT_EQ(two.tasks["GT1"].lane, (LaneId{LaneKind::kDeviceToHost, 0}));
  EXPECT_NEAR(two.tasks["GT1"].at.start_s, 6.0, kTol);
  EXPECT_NEAR(two.tasks["UT1"].at.start_s, 7.0, kTol);
  EXPECT_EQ(two.tasks.count("UT0"), 0u);  // one update, after the last part
  EXPECT_EQ(two.tasks.count("UT"), 0u);
}

// Gradient accumulators (RoundRobinJob::grad_accumulators). One GPU, one micro-batch, two
// forward stages of 1 s, a tail of 1 s and two backward stages of 1 s, each with 2 GB of gradients
// (2 s to download) and no update cost: the GPU runs F0 [0, 1), F1 [1, 2), T [2, 3) (no
// gradients), B0 [3, 4); its gradients download [4, 6). With one accumulator B1 zeroes it only
// after that: [6, 7), its download [7, 9). With two, B1 uses the other: [4, 5), its download
// waits for the link: [6, 8).
TEST(PipelineSchedules, TwoGradientAccumulatorsLetAStageRunWhileTheOneBeforeDownloads) {
  RoundRobinJob job;
  job.gpus = 1;
  job.micro_batches = 1;
  job.executor_buffers = true;  // the accumulators are the executor's buffers
  job.forward = EqualStages(2, 1.0, 0.0);
  job.tail.fwd_s = 0.5;
  job.tail.bwd_s = 0.5;
  job.backward = EqualStages(2, 0.0, 1.0);
  for (StageCost& c : job.backward) c.grad_bytes = 2e9;
  auto run = [&](int accumulators) {
    job.grad_accumulators = accumulators;
    return RunRoundRobin(job);
  };
  Step one = run(1), two = run(2);
  EXPECT_NEAR(one.tasks["GB0"].at.start_s, 4.0, kTol);
  EXPECT_NEAR(one.tasks["B1.0"].at.start_s, 6.0, kTol);
  EXPECT_NEAR(one.makespan, 9.0, kTol);
  EXPECT_NEAR(two.tasks["B1.0"].at.start_s, 4.0, kTol);
  EXPECT_NEAR(two.tasks["GB1"].at.start_s, 6.0, kTol);
  EXPECT_NEAR(two.makespan, 8.0, kTol);
  for (int accumulators : {0, 3}) {
    job.grad_accumulators = accumulators;
    EXPECT_FALSE(BuildRoundRobinSchedule(job).ok()) << accumulators;
  }
}

// Task names and layer ranges with the tail in parts.
TEST(PipelineSchedules, TailPartsNameTheirTasksAndRunTheHeadsRange) {
  EXPECT_EQ(RoundRobinTaskName('T', 2, 1, 3, 2), "T.3");    // per micro-batch: no part
  EXPECT_EQ(RoundRobinTaskName('G', 2, 1, -1, 2), "GT1");   // the second part's gradients
  EXPECT_EQ(RoundRobinTaskName('W', 1, 1, -1, 2), "WT0");   // the first part's weights
  EXPECT_EQ(RoundRobinTaskName('W', 1, 1, -1), "WT");       // one part: unnumbered
  EXPECT_EQ(RoundRobinTaskName('I', 3, 1, 0, 2), "IB0.0");  // the first backward stage
  EXPECT_EQ(RoundRobinTaskName('U', 4, 2, -1, 3), "UT2");   // two forward stages, 3 parts
  EXPECT_EQ(StepStageRanges(2, 3), (std::vector<int>{0, 1, 2, 2, 2, 1, 0}));
  EXPECT_EQ(StepStageRanges(2), (std::vector<int>{0, 1, 2, 1, 0}));
}

TEST(PipelineSchedules, RejectsBadInput) {
  EXPECT_FALSE(BuildGpipeSchedule({}, 4).ok());
  EXPECT_FALSE(BuildGpipeSchedule(EqualStages(2, 1, 1), 0).ok());
  std::vector<StageCost> negative = EqualStages(2, 1, 1);
  negative[1].fwd_s = -1;
  EXPECT_FALSE(Build1F1BSchedule(negative, 2).ok());
  RoundRobinJob job = EqualRoundRobin(0, 2);
  EXPECT_FALSE(BuildRoundRobinSchedule(job).ok());
  // The tail's parts: 1 to min(micro-batches, GPUs).
  for (int parts : {0, 3}) {
    job = EqualRoundRobin(2, 4);
    job.tail_parts = parts;
    EXPECT_FALSE(BuildRoundRobinSchedule(job).ok()) << parts;
  }
  job = EqualRoundRobin(4, 2);
  job.tail_parts = 3;
  EXPECT_FALSE(BuildRoundRobinSchedule(job).ok());
  job.tail_parts = 2;
  EXPECT_TRUE(BuildRoundRobinSchedule(job).ok());
}

// The embedding's host work on one GPU, two micro-batches of forward 1 s, tail 1 s, backward 1 s:
// gathers E.0 [0, 0.5) and E.1 [0.5, 1) hold back F0.0 to [0.5, 1.5), so the GPU runs F, F, T, T,
// B, B over [0.5, 6.5); the scatter-adds follow each backward: EB.0 [5.5, 5.75), EB.1
// [6.5, 6.75); the optimizer update (1 parameter at 1 parameter/s: 1 s) waits for the last
// scatter-add (it updates the embedding): 7.75. A formula's bytes (100 B at 100 B/s: 1 s each)
// go at the host memory bandwidth: gathers [0, 1), [1, 2), the GPU [1, 7), scatter-adds to 8.
TEST(PipelineSchedules, RoundRobinRunsTheEmbeddingOnTheHost) {
  RoundRobinJob job;
  job.micro_batches = 2;
  job.forward = EqualStages(1, 1.0, 0.0);
  job.tail.fwd_s = 0.5;
  job.tail.bwd_s = 0.5;
  job.backward = EqualStages(1, 0.0, 1.0);
  job.backward[0].param_count = 1;
  LaneRates rates = FastLinks();
  rates.cpu_optimizer = kAdamWBytesPerParameter;  // 1 parameter/s
  rates.host_memory = 100;
  rates.transfers_share_host_memory = false;  // the optimizer at its own rate
  auto finish = [&](const RoundRobinJob& j, const std::string& name) {
    Result<Schedule> s = BuildRoundRobinSchedule(j);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    Result<SimResult> r = Simulate(*s, rates);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    for (size_t i = 0; i < s->tasks.size(); ++i) {
      if (s->tasks[i].name == name) return r->timing[i].end_s;
    }
    ADD_FAILURE() << "no task " << name;
    return -1.0;
  };
  EXPECT_NEAR(finish(job, "UB0"), 1 + 1 + 1 + 1 + 1 + 1 + 1, kTol);  // no embedding work
  job.embedding_forward.seconds = 0.5;
  job.embedding_backward.seconds = 0.25;
  EXPECT_NEAR(finish(job, "E.1"), 1.0, kTol);
  EXPECT_NEAR(finish(job, "F0.0"), 1.5, kTol);
  EXPECT_NEAR(finish(job, "EB.0"), 5.75, kTol);
  EXPECT_NEAR(finish(job, "EB.1"), 6.75, kTol);
  EXPECT_NEAR(finish(job, "UB0"), 7.75, kTol);
  job.embedding_forward = {0, 100};
  job.embedding_backward = {0, 100};
  EXPECT_NEAR(finish(job, "F0.0"), 2.0, kTol);
  EXPECT_NEAR(finish(job, "EB.1"), 8.0, kTol);
  EXPECT_NEAR(finish(job, "UB0"), 9.0, kTol);
  job.embedding_backward.bytes = -1;
  EXPECT_FALSE(BuildRoundRobinSchedule(job).ok());
}

// The executor's host thread: gathers, then packing in enqueue order, then gradient adding in
// stage order as each stage's gradients land, then the scatter-adds. Uploads wait for their
// packing, updates for their adding.
TEST(PipelineSchedules, RoundRobinRunsHostWorkAsTheExecutorsHostThread) {
  RoundRobinJob job;
  job.gpus = 2;
  job.micro_batches = 2;
  job.weight_chunks = 1;
  job.forward = EqualStages(1, 1.0, 0.0);
  job.forward[0].weight_bytes = 1e9;  // 1 s at FastLinks' 1e9 B/s
  job.forward[0].pack.seconds = 1;
  job.tail.fwd_s = job.tail.bwd_s = 0.5;
  job.tail.pack.seconds = 1;
  job.backward = EqualStages(1, 0.0, 1.0);
  for (StageCost* c : {&job.tail, &job.backward[0]}) {
    c->grad_bytes = 1e9;
    c->add_grads.seconds = 1;
    c->param_count = 1;
  }
  job.embedding_forward.seconds = 0.5;
  job.embedding_backward.seconds = 0.25;
  LaneRates rates = FastLinks();
  rates.cpu_optimizer = kAdamWBytesPerParameter;  // 1 parameter/s
  rates.transfers_share_host_memory = false;
  Result<Schedule> s = BuildRoundRobinSchedule(job);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Result<SimResult> r = Simulate(*s, rates);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::map<std::string, TaskTiming> at;
  for (size_t i = 0; i < s->tasks.size(); ++i) {
    at[s->tasks[i].name] = r->timing[i];
    if (s->tasks[i].name[0] == 'P' || s->tasks[i].name[0] == 'A') {
      EXPECT_EQ(s->tasks[i].lane.kind, LaneKind::kHostMemory) << s->tasks[i].name;
    }
  }
  ASSERT_EQ(at.count("PB0"), 0u) << "the backward stage reuses the forward stage's packing";
  const std::vector<std::pair<std::string, TaskTiming>> want = {
      {"E.1", {0.5, 1}},     {"PF0", {1, 2}},     {"PT", {2, 3}}, {"WF0/0", {2, 3}},
      {"F0.0", {3, 4}},      {"T.1", {5, 6}},     {"GT", {6, 7}}, {"AT", {7, 8}},
      {"GB0", {7, 8}},       {"AB0", {8, 9}},     {"UT", {8, 9}}, {"EB.0", {9, 9.25}},
      {"EB.1", {9.25, 9.5}}, {"UB0", {9.5, 10.5}}};
  for (const auto& [name, t] : want) {
    ASSERT_EQ(at.count(name), 1u) << name;
    EXPECT_NEAR(at[name].start_s, t.start_s, kTol) << name;
    EXPECT_NEAR(at[name].end_s, t.end_s, kTol) << name;
  }
  EXPECT_NEAR(r->makespan_s, 10.5, kTol);
  job.tail.pack.bytes = -1;
  EXPECT_FALSE(BuildRoundRobinSchedule(job).ok());
}

// The executor's placement: round robin over devices, each device's two slots in turn; with
// `resume` a step starts on the last step's last device and slot.
TEST(StageRoundRobin, PlacesInTurnAndResumesWhereTheLastStepEnded) {
  using P = StageRoundRobin::Placement;
  auto eq = [](const std::vector<P>& got, const std::vector<P>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].device, want[i].device) << i;
      EXPECT_EQ(got[i].slot, want[i].slot) << i;
    }
  };
  StageRoundRobin on(2);
  eq(on.Place(5, false), {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 0}});
  eq(on.Place(5, false), {{1, 0}, {0, 1}, {1, 1}, {0, 0}, {1, 0}});  // the counter runs on
  StageRoundRobin resume(2);
  eq(resume.Place(7, true), {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 0}, {1, 0}, {0, 1}});
  eq(resume.Place(7, true), {{0, 1}, {1, 1}, {0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 0}});
  resume.Forget();  // after a failed step: the counter runs on
  eq(resume.Place(3, true), {{1, 0}, {0, 1}, {1, 1}});
}

// Worked by hand from the placements above. Two devices, two forward stages (ranges 0 1, the
// tail 2, backward 1 0): each device's slots keep the same ranges from step to step. Three
// forward stages: the first stage (after the backward stage over its layers), the second
// forward stage and the backward stage that follows its forward stage on the same slot.
TEST(StageRoundRobin, ResidentBasesOfASteadyStep) {
  std::vector<int> ranges;  // a step's stages with two forward stages: 0 1, the tail, 1 0
  for (int i = 0; i < 5; ++i) ranges.push_back(StepStageRange(i, 2));
  EXPECT_EQ(ranges, (std::vector<int>{0, 1, 2, 1, 0}));
  EXPECT_EQ(ResidentBases({0, 1, 2, 1, 0}, 2), std::vector<bool>(5, true));
  // Three forward stages on two devices: the backward stage over range 2 follows its forward
  // stage on device 0 and takes its slot; then each device's next stage finds its range's base in
  // its other slot. Ranges 1 and 3 share device 1's slot 0 (and 3 its slot 1 with range 1's
  // backward stage from the step before), so they move their base each step.
  EXPECT_EQ(ResidentBases({0, 1, 2, 3, 2, 1, 0}, 2),
            (std::vector<bool>{true, false, true, false, true, true, true}));
  EXPECT_EQ(ResidentBases({0, 1, 0}, 1), std::vector<bool>(3, true));
  // Eight devices, more slots than ranges: every base stays.
  EXPECT_EQ(ResidentBases({0, 1, 2, 1, 0}, 8), std::vector<bool>(5, true));
}

// A stage over the layers of the stage before it on its device takes that stage's slot, where
// its weights are; the device's next stage takes the other. Without ranges, or where the ranges
// differ, a device's stages take its slots in turn.
TEST(StageRoundRobin, ABackwardStageRightAfterItsForwardStageTakesItsSlot) {
  using P = StageRoundRobin::Placement;
  auto slots = [](const std::vector<P>& at) {
    std::vector<std::pair<int, int>> v;
    for (const P& p : at) v.push_back({p.device, p.slot});
    return v;
  };
  using V = std::vector<std::pair<int, int>>;
  // Two forward stages, the tail, two backward stages (ranges 0 1 2 1 0) on two devices: the
  // backward stage over range 1 follows its forward stage on device 1.
  const std::vector<int> two = StepStageRanges(2);
  EXPECT_EQ(slots(StageRoundRobin(2).Place(5, false, two)),
            (V{{0, 0}, {1, 0}, {0, 1}, {1, 0}, {0, 0}}));
  EXPECT_EQ(slots(StageRoundRobin(2).Place(5, false)), (V{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 0}}));
  // One forward stage on two devices (ranges 0 1 0): the backward stage follows it on device 0,
  // and the next step, resumed there, starts in the same slot.
  StageRoundRobin rr(2);
  const std::vector<int> one = StepStageRanges(1);
  EXPECT_EQ(slots(rr.Place(3, true, one)), (V{{0, 0}, {1, 0}, {0, 0}}));
  EXPECT_EQ(slots(rr.Place(3, true, one)), (V{{0, 0}, {1, 1}, {0, 0}}));
  // One device, two forward stages: never right after its own forward stage.
  EXPECT_EQ(slots(StageRoundRobin(1).Place(5, false, two)),
            (V{{0, 0}, {0, 1}, {0, 0}, {0, 1}, {0, 0}}));
}

// A stage whose base is resident uploads its trainable bytes only.
TEST(PipelineSchedules, ResidentBaseUploadsTheTrainableBytes) {
  RoundRobinJob job;
  job.gpus = 2;
  job.micro_batches = 2;
  job.weight_chunks = 1;
  StageCost c{.fwd_s = 1, .bwd_s = 2, .weight_bytes = 100, .trainable_weight_bytes = 3};
  job.forward = {c};
  job.tail = c;
  job.backward = {c};
  job.base_resident = {true, false, true};
  Result<Schedule> s = BuildRoundRobinSchedule(job);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::map<int, double> bytes;  // per stage: its weight uploads' bytes
  for (const SimTask& t : s->tasks) {
    if (t.kind == TaskKind::kWeightUpload) bytes[t.stage] += t.bytes;
  }
  EXPECT_EQ(bytes[0], 3);
  EXPECT_EQ(bytes[1], 100);
  EXPECT_EQ(bytes.count(2) ? bytes[2] : 3.0, 3);  // none when it reuses stage 0's upload
}

// Read ahead (one-step-stale updates): the step neither packs the first range nor uploads the
// first stage's weights, so its first compute starts that upload's time earlier; every other
// stage's uploads are as they were, and a streamed base reads nothing ahead.
TEST(PipelineSchedules, FirstWeightsReadAheadLeaveTheStep) {
  RoundRobinJob job;
  job.gpus = 2;
  job.micro_batches = 2;
  job.weight_chunks = 1;
  StageCost c{.fwd_s = 1, .bwd_s = 2, .weight_bytes = 3e9};
  c.pack = {.seconds = 0.5};
  job.forward = {c, c};
  job.tail = c;
  job.backward = {c, c};
  auto run = [&](bool ahead, bool streamed) {
    RoundRobinJob j = job;
    j.first_weights_ahead = ahead;
    j.streamed_base = streamed;
    std::map<std::string, double> uploads;  // per stage's upload name, its bytes
    int packs = 0;
    double first_compute = -1;
    Result<Schedule> s = BuildRoundRobinSchedule(j);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return std::tuple(uploads, packs, first_compute);
    Result<SimResult> r = Simulate(*s, FastLinks());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return std::tuple(uploads, packs, first_compute);
    for (size_t i = 0; i < s->tasks.size(); ++i) {
      const SimTask& t = s->tasks[i];
      if (t.kind == TaskKind::kWeightUpload) uploads[t.name.substr(0, t.name.find('/'))] += t.bytes;
      packs += t.kind == TaskKind::kWeightPack;
      if (t.name == "F0.0") first_compute = r->timing[i].start_s;
    }
    return std::tuple(uploads, packs, first_compute);
  };
  const auto [uploads, packs, first] = run(false, false);
  const auto [ahead_uploads, ahead_packs, ahead_first] = run(true, false);
  std::map<std::string, double> want = uploads;
  want.erase("WF0");
  EXPECT_TRUE(uploads.contains("WF0"));
  EXPECT_EQ(ahead_uploads, want);
  EXPECT_EQ(ahead_packs, packs - 1);
  EXPECT_NEAR(first - ahead_first, 3.0 + 0.5, 1e-9);  // 3 GB at 1 GB/s, and the packing
  EXPECT_TRUE(std::get<0>(run(true, true)).contains("WF0"));
}

}  // namespace
}  // namespace ferry::plan
