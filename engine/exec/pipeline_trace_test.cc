// The pipeline executor's trace (engine/exec/trace_recorder.h) on 2 CPU devices, planned as
// `ferry train --devices 2` plans them: the lanes and names of the plan's predicted timeline,
// every stage's tasks, spans that do not overlap on a stream, and cross-device hand-offs in
// order. No timing is asserted: only what the streams' ordering guarantees.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "engine/exec/trace_recorder.h"
#include "engine/json.h"
#include "engine/model/master_weights.h"
#include "engine/plan/pipeline_schedules.h"
#include "engine/plan/timeline_writers.h"
#include "engine/train/training_runner.h"

namespace ferry::exec {
namespace {

using plan::LaneKind;

struct Traced {
  ModelConfig model;
  TrainingRunner run;
};

// Two steps of the tiny model, 3 micro-batches, on 2 CPU devices with a trace.
void RunTwoTracedSteps(Traced& t) {
  JobSpec job;
  job.batch_size = 3;
  job.micro_batches = 3;
  job.seq_len = 32;
  job.devices = 2;
  job.steps = 2;
  Result<ModelConfig> model = ResolveModel(job);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  t.model = *model;
  Result<TrainingRunner> run = CreateTrainingRunner(job, t.model, /*threads=*/1, /*trace=*/true);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  t.run = std::move(*run);
  ASSERT_TRUE(t.run.plan && t.run.trace);
  const std::vector<LayerSpec> layers = BuildLayerSpecs(t.model, job.lora);
  Result<HostTensors> weights = InitialWeights(job.model, t.model, layers, 1);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  HostTensors grads;
  for (const LayerSpec& l : layers) {
    for (const ParamSpec& p : l.params) {
      if (p.trainable && p.tied_to.empty()) grads.tensors[p.name].resize(size_t(p.numel()));
    }
  }
  ASSERT_TRUE(t.run.runner->UploadWeights(*weights).ok());
  const size_t tokens = size_t(job.micro_batch_size() * job.seq_len);
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> ids(size_t(job.micro_batches));
  std::vector<MicroBatchInput> batches;
  for (std::vector<int32_t>& v : ids) {
    for (size_t n = 0; n < tokens; ++n) v.push_back(int32_t(rng() % uint32_t(t.model.vocab_size)));
    batches.push_back({.tokens = v, .targets = v, .normalizer = double(3 * tokens)});
  }
  batches[0].overwrite_grads = true;
  for (int step = 0; step < 2; ++step) {
    Result<double> loss = t.run.runner->AccumulateStep(batches, grads, {});
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  }
}

class PipelineTraceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    traced_ = new Traced;
    RunTwoTracedSteps(*traced_);
  }
  static void TearDownTestSuite() {
    delete traced_;
    traced_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(traced_ != nullptr && traced_->run.trace != nullptr) << "the traced run failed";
  }
  static const plan::Plan& Plan() { return *traced_->run.plan; }
  static std::vector<TraceSpan> Spans() { return traced_->run.trace->spans(); }
  static Traced* traced_;
};
Traced* PipelineTraceTest::traced_ = nullptr;

// The micro-batches stage k of a step runs: a part of the tail (plan.tail_parts) its share, every
// other stage all of them.
std::pair<int, int> MicroBatchesOf(const plan::Plan& p, int k) {
  const int S = int(p.stages.size()), P = p.tail_parts, M = p.micro_batches;
  if (k < S || k >= S + P) return {0, M};
  return {(k - S) * M / P, (k - S + 1) * M / P};
}

TEST_F(PipelineTraceTest, EveryStageOfEveryStepHasItsTasksOnItsDevicesLanes) {
  const int S = int(Plan().stages.size()), M = Plan().micro_batches, P = Plan().tail_parts;
  const int K = 2 * S + P;
  ASSERT_EQ(Plan().gpus, 2);
  ASSERT_GE(M, 3);
  // name -> (step -> lanes)
  std::map<std::string, std::map<int64_t, std::set<std::pair<int, int>>>> seen;
  for (const TraceSpan& s : Spans()) {
    EXPECT_GE(s.end_s, s.start_s) << s.name;
    EXPECT_GE(s.start_s, 0) << s.name;
    seen[s.name][s.step].insert({int(s.lane.kind), s.lane.gpu});
  }
  // Stage k of step s runs on device (s K + k) mod 2: the round robin's counter runs on across
  // steps.
  auto expect = [&](const std::string& name, LaneKind lane, int k) {
    for (int64_t step = 0; step < 2; ++step) {
      const int gpu = k < 0 ? 0 : int((step * K + k) % 2);
      EXPECT_TRUE(seen[name][step].count({int(lane), gpu}))
          << name << " step " << step << " on " << plan::LaneLabel({lane, gpu});
    }
  };
  // Both steps' weight slots, as the executor places them.
  const std::vector<int> ranges = plan::StepStageRanges(S, P);
  plan::StageRoundRobin placement(2);
  std::vector<std::vector<plan::StageRoundRobin::Placement>> placed;
  for (int step = 0; step < 2; ++step) placed.push_back(placement.Place(K, false, ranges));
  for (int k = 0; k < K; ++k) {
    const char letter = k < S ? 'F' : k < S + P ? 'T' : 'B';
    const auto [first, last] = MicroBatchesOf(Plan(), k);
    for (int m = first; m < last; ++m) {
      expect(plan::RoundRobinTaskName(letter, k, S, m, P), LaneKind::kCompute, k);
      expect(plan::RoundRobinTaskName('I', k, S, m, P), LaneKind::kHostToDevice, k);
      if (k + 1 < K) {
        expect(plan::RoundRobinTaskName('O', k, S, m, P), LaneKind::kDeviceToHost, k);
      }
    }
    // A backward stage whose slot held its forward stage's weights last (as plan::StageRoundRobin
    // places them) copies none, as the schedule says (pipeline_schedules.h).
    const std::string w = plan::RoundRobinTaskName('W', k, S, -1, P) + "/0";
    for (int64_t step = 0; step < 2; ++step) {
      const std::vector<plan::StageRoundRobin::Placement>& at = placed[size_t(step)];
      int before = -1;  // the stage before k in its slot this step
      for (int j = 0; j < k; ++j) {
        if (at[size_t(j)].device == at[size_t(k)].device &&
            at[size_t(j)].slot == at[size_t(k)].slot) {
          before = j;
        }
      }
      const bool held = k >= S + P && before >= 0 && ranges[size_t(before)] == ranges[size_t(k)];
      EXPECT_EQ(seen[w][step].empty(), held) << w << " step " << step;
      if (!held) {
        EXPECT_TRUE(seen[w][step].count({int(LaneKind::kHostToDevice), at[size_t(k)].device}))
            << w << " step " << step;
      }
    }
    if (k >= S) expect(plan::RoundRobinTaskName('G', k, S, -1, P), LaneKind::kDeviceToHost, k);
  }
  for (int m = 0; m < M; ++m) {
    expect("E." + std::to_string(m), LaneKind::kHostMemory, -1);
    expect("EB." + std::to_string(m), LaneKind::kHostMemory, -1);
  }
  // Both steps enqueue the same tasks, and the second creates no events: it reuses the first
  // one's.
  std::map<int64_t, int> per_step;
  for (const TraceSpan& s : Spans()) ++per_step[s.step];
  EXPECT_EQ(per_step.size(), 2u);
  EXPECT_EQ(per_step[0], per_step[1]);
  EXPECT_EQ(traced_->run.trace->events_created_after_first_step(), 0);
}

// A stream runs its work in order: the spans of one device's lane never overlap (both ends come
// from the same device clock, so this holds exactly).
TEST_F(PipelineTraceTest, TasksOnOneStreamDoNotOverlap) {
  std::map<std::pair<int, int>, std::vector<TraceSpan>> lanes;
  for (const TraceSpan& s : Spans()) {
    if (plan::IsPerGpuLane(s.lane.kind)) lanes[{s.lane.gpu, int(s.lane.kind)}].push_back(s);
  }
  EXPECT_EQ(lanes.size(), 6u);  // 2 devices x compute, upload, download
  for (auto& [lane, spans] : lanes) {
    std::sort(spans.begin(), spans.end(),
              [](const TraceSpan& a, const TraceSpan& b) { return a.start_s < b.start_s; });
    for (size_t i = 1; i < spans.size(); ++i) {
      EXPECT_GE(spans[i].start_s, spans[i - 1].end_s)
          << spans[i].name << " starts before " << spans[i - 1].name << " ends on "
          << plan::LaneLabel({LaneKind(lane.second), lane.first});
    }
  }
}

// Stage k's uploads of micro-batch m wait for stage k-1's downloads of m (a cross-device event
// wait): every such upload starts after every such download ended, up to the producer's clock
// mapping error (device times are mapped onto the host clock never early, at most that late; the
// larger device's is taken).
TEST_F(PipelineTraceTest, HandOffsBetweenDevicesAreOrdered) {
  const int S = int(Plan().stages.size()), M = Plan().micro_batches, P = Plan().tail_parts;
  const int K = 2 * S + P;
  const std::vector<TraceSpan> spans = Spans();
  int checked = 0;
  for (int64_t step = 0; step < 2; ++step) {
    for (int k = 1; k < K; ++k) {
      const auto [first, last] = MicroBatchesOf(Plan(), k);
      for (int m = first; m < last; ++m) {
        int from = k - 1;  // the stage before k that ran m (a tail's part, or the last forward)
        while (m < MicroBatchesOf(Plan(), from).first || m >= MicroBatchesOf(Plan(), from).second) {
          --from;
        }
        const std::string in = plan::RoundRobinTaskName('I', k, S, m, P),
                          out = plan::RoundRobinTaskName('O', from, S, m, P);
        const double error =
            std::max(traced_->run.trace->clock_error_s(0), traced_->run.trace->clock_error_s(1));
        for (const TraceSpan& u : spans) {
          if (u.step != step || u.name != in) continue;
          for (const TraceSpan& d : spans) {
            if (d.step != step || d.name != out) continue;
            EXPECT_GE(u.start_s, d.end_s - error) << in << " starts before " << out << " ends";
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GE(checked, 2 * 2 * S * M);  // every stage but the first, the tail's parts M together
}

// The measured trace is written by `ferry plan --trace`'s writer: the JSON parses, and its
// processes, lanes and compute task names are those of the plan's predicted timeline.
TEST_F(PipelineTraceTest, JsonHasThePredictedTimelinesLanesAndNames) {
  const nlohmann::json measured =
      nlohmann::json::parse(traced_->run.trace->ChromeTraceJson(), nullptr, false);
  ASSERT_FALSE(measured.is_discarded());
  const plan::HardwareProfile hw = CpuDevicesProfile(2, Plan().memory.gpu.total());
  Result<plan::Schedule> schedule =
      plan::BuildRoundRobinSchedule(plan::RoundRobinJobOf(traced_->model, Plan(), hw));
  ASSERT_TRUE(schedule.ok()) << schedule.status().ToString();
  Result<plan::SimResult> sim = plan::Simulate(*schedule, plan::LaneRatesFromProfile(hw, true));
  ASSERT_TRUE(sim.ok()) << sim.status().ToString();
  const nlohmann::json predicted = nlohmann::json::parse(plan::ChromeTraceJson(*schedule, *sim));
  // (pid, tid) -> lane name; process names; compute task names.
  struct Doc {
    std::map<std::pair<int, int>, std::string> lanes;
    std::map<int, std::string> processes;
    std::set<std::string> compute;
  };
  auto read = [](const nlohmann::json& j) {
    Doc d;
    for (const nlohmann::json& e : j["traceEvents"]) {
      const int pid = e["pid"].get<int>(), tid = e["tid"].get<int>();
      const std::string name = e["name"].get<std::string>();
      if (name == "thread_name") d.lanes[{pid, tid}] = e["args"]["name"].get<std::string>();
      if (name == "process_name") d.processes[pid] = e["args"]["name"].get<std::string>();
      if (e["ph"] == "X" && tid == int(LaneKind::kCompute) && pid < 2) d.compute.insert(name);
    }
    return d;
  };
  const Doc want = read(predicted), got = read(measured);
  EXPECT_EQ(got.processes, want.processes);
  for (const auto& [lane, name] : want.lanes) {
    if (lane.first == 2) continue;  // host lanes: the optimizer's comes from the trainer
    EXPECT_EQ(got.lanes.count(lane) ? got.lanes.at(lane) : "(none)", name)
        << "pid " << lane.first << " tid " << lane.second;
  }
  EXPECT_EQ(got.lanes.at({2, int(LaneKind::kHostMemory)}), "host memory");
  // The same compute tasks: a stage's gradient zeroing is traced as its micro-batch 0 ("B0.0").
  EXPECT_EQ(got.compute, want.compute);
  // Every measured span carries its step.
  for (const nlohmann::json& e : measured["traceEvents"]) {
    if (e["ph"] == "X") {
      EXPECT_TRUE(e["args"].contains("step")) << e.dump();
    }
  }
}

// The trainer's optimizer lane: a layer's update is named after the stage whose gradients it
// needs, as the plan names the update ("UB<s>", "UT" for the head).
TEST_F(PipelineTraceTest, OptimizerSpansAreNamedAsThePlansUpdates) {
  TraceRecorder trace(Plan(), 1);  // its own: the run's stays as the executor left it
  const int S = int(Plan().stages.size()), layers = int(Plan().recompute.size());
  const int P = Plan().tail_parts;
  // The head's: with the tail's last part ("UT" in one part, "UT<p>" in several).
  EXPECT_EQ(trace.UpdateTask(layers - 1).name, P == 1 ? "UT" : "UT" + std::to_string(P - 1));
  EXPECT_EQ(trace.UpdateTask(0).stage, 2 * S + P - 1);  // the embedding: the last backward stage
  for (int f = 0; f < S; ++f) {
    const int k = 2 * S + P - 1 - f;
    EXPECT_EQ(trace.UpdateTask(Plan().stages[size_t(f)].first).name,
              plan::RoundRobinTaskName('U', k, S, -1, P));
  }
  { HostSpan span = OptimizerSpan(&trace, 1); }
  { HostSpan none = OptimizerSpan(nullptr, 1); }
  const std::vector<TraceSpan> after = trace.spans();
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after.back().lane.kind, LaneKind::kCpuOptimizer);
  EXPECT_EQ(after.back().kind, plan::TaskKind::kOptimizer);
  EXPECT_EQ(after.back().name, trace.UpdateTask(1).name);
  EXPECT_GE(after.back().end_s, after.back().start_s);
}

}  // namespace
}  // namespace ferry::exec
