#include "engine/probe/machine_probe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

namespace ferry::plan {
namespace {

// Timings vary; the probes must return finite, positive rates at small sizes, and a profile that
// validates and keeps the base's GPU figures.
TEST(MachineProbe, SmallProbesReturnPositiveRates) {
  Result<double> gemm = ProbeGemmFlops(1, 64, 1);
  ASSERT_TRUE(gemm.ok()) << gemm.status().message();
  EXPECT_TRUE(std::isfinite(*gemm) && *gemm > 0);
  Result<double> triad = ProbeTriadBandwidth(2, size_t(1) << 20, 1);
  ASSERT_TRUE(triad.ok()) << triad.status().message();
  EXPECT_TRUE(std::isfinite(*triad) && *triad > 0);
  Result<double> adamw = ProbeAdamWRate(1, 4096, 1);
  ASSERT_TRUE(adamw.ok()) << adamw.status().message();
  EXPECT_TRUE(std::isfinite(*adamw) && *adamw > 0);
}

TEST(MachineProbe, ProfileKeepsBaseGpuAndMeasuresNvme) {
  HardwareProfile base;
  base.name = "base";
  base.gpu = {"GPU", 2,    1ull << 34, 1ull << 30, (1ull << 34) - (1ull << 30), 1e14, 0,
              0.6,   1e12, false,      "datasheet"};
  base.pcie = {4, 16, 2e10, 2e10, 1e10, 1e10, "measured"};
  base.host = {1ull << 36, 1ull << 35, 1e11, 1, 8, "guess"};
  base.nvme = {"", 0, 3e9, 3e9, 1.5e9, 0, "guess"};
  base.optimizer = {1e9, "guess"};
  ProbeOptions o;
  o.threads = 2;
  o.gemm_n = 64;
  o.triad_bytes = size_t(1) << 20;
  o.adamw_params = 4096;
  o.measure_gpus = false;  // the base's GPU figures even where a GPU exists
  const std::string dir = ::testing::TempDir() + "/ferry_probe_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  o.nvme_dir = dir;
  o.nvme_bytes = size_t(4) << 20;
  Result<HardwareProfile> p = ProbeMachine(o, base);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->gpu.count, 2);
  EXPECT_NE(p->gpu.source.find("not measured"), std::string::npos);
  EXPECT_NE(p->pcie.source.find("not measured"), std::string::npos);
  EXPECT_DOUBLE_EQ(p->pcie.h2d_pinned, 2e10);
  EXPECT_GT(p->host.ram_bytes, 0u);
  EXPECT_LE(p->host.ram_usable_bytes, p->host.ram_bytes);
  EXPECT_EQ(p->host.cpu_cores, 2);
  EXPECT_TRUE(p->HasNvme());
  EXPECT_GT(p->nvme.read_rate, 0);
  EXPECT_GT(p->nvme.write_rate, 0);
}

}  // namespace
}  // namespace ferry::plan
