#include "engine/probe/machine_probe.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "engine/probe/device_probe.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/onednn.h"
#include "kernels/host_memory.h"
#include "kernels/ops/adamw.h"
#include "offload/store_rate.h"

namespace ferry::plan {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Threads(int threads) {
  return threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
}

Result<std::unique_ptr<CpuDevice>> ProbeDevice(int threads, size_t bytes) {
  CpuDeviceOptions o;
  o.name = "probe";
  o.memory_bytes = (bytes + (size_t(1) << 20)) / 256 * 256;
  o.compute_threads = threads;
  return CpuDevice::Create(o);
}

// Two lines of what was measured on the GPUs, for the probe's printed report.
std::string GpuReport(const GpuMeasurement& m) {
  char line[512];
  std::snprintf(line, sizeof(line),
                "GPU: %dx %s, %.1f GiB usable of %.1f; GEMM TFLOP/s fp32 %.1f, bf16 %.1f, fp16 "
                "%.1f, fp16-accumulate %.1f; device memory %.0f GB/s\n"
                "PCIe: pinned H2D %.1f D2H %.1f GB/s, pageable H2D %.1f D2H %.1f GB/s",
                m.count, m.model.c_str(), double(m.memory_free_bytes) / double(1ull << 30),
                double(m.memory_total_bytes) / double(1ull << 30), m.fp32_flops / 1e12,
                m.bf16_flops / 1e12, m.fp16_flops / 1e12, m.fp16_fp16acc_flops / 1e12,
                m.copies.device_copy / 1e9, m.copies.h2d_pinned / 1e9, m.copies.d2h_pinned / 1e9,
                m.copies.h2d_pageable / 1e9, m.copies.d2h_pageable / 1e9);
  std::string report = line;
  if (m.link.generation > 0) {
    report +=
        "; link Gen" + std::to_string(m.link.generation) + " x" + std::to_string(m.link.lanes);
  } else {
    report += "; link generation/lanes unknown (no sysfs): from the base profile";
  }
  return report;
}

}  // namespace

Result<double> ProbeGemmFlops(int threads, int64_t n, int repeats) {
  const size_t matrix = size_t(n * n) * sizeof(float);
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> d, ProbeDevice(Threads(threads), 3 * matrix));
  return ProbeDeviceGemmFlops(*d, DType::kF32, n, 1, repeats);
}

Result<double> ProbeTriadBandwidth(int threads, size_t bytes_per_array, int repeats) {
  const size_t n = std::max<size_t>(bytes_per_array / sizeof(double), 1);
  std::vector<double> a(n, 0.0), b(n, 1.0), c(n, 2.0);
  const int t = Threads(threads);
  auto triad = [&] {
    std::vector<std::thread> workers;
    for (int w = 0; w < t; ++w) {
      workers.emplace_back([&, w] {
        const size_t lo = n * size_t(w) / size_t(t), hi = n * size_t(w + 1) / size_t(t);
        for (size_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0 * c[i];
      });
    }
    for (std::thread& w : workers) w.join();
  };
  triad();
  double best = 1e300;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const Clock::time_point t0 = Clock::now();
    triad();
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  if (a[n / 2] != 7.0) return Status::Internal("triad probe computed a wrong value");
  return 3.0 * double(n) * sizeof(double) / best;
}

Result<double> ProbeAdamWRate(int threads, int64_t n, int repeats) {
  const size_t vec = size_t(n) * sizeof(float);
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> d, ProbeDevice(Threads(threads), 4 * vec));
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer buf, d->Allocate(4 * vec, "probe.adamw"));
  AdamWArgs a;
  a.p = buf.View(DType::kF32, {n});
  a.g = buf.View(DType::kF32, {n}, vec);
  a.m = buf.View(DType::kF32, {n}, 2 * vec);
  a.v = buf.View(DType::kF32, {n}, 3 * vec);
  FERRY_ASSIGN_OR_RETURN(double s, BestSeconds(*d, repeats, [&] { return AdamWStep(*d, a); }));
  return double(n) / s;
}

Result<HardwareProfile> ProbeMachine(const ProbeOptions& o, const HardwareProfile& base,
                                     std::string* gpu_report) {
  HardwareProfile p = base;
  const int threads = Threads(o.threads);
  p.name = "this machine (ferry probe)";
  Result<GpuMeasurement> gpus = o.measure_gpus
                                    ? MeasureGpus(o.gpu)
                                    : Result<GpuMeasurement>(Status::Unavailable("not asked to"));
  std::string report;
  if (gpus.ok()) {
    ApplyGpuMeasurement(*gpus, p);
    p.description = "Measured by ferry probe.";
    report = GpuReport(*gpus);
  } else if (gpus.status().code() == StatusCode::kUnavailable) {
    const std::string why = gpus.status().message();
    p.description = "Measured by ferry probe; GPU and PCIe figures from '" + base.name + "'.";
    p.gpu.source =
        "not measured (" + why + "): from the base profile '" + base.name + "'. " + base.gpu.source;
    p.pcie.source = "not measured (" + why + "): from the base profile. " + base.pcie.source;
    report = "GPU and PCIe: not measured (" + why + "); figures from the base profile '" +
             base.name + "'";
  } else {
    return gpus.status().WithContext("GPU probe");
  }
  if (gpu_report != nullptr) *gpu_report = report;

  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  p.host.ram_bytes = uint64_t(::sysconf(_SC_PHYS_PAGES)) * page;
  const uint64_t os_reserve = std::max<uint64_t>(p.host.ram_bytes / 16, uint64_t(4) << 30);
  p.host.ram_usable_bytes =
      p.host.ram_bytes > 2 * os_reserve ? p.host.ram_bytes - os_reserve : p.host.ram_bytes / 2;
  p.host.cpu_cores = threads;
  int nodes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) == 0 && name.size() > 4 &&
        std::isdigit(static_cast<unsigned char>(name[4])))
      ++nodes;
  }
  p.host.numa_nodes = std::max(nodes, 1);
  FERRY_ASSIGN_OR_RETURN(p.host.memory_bandwidth, ProbeTriadBandwidth(threads, o.triad_bytes));
  FERRY_ASSIGN_OR_RETURN(const double gemm, ProbeGemmFlops(threads, o.gemm_n));
  p.host.source = "ferry probe: RAM from sysconf (usable = RAM - max(RAM/16, 4 GiB)), " +
                  std::to_string(threads) + " threads, STREAM triad bandwidth; fp32 GEMM " +
                  std::to_string(int64_t(gemm / 1e9)) + " GFLOP/s on a CpuDevice with " +
                  cpu::Blas().Describe() + "; " + cpu::Bf16GemmPathDescription();
  FERRY_ASSIGN_OR_RETURN(p.optimizer.cpu_adamw_params_per_s,
                         ProbeAdamWRate(threads, o.adamw_params));
  p.optimizer.source =
      "ferry probe: the AdamW op on a CpuDevice with " + std::to_string(threads) + " threads";
  if (!o.nvme_dir.empty()) {
    NvmeStoreOptions store;
    store.directory = (std::filesystem::path(o.nvme_dir) / "ferry-probe").string();
    store.log = [](std::string_view) {};
    FERRY_ASSIGN_OR_RETURN(StoreRate rate, MeasureStoreRate(store, o.nvme_bytes));
    std::filesystem::remove_all(store.directory, ec);
    p.nvme.dir = o.nvme_dir;
    const std::filesystem::space_info space = std::filesystem::space(o.nvme_dir, ec);
    p.nvme.space_bytes = ec ? 0 : uint64_t(space.available);
    p.nvme.read_rate = rate.read_bytes_per_s;
    p.nvme.write_rate = rate.write_bytes_per_s;
    p.nvme.sustained_write_rate = rate.write_bytes_per_s;  // a short probe sees the cache rate
    p.nvme.source = "ferry probe: the NVMe store (" + rate.backend +
                    (rate.direct_io ? ", O_DIRECT" : ", buffered") + "), " +
                    std::to_string(o.nvme_bytes >> 20) +
                    " MiB sequential from host memory on transparent huge pages (mode " +
                    TransparentHugePagesMode() +
                    ", as the host pool maps it); sustained = measured (a short run stays in the "
                    "write cache)";
  } else {
    p.nvme.dir.clear();
    p.nvme.source = "not measured (no --nvme-dir); rates from the base profile";
  }
  FERRY_RETURN_IF_ERROR(ValidateHardwareProfile(p));
  return p;
}

}  // namespace ferry::plan
