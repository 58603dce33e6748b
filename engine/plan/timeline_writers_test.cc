#include "engine/plan/timeline_writers.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "engine/json.h"
#include "engine/plan/pipeline_schedules.h"
#include "offload/file_io.h"

namespace ferry::plan {
namespace {

namespace fs = std::filesystem;

// A small realistic-looking job: 2 GPUs, 6 micro-batches, transfers, weights and optimizer.
struct Simulated {
  Schedule schedule;
  SimResult result;
};
Simulated RoundRobinExample() {
  RoundRobinJob job;
  job.gpus = 2;
  job.micro_batches = 6;
  for (int i = 0; i < 3; ++i) {
    StageCost f;
    f.fwd_s = 0.010;
    f.weight_bytes = 150e6;
    f.input_bytes = 16e6;
    f.output_bytes = 16e6;
    job.forward.push_back(f);
    StageCost b;
    b.bwd_s = 0.030;
    b.weight_bytes = 150e6;
    b.input_bytes = 32e6;
    b.output_bytes = 16e6;
    b.grad_bytes = 300e6;
    b.param_count = 75e6;
    job.backward.push_back(b);
  }
  job.tail.fwd_s = 0.008;
  job.tail.bwd_s = 0.012;
  job.tail.weight_bytes = 250e6;
  job.tail.input_bytes = 16e6;
  job.tail.output_bytes = 16e6;
  job.tail.grad_bytes = 500e6;
  job.tail.param_count = 125e6;
  LaneRates rates;
  rates.host_to_device = 23.2e9;
  rates.device_to_host = 26.0e9;
  rates.host_memory = 60e9;
  rates.cpu_optimizer = 1.6e9 * kAdamWBytesPerParameter;
  rates.nvme_read = 7e9;
  rates.nvme_write = 6.6e9;
  Result<Schedule> s = BuildRoundRobinSchedule(job);
  EXPECT_TRUE(s.ok());
  Result<SimResult> r = Simulate(*s, rates);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return {*s, *r};
}

// Minimal XML structure check: every element closes, in order, and one root remains.
::testing::AssertionResult WellFormed(const std::string& xml) {
  std::vector<std::string> stack;
  int roots = 0;
  for (size_t i = xml.find('<'); i != std::string::npos; i = xml.find('<', i + 1)) {
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unclosed '<' at " << i;
    const std::string tag = xml.substr(i + 1, end - i - 1);
    if (tag.empty()) return ::testing::AssertionFailure() << "empty tag at " << i;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) {
        return ::testing::AssertionFailure() << "mismatched </" << tag.substr(1) << "> at " << i;
      }
      stack.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    if (stack.empty()) ++roots;
    if (tag.back() != '/') stack.push_back(name);
    if (tag.find('<') != std::string::npos) return ::testing::AssertionFailure() << "'<' in tag";
  }
  if (!stack.empty()) return ::testing::AssertionFailure() << "<" << stack.back() << "> unclosed";
  if (roots != 1) return ::testing::AssertionFailure() << roots << " root elements";
  return ::testing::AssertionSuccess();
}

TEST(TimelineWriters, SvgIsWellFormedAndLabelled) {
  const Simulated sim = RoundRobinExample();
  const std::string svg = TimelineSvg(sim.schedule, sim.result, {"round-robin example", 1400});
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_TRUE(WellFormed(svg));
  for (const char* text : {"GPU 0 compute", "GPU 1 host-&gt;device", "GPU 1 device-&gt;host",
                           "CPU optimizer", "forward", "backward", "weight upload",
                           "gradient download", "idle", "time (ms)", "bubble fraction"}) {
    EXPECT_NE(svg.find(text), std::string::npos) << "missing " << text;
  }
  // One bar per task that took time.
  size_t bars = 0;
  for (size_t i = 0; i < sim.schedule.tasks.size(); ++i) {
    bars += sim.result.timing[i].end_s > sim.result.timing[i].start_s;
  }
  size_t titles = 0;
  for (size_t at = svg.find("<title>"); at != std::string::npos; at = svg.find("<title>", at + 1)) {
    ++titles;
  }
  EXPECT_EQ(titles, bars);

  // Written where a person can look at it (converted to PNG and checked by eye when changed).
  const fs::path dir = fs::temp_directory_path() / "ferry_timeline_test";
  fs::create_directories(dir);
  ASSERT_TRUE(WriteTextFile((dir / "round_robin.svg").string(), svg).ok());
  std::ifstream back(dir / "round_robin.svg");
  std::stringstream text;
  text << back.rdbuf();
  EXPECT_EQ(text.str(), svg);
}

TEST(TimelineWriters, ChromeTraceHasOneCompleteEventPerTask) {
  const Simulated sim = RoundRobinExample();
  const nlohmann::json doc = nlohmann::json::parse(ChromeTraceJson(sim.schedule, sim.result));
  ASSERT_TRUE(doc.contains("traceEvents"));
  size_t complete = 0;
  bool host_named = false;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      EXPECT_GE(e["ts"].get<double>(), 0.0);
      EXPECT_LE(e["pid"].get<int>(), sim.schedule.gpus);
    } else if (e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == "host") {
      host_named = true;
    }
  }
  EXPECT_EQ(complete, sim.schedule.tasks.size());
  EXPECT_TRUE(host_named);
  EXPECT_NEAR(doc["otherData"]["makespan_s"].get<double>(), sim.result.makespan_s, 0.0);
}

}  // namespace
}  // namespace ferry::plan
