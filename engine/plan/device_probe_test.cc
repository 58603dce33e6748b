// Device probes on a CpuDevice (the code path `ferry probe` runs on each GPU), the merge of a GPU
// measurement into a profile, and — with a GPU — MeasureGpus and ProbeMachine on the real device
// (skipped without one; a failure under FERRY_REQUIRE_GPU). Timings vary: rates are checked to be
// finite and positive, never against a speed.
#include "engine/plan/device_probe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "engine/plan/machine_probe.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/testing/gpu_testing.h"

namespace ferry::plan {
namespace {

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

std::unique_ptr<CpuDevice> SmallCpuDevice() {
  CpuDeviceOptions o;
  o.name = "probe-test";
  o.memory_bytes = size_t(8) << 20;
  o.compute_threads = 2;
  auto d = CpuDevice::Create(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

HardwareProfile Base() {
  HardwareProfile base;
  base.name = "base";
  base.gpu = {"Datasheet GPU",
              2,
              1ull << 34,
              1ull << 30,
              (1ull << 34) - (1ull << 30),
              1e14,
              2e14,
              0.6,
              1e12,
              true,
              "datasheet"};
  base.pcie = {4, 16, 2e10, 2e10, 1e10, 1e10, "datasheet"};
  base.host = {1ull << 36, 1ull << 35, 1e11, 1, 8, "guess"};
  base.nvme = {"", 0, 3e9, 3e9, 1.5e9, 0, "guess"};
  base.optimizer = {1e9, "guess"};
  return base;
}

TEST(DeviceProbe, GemmAndCopyRatesOnCpuDeviceArePositive) {
  auto d = SmallCpuDevice();
  for (DType t : {DType::kF32, DType::kBF16}) {  // bf16 needs the op's scratch on the CPU
    Result<double> flops = ProbeDeviceGemmFlops(*d, t, 48, 2, 1);
    ASSERT_TRUE(flops.ok()) << flops.status().ToString();
    EXPECT_TRUE(PositiveFinite(*flops)) << *flops;
  }
  Result<CopyRates> c = ProbeCopyRates(*d, size_t(1) << 20, 1);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (double v : {c->h2d_pinned, c->d2h_pinned, c->h2d_pageable, c->d2h_pageable, c->device_copy})
    EXPECT_TRUE(PositiveFinite(v)) << v;
  EXPECT_EQ(d->arena_stats().in_use, 0u);  // everything freed
}

TEST(DeviceProbe, MeasurementReplacesGpuAndPcieSectionsAndKeepsTheRest) {
  HardwareProfile p = Base();
  GpuMeasurement m;
  m.model = "Measured GPU";
  m.count = 3;
  m.memory_total_bytes = 80ull << 30;
  m.memory_free_bytes = 79ull << 30;
  m.fp32_flops = 5e13;
  m.bf16_flops = 7e14;
  m.fp16_flops = 7.1e14;
  m.fp16_fp16acc_flops = 7.2e14;
  m.copies = {5e10, 5.1e10, 2e10, 1.9e10, 4e12};
  m.details = "test";
  ApplyGpuMeasurement(m, p);  // link unknown first
  ASSERT_TRUE(ValidateHardwareProfile(p).ok()) << ValidateHardwareProfile(p).ToString();
  EXPECT_EQ(p.gpu.model, "Measured GPU");
  EXPECT_EQ(p.gpu.count, 3);
  EXPECT_EQ(p.gpu.memory_label_bytes, 80ull << 30);
  EXPECT_EQ(p.gpu.memory_usable_bytes, 79ull << 30);
  EXPECT_EQ(p.gpu.memory_reserve_bytes, 1ull << 30);
  EXPECT_DOUBLE_EQ(p.gpu.bf16_flops, 7e14);
  EXPECT_DOUBLE_EQ(p.gpu.fp16_fp16acc_flops, 7.2e14);
  EXPECT_DOUBLE_EQ(p.gpu.matmul_efficiency, kLayerShareOfGemmRate);
  EXPECT_DOUBLE_EQ(p.gpu.memory_bandwidth, 4e12);
  EXPECT_TRUE(p.gpu.peer_access);  // not measured: the base's
  EXPECT_EQ(p.gpu.source.rfind("measured by ferry probe", 0), 0u) << p.gpu.source;
  EXPECT_NE(p.gpu.source.find("fp32 50.0"), std::string::npos) << p.gpu.source;
  EXPECT_DOUBLE_EQ(p.pcie.h2d_pinned, 5e10);
  EXPECT_DOUBLE_EQ(p.pcie.d2h_pinned, 5.1e10);
  EXPECT_DOUBLE_EQ(p.pcie.h2d_pageable, 2e10);
  EXPECT_DOUBLE_EQ(p.pcie.d2h_pageable, 1.9e10);
  EXPECT_EQ(p.pcie.generation, 4);  // not measured: the base's
  EXPECT_EQ(p.pcie.lanes, 16);
  EXPECT_EQ(p.pcie.source.rfind("measured by ferry probe", 0), 0u) << p.pcie.source;
  EXPECT_NE(p.pcie.source.find("not measured"), std::string::npos) << p.pcie.source;
  m.link = {5, 8};
  ApplyGpuMeasurement(m, p);
  EXPECT_EQ(p.pcie.generation, 5);
  EXPECT_EQ(p.pcie.lanes, 8);
  EXPECT_NE(p.pcie.source.find("sysfs"), std::string::npos) << p.pcie.source;
  EXPECT_EQ(p.host.source, "guess");  // other sections untouched
  EXPECT_DOUBLE_EQ(p.optimizer.cpu_adamw_params_per_s, 1e9);

  // Free memory above the total (a driver quirk) cannot make usable exceed the label.
  m.memory_free_bytes = 81ull << 30;
  ApplyGpuMeasurement(m, p);
  EXPECT_EQ(p.gpu.memory_usable_bytes, p.gpu.memory_label_bytes);
  EXPECT_TRUE(ValidateHardwareProfile(p).ok());

  // It survives the JSON round trip `ferry probe` writes and `ferry plan` reads.
  Result<HardwareProfile> back = ParseHardwareProfile(HardwareProfileToJson(p), "probe.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->gpu.source, p.gpu.source);
  EXPECT_DOUBLE_EQ(back->pcie.d2h_pageable, 1.9e10);
}

void WriteFile(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p) << text << "\n";
}

TEST(DeviceProbe, PcieLinkIsTheLowerOfDeviceAndPortFromSysfs) {
  namespace fs = std::filesystem;
  const fs::path root =
      fs::path(::testing::TempDir()) / ("ferry_sysfs_" + std::to_string(::getpid()));
  const fs::path port = root / "devices/pci0000:00/0000:00:01.0";
  const fs::path gpu = port / "0000:c1:00.0";
  fs::create_directories(gpu);
  fs::create_directories(root / "bus");
  WriteFile(gpu / "max_link_speed", "32.0 GT/s PCIe");  // a Gen5 card ...
  WriteFile(gpu / "max_link_width", "16");
  WriteFile(port / "max_link_speed", "16.0 GT/s PCIe");  // ... in a Gen4 x8 slot
  WriteFile(port / "max_link_width", "8");
  fs::create_directory_symlink(gpu, root / "bus/0000:c1:00.0");
  // CUDA's spelling: 8-digit domain, upper case.
  Result<PcieLink> link = ReadPcieLink((root / "bus").string(), "00000000:C1:00.0");
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  EXPECT_EQ(link->generation, 4);
  EXPECT_EQ(link->lanes, 8);
  // A port without link files (the root complex) leaves the device's own link.
  fs::remove(port / "max_link_speed");
  fs::remove(port / "max_link_width");
  link = ReadPcieLink((root / "bus").string(), "0000:c1:00.0");
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  EXPECT_EQ(link->generation, 5);
  EXPECT_EQ(link->lanes, 16);
  EXPECT_EQ(ReadPcieLink((root / "bus").string(), "0000:02:00.0").status().code(),
            StatusCode::kNotFound);
  fs::remove_all(root);
}

TEST(DeviceProbe, WithoutGpuMeasureGpusIsUnavailableAndProbeKeepsBase) {
  if (testing::NoGpuReason().empty()) GTEST_SKIP() << "a GPU is visible (CudaMachineProbe runs)";
  GpuProbeOptions g;
  Result<GpuMeasurement> m = MeasureGpus(g);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable) << m.status().ToString();

  ProbeOptions o;
  o.threads = 1;
  o.gemm_n = 32;
  o.triad_bytes = size_t(1) << 20;
  o.adamw_params = 4096;
  std::string report;
  Result<HardwareProfile> p = ProbeMachine(o, Base(), &report);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->gpu.model, "Datasheet GPU");
  EXPECT_EQ(p->gpu.source.rfind("not measured (", 0), 0u) << p->gpu.source;
  EXPECT_NE(p->gpu.source.find(m.status().message()), std::string::npos) << p->gpu.source;
  EXPECT_EQ(p->pcie.source.rfind("not measured (", 0), 0u) << p->pcie.source;
  EXPECT_NE(report.find("not measured"), std::string::npos) << report;
}

TEST(CudaMachineProbe, MeasuresEveryGpuAndWritesAValidProfile) {
  FERRY_SKIP_WITHOUT_GPU();
  ProbeOptions o;
  o.threads = 2;
  o.gemm_n = 64;
  o.triad_bytes = size_t(1) << 20;
  o.adamw_params = 4096;
  o.gpu.gemm_n = 1024;
  o.gpu.gemm_launches = 2;
  o.gpu.copy_bytes = size_t(32) << 20;
  o.gpu.repeats = 1;
  Result<GpuMeasurement> m = MeasureGpus(o.gpu);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_GE(m->count, 1);
  EXPECT_FALSE(m->model.empty());
  EXPECT_GT(m->memory_free_bytes, 0u);
  EXPECT_LE(m->memory_free_bytes, m->memory_total_bytes);
  for (double v : {m->fp32_flops, m->bf16_flops, m->fp16_flops, m->fp16_fp16acc_flops,
                   m->copies.h2d_pinned, m->copies.d2h_pinned, m->copies.h2d_pageable,
                   m->copies.d2h_pageable, m->copies.device_copy}) {
    EXPECT_TRUE(PositiveFinite(v)) << v;
  }

  std::string report;
  Result<HardwareProfile> p = ProbeMachine(o, Base(), &report);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(ValidateHardwareProfile(*p).ok());
  EXPECT_EQ(p->gpu.count, m->count);
  EXPECT_EQ(p->gpu.model, m->model);
  EXPECT_EQ(p->gpu.source.rfind("measured by ferry probe", 0), 0u) << p->gpu.source;
  EXPECT_EQ(p->pcie.source.rfind("measured by ferry probe", 0), 0u) << p->pcie.source;
  EXPECT_NE(report.find("PCIe: pinned"), std::string::npos) << report;
  std::printf("%s\n", report.c_str());
}

}  // namespace
}  // namespace ferry::plan
