// Device probes on a CpuDevice (the code path `ferry probe` runs on each GPU), the merge of a GPU
// measurement into a profile, and — with a GPU — MeasureGpus and ProbeMachine on the real device
// (skipped without one; a failure under FERRY_REQUIRE_GPU). Timings vary: rates are checked to be
// finite and positive, never against a speed.
#include "engine/probe/device_probe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/probe/machine_probe.h"
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

// TimeRuns calls the step warmup + runs times and returns one positive figure per timed run; the
// device is synchronized inside every run (each step finds the work the previous one enqueued
// done); a step's error, or one the device reports at the synchronize, comes back naming the run.
TEST(DeviceProbe, TimeRunsTimesEveryRunAndSynchronizesTheDevice) {
  auto d = SmallCpuDevice();
  std::atomic<int> done{0};
  int calls = 0;
  const auto step = [&]() -> Status {
    EXPECT_EQ(done.load(), calls) << "run " << calls << " started before the last one finished";
    ++calls;
    return d->LaunchHostFunc(StreamId::kCompute, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      done.fetch_add(1);
      return Status::Ok();
    });
  };
  Result<std::vector<double>> s = TimeRuns(*d, 2, 5, step);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(done.load(), 7);
  ASSERT_EQ(s->size(), 5u);
  for (double v : *s) EXPECT_TRUE(PositiveFinite(v)) << v;
  EXPECT_EQ(BestOf(*s), *std::min_element(s->begin(), s->end()));

  Result<std::vector<double>> failed = TimeRuns(*d, 1, 3, [&]() -> Status {
    return calls++ == 9 ? Status::IOError("step broke") : Status::Ok();  // the 2nd timed run
  });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kIOError);
  EXPECT_EQ(failed.status().message(), "timed run 2 of 3: step broke");
  // An error of the enqueued work surfaces at the run's synchronize.
  failed = TimeRuns(*d, 1, 1, [&] {
    return d->LaunchHostFunc(StreamId::kCompute, [] { return Status::Corruption("bad bytes"); });
  });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(failed.status().message().rfind("warm-up run 1 of 1: ", 0), 0u)
      << failed.status().message();
  EXPECT_NE(failed.status().message().find("bad bytes"), std::string::npos)
      << failed.status().message();
  EXPECT_EQ(TimeRuns(*d, 0, 0, step).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TimeRuns(*d, -1, 1, step).status().code(), StatusCode::kInvalidArgument);
}

// Several steps per run are called in order in every run and timed apart: seconds[step][run]. With
// no device (host work) nothing is synchronized.
TEST(DeviceProbe, TimeRunsOfSeveralStepsKeepsTheirOrderAndTimesEach) {
  std::string order;
  const std::function<Status()> steps[] = {[&] {
                                             order += 'f';
                                             return Status::Ok();
                                           },
                                           [&] {
                                             order += 'b';
                                             return Status::Ok();
                                           }};
  Result<std::vector<std::vector<double>>> s = TimeRuns(nullptr, 1, 3, steps);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(order, "fbfbfbfb");
  ASSERT_EQ(s->size(), 2u);
  for (const std::vector<double>& step : *s) {
    ASSERT_EQ(step.size(), 3u);
    for (double v : step) EXPECT_TRUE(std::isfinite(v) && v >= 0) << v;  // host work: may be 0
  }
  const std::function<Status()> broken[] = {[] { return Status::Ok(); },
                                            [] { return Status::InvalidArgument("no backward"); }};
  EXPECT_EQ(TimeRuns(nullptr, 0, 2, broken).status().message(),
            "timed run 1 of 2, step 2: no backward");
}

TEST(DeviceProbe, BestAndMedianOfSeconds) {
  const std::vector<double> odd{3, 1, 2}, even{4, 1, 3, 2};
  EXPECT_EQ(BestOf(odd), 1);
  EXPECT_EQ(MedianOf(odd), 2);
  EXPECT_EQ(MedianOf(even), 2.5);  // the mean of the middle two
  EXPECT_EQ(MedianOf(std::vector<double>{7}), 7);
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
