#include "engine/plan/simulator.h"

#include <gtest/gtest.h>

namespace ferry::plan {
namespace {

// Times here are sums of a few doubles; 1e-12 relative covers their rounding.
constexpr double kTol = 1e-12;

SimTask Compute(const char* name, int gpu, double seconds, std::vector<int> deps = {}) {
  SimTask t;
  t.name = name;
  t.kind = TaskKind::kForward;
  t.lane = {LaneKind::kCompute, gpu};
  t.duration_s = seconds;
  t.deps = std::move(deps);
  return t;
}

SimTask Transfer(const char* name, LaneKind kind, int gpu, double bytes, std::vector<int> deps) {
  SimTask t;
  t.name = name;
  t.kind = TaskKind::kActivationUpload;
  t.lane = {kind, gpu};
  t.bytes = bytes;
  t.deps = std::move(deps);
  return t;
}

LaneRates Rates(double pcie, double host) {
  LaneRates r;
  r.host_to_device = r.device_to_host = pcie;
  r.host_memory = host;
  r.cpu_optimizer = r.nvme_read = r.nvme_write = 1.0;
  return r;
}

TEST(Simulator, OneGpuTwoEqualStagesRunBackToBack) {
  Schedule s;
  s.name = "two stages";
  const int a = s.Add(Compute("S0", 0, 2.0));
  s.Add(Compute("S1", 0, 2.0, {a}));
  Result<SimResult> r = Simulate(s, Rates(1, 1));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->makespan_s, 4.0, kTol);
  EXPECT_NEAR(r->timing[1].start_s, 2.0, kTol);
  EXPECT_NEAR(r->gpu_bubble_fraction[0], 0.0, kTol);
  EXPECT_NEAR(r->BusySeconds({LaneKind::kCompute, 0}), 4.0, kTol);
}

TEST(Simulator, LaneOrderSerializesIndependentTasks) {
  Schedule s;
  s.Add(Compute("A", 0, 1.0));
  s.Add(Compute("B", 0, 3.0));  // no dependency, but the lane is a stream
  Result<SimResult> r = Simulate(s, Rates(1, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->timing[1].start_s, 1.0, kTol);
  EXPECT_NEAR(r->makespan_s, 4.0, kTol);
}

TEST(Simulator, ChainWithTransfersAddsTheirTime) {
  // GPU0 computes 1 s, downloads 10 GB at 10 GB/s, GPU1 uploads it at 5 GB/s, computes 1 s.
  Schedule s;
  s.gpus = 2;
  const int c0 = s.Add(Compute("C0", 0, 1.0));
  const int d = s.Add(Transfer("D", LaneKind::kDeviceToHost, 0, 10e9, {c0}));
  LaneRates rates = Rates(10e9, 1e12);
  rates.host_to_device = 5e9;
  const int u = s.Add(Transfer("U", LaneKind::kHostToDevice, 1, 10e9, {d}));
  s.Add(Compute("C1", 1, 1.0, {u}));
  Result<SimResult> r = Simulate(s, rates);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->timing[d].end_s, 2.0, kTol);
  EXPECT_NEAR(r->timing[u].end_s, 4.0, kTol);
  EXPECT_NEAR(r->makespan_s, 5.0, kTol);
  EXPECT_NEAR(r->gpu_bubble_fraction[0], 0.8, kTol);  // busy 1 s of 5
  EXPECT_NEAR(r->gpu_bubble_fraction[1], 0.8, kTol);
  EXPECT_NEAR(r->BusySeconds({LaneKind::kDeviceToHost, 0}), 1.0, kTol);
}

TEST(Simulator, TwoConcurrentHostTransfersShareBandwidthFairly) {
  Schedule s;
  s.Add(Transfer("A", LaneKind::kHostMemory, 0, 10e9, {}));
  s.Add(Transfer("B", LaneKind::kHostMemory, 0, 10e9, {}));
  Result<SimResult> one_alone = [&] {
    Schedule single;
    single.Add(Transfer("A", LaneKind::kHostMemory, 0, 10e9, {}));
    return Simulate(single, Rates(1, 10e9));
  }();
  Result<SimResult> r = Simulate(s, Rates(1, 10e9));
  ASSERT_TRUE(r.ok() && one_alone.ok());
  EXPECT_NEAR(one_alone->makespan_s, 1.0, kTol);
  EXPECT_NEAR(r->timing[0].end_s, 2.0, kTol);  // twice as long, both end together
  EXPECT_NEAR(r->timing[1].end_s, 2.0, kTol);
  EXPECT_NEAR(r->BusySeconds({LaneKind::kHostMemory, 0}), 2.0, kTol);
}

TEST(Simulator, PcieTransfersOfTwoGpusShareHostBandwidthMaxMin) {
  // Links of 8 GB/s each; host 10 GB/s: each gets 5 GB/s while both run.
  Schedule s;
  s.gpus = 2;
  s.Add(Transfer("U0", LaneKind::kHostToDevice, 0, 10e9, {}));
  s.Add(Transfer("U1", LaneKind::kHostToDevice, 1, 10e9, {}));
  Result<SimResult> r = Simulate(s, Rates(8e9, 10e9));
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->makespan_s, 2.0, kTol);
  // A capped user leaves its unused share to others: a 2 GB/s-capped optimizer next to a
  // transfer on a 10 GB/s host lets the transfer run at its full 8 GB/s.
  Schedule t;
  SimTask opt = Transfer("opt", LaneKind::kCpuOptimizer, 0, 2e9, {});
  t.Add(opt);
  t.Add(Transfer("U0", LaneKind::kHostToDevice, 0, 8e9, {}));
  LaneRates rates = Rates(8e9, 10e9);
  rates.cpu_optimizer = 2e9;
  Result<SimResult> q = Simulate(t, rates);
  ASSERT_TRUE(q.ok());
  EXPECT_NEAR(q->timing[1].end_s, 1.0, kTol);
  EXPECT_NEAR(q->timing[0].end_s, 1.0, kTol);
}

TEST(Simulator, PcieCopiesOfOneNumaNodeShareItsCap) {
  // Four GPUs on two nodes, links of 8 GB/s each way, host 100 GB/s (not binding), 10 GB/s per
  // node for all PCIe copies. GPUs 0 and 1 (node 0) upload and download at once: four copies
  // share 10 GB/s, 2.5 each, so 5 GB each takes 2 s. GPU 2 (node 1) alone runs at its 8 GB/s.
  Schedule s;
  s.gpus = 4;
  s.Add(Transfer("U0", LaneKind::kHostToDevice, 0, 5e9, {}));
  s.Add(Transfer("D0", LaneKind::kDeviceToHost, 0, 5e9, {}));
  s.Add(Transfer("U1", LaneKind::kHostToDevice, 1, 5e9, {}));
  s.Add(Transfer("D1", LaneKind::kDeviceToHost, 1, 5e9, {}));
  s.Add(Transfer("U2", LaneKind::kHostToDevice, 2, 8e9, {}));
  LaneRates rates = Rates(8e9, 100e9);
  rates.pcie_shared_per_node = 10e9;
  rates.numa_nodes = 2;
  Result<SimResult> r = Simulate(s, rates);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(r->timing[i].end_s, 2.0, kTol) << i;
  EXPECT_NEAR(r->timing[4].end_s, 1.0, kTol);
  // Without the cap every link runs at its own rate.
  rates.pcie_shared_per_node = 0;
  Result<SimResult> free = Simulate(s, rates);
  ASSERT_TRUE(free.ok());
  EXPECT_NEAR(free->timing[0].end_s, 5.0 / 8.0, kTol);
  // The cap comes from the profile's host_links.
  HardwareProfile h;
  h.host.numa_nodes = 2;
  h.host_links.shared_bandwidth_per_node = 150e9;
  const LaneRates from = LaneRatesFromProfile(h);
  EXPECT_DOUBLE_EQ(from.pcie_shared_per_node, 150e9);
  EXPECT_EQ(from.numa_nodes, 2);
}

TEST(Simulator, RatesRecomputeWhenATransferEnds) {
  // A (5 GB) and B (15 GB) share 10 GB/s: A ends at 1 s; B then runs alone: 10 GB left -> 2 s.
  Schedule s;
  s.Add(Transfer("A", LaneKind::kHostMemory, 0, 5e9, {}));
  s.Add(Transfer("B", LaneKind::kHostMemory, 0, 15e9, {}));
  Result<SimResult> r = Simulate(s, Rates(1, 10e9));
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->timing[0].end_s, 1.0, kTol);
  EXPECT_NEAR(r->timing[1].end_s, 2.0, kTol);
}

TEST(Simulator, ZeroWorkTasksFinishAtOnce) {
  Schedule s;
  const int a = s.Add(Compute("A", 0, 1.0));
  const int z = s.Add(Transfer("Z", LaneKind::kHostToDevice, 0, 0, {a}));
  s.Add(Compute("B", 0, 1.0, {z}));
  Result<SimResult> r = Simulate(s, Rates(1, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->makespan_s, 2.0, kTol);
}

TEST(Simulator, RejectsBadTasksAndCycles) {
  Schedule bad_dep;
  bad_dep.Add(Compute("A", 0, 1.0, {5}));
  EXPECT_EQ(Simulate(bad_dep, Rates(1, 1)).status().code(), StatusCode::kInvalidArgument);

  Schedule bad_gpu;
  bad_gpu.Add(Compute("A", 3, 1.0));
  EXPECT_EQ(Simulate(bad_gpu, Rates(1, 1)).status().code(), StatusCode::kInvalidArgument);

  Schedule no_rate;
  no_rate.Add(Transfer("A", LaneKind::kHostToDevice, 0, 1.0, {}));
  EXPECT_EQ(Simulate(no_rate, Rates(0, 1)).status().code(), StatusCode::kInvalidArgument);

  Schedule cycle;  // B is first on the lane but waits for A, which is behind it
  cycle.Add(Compute("B", 0, 1.0, {1}));
  cycle.Add(Compute("A", 0, 1.0));
  Result<SimResult> r = Simulate(cycle, Rates(1, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("cycle"), std::string::npos);
}

}  // namespace
}  // namespace ferry::plan
