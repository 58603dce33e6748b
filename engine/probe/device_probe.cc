#include "engine/probe/device_probe.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <utility>
#include <vector>

#include "kernels/host_memory.h"
#include "kernels/ops/cast.h"
#include "kernels/ops/gemm.h"
#include "offload/file_io.h"
#ifdef FERRY_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_ops.h"
#endif

namespace ferry::plan {
namespace {

using Clock = std::chrono::steady_clock;
using GemmRunner = std::function<Status(Device&, const GemmArgs&)>;

// "12.3" for v / unit with one decimal.
std::string Fixed(double v, double unit) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.1f", v / unit);
  return s;
}

// Fills `dst` (n elements of dtype t on d) with values in [-1, 1) from a fixed-seed LCG, through
// a pageable staging buffer, and waits.
Status FillRandom(Device& d, const Tensor& dst) {
  const size_t n = size_t(dst.numel()), width = DTypeSize(dst.dtype);
  constexpr size_t kChunk = size_t(1) << 20;  // elements per staging round
  FERRY_ASSIGN_OR_RETURN(HostAllocation staging,
                         HostAllocation::Map(std::min(n, kChunk) * width, "probe.fill"));
  std::vector<float> values(std::min(n, kChunk));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t count = std::min(kChunk, n - begin);
    for (size_t i = 0; i < count; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      values[i] = float(int32_t(state >> 32)) * 0x1p-31f;
    }
    ConvertFromFloat(values.data(), dst.dtype, staging.data(), count);
    FERRY_RETURN_IF_ERROR(d.CopyToDevice(dst.data + std::ptrdiff_t(begin * width),
                                         staging.Span(0, count * width), count * width));
    FERRY_RETURN_IF_ERROR(d.Synchronize(StreamId::kUpload));  // before staging is refilled
  }
  return Status::Ok();
}

// FLOP/s of n^3 GEMMs of dtype t run by `run` (the GEMM op, or a variant of it).
Result<double> ProbeGemm(Device& d, DType t, int64_t n, int launches, int repeats,
                         const GemmRunner& run) {
  const size_t matrix = size_t(n * n) * DTypeSize(t);
  const size_t scratch = GemmScratchBytes(d, n, n, n, {t, t, t});
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer buf, d.Allocate(3 * matrix + scratch, "probe.gemm"));
  GemmArgs g;
  g.a = buf.View(t, {n, n});
  g.b = buf.View(t, {n, n}, matrix);
  g.c = buf.View(t, {n, n}, 2 * matrix);  // beta == 0: never read
  if (scratch > 0) g.scratch = buf.View(DType::kF32, {int64_t(scratch / 4)}, 3 * matrix);
  FERRY_RETURN_IF_ERROR(FillRandom(d, g.a));
  FERRY_RETURN_IF_ERROR(FillRandom(d, g.b));
  const int per_run = std::max(1, launches);
  FERRY_ASSIGN_OR_RETURN(const double s, BestSeconds(d, repeats, [&]() -> Status {
                           for (int i = 0; i < per_run; ++i) FERRY_RETURN_IF_ERROR(run(d, g));
                           return Status::Ok();
                         }));
  return 2.0 * double(n) * double(n) * double(n) * per_run / s;
}

// The first line of a sysfs file, or empty when it cannot be read.
std::string ReadLine(const std::filesystem::path& path) {
  Result<std::string> text = ReadWholeFile(path.string());
  if (!text.ok()) return "";
  return text->substr(0, text->find('\n'));
}

// PCIe generation of a link speed ("16.0 GT/s PCIe"): 2.5 -> 1, 5 -> 2, 8 -> 3, then doubling.
int GenerationOfSpeed(const std::string& speed) {
  const double gts = std::atof(speed.c_str());
  int generation = 0;
  for (double s : {2.5, 5.0, 8.0, 16.0, 32.0, 64.0, 128.0}) {
    if (gts >= s * 0.99) ++generation;
  }
  return generation;
}

// The link a sysfs PCI directory advertises; zeros when it has none.
PcieLink LinkOf(const std::filesystem::path& dir) {
  return {GenerationOfSpeed(ReadLine(dir / "max_link_speed")),
          std::atoi(ReadLine(dir / "max_link_width").c_str())};
}

#ifdef FERRY_WITH_CUDA
// The lower of two measured figures (a profile's GPUs are alike: the slowest model sets the pace).
void TakeLower(double v, double& into) { into = into == 0 ? v : std::min(into, v); }

// Measures one GPU (GEMM rates and copies) into `m`, keeping the lower of each figure.
Status MeasureOneGpu(const CudaDeviceInfo& info, const GpuProbeOptions& o, GpuMeasurement& m) {
  const int ordinal = info.ordinal;
  const size_t gemm_bytes = 3 * size_t(o.gemm_n * o.gemm_n) * sizeof(float);
  CudaDeviceOptions options;
  options.ordinal = ordinal;
  options.name = "probe.cuda" + std::to_string(ordinal);
  options.memory_bytes = (std::max(gemm_bytes, 2 * o.copy_bytes) + options.cublas_workspace_bytes +
                          (size_t(16) << 20)) /
                         256 * 256;
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> d, CudaDevice::Create(options));
  const GemmRunner op = [](Device& dev, const GemmArgs& g) { return Gemm(dev, g); };
  const auto rate = [&](DType t, const GemmRunner& run) {
    return ProbeGemm(*d, t, o.gemm_n, o.gemm_launches, o.repeats, run);
  };
  FERRY_ASSIGN_OR_RETURN(const double fp32, rate(DType::kF32, op));
  FERRY_ASSIGN_OR_RETURN(const double bf16, rate(DType::kBF16, op));
  FERRY_ASSIGN_OR_RETURN(const double fp16, rate(DType::kF16, op));
  FERRY_ASSIGN_OR_RETURN(const double fp16acc,
                         rate(DType::kF16, [](Device& dev, const GemmArgs& g) {
                           return cuda::GemmF16Accumulate(static_cast<CudaDevice&>(dev), g);
                         }));
  FERRY_ASSIGN_OR_RETURN(const CopyRates c, ProbeCopyRates(*d, o.copy_bytes, o.repeats));
  TakeLower(fp32, m.fp32_flops);
  TakeLower(bf16, m.bf16_flops);
  TakeLower(fp16, m.fp16_flops);
  TakeLower(fp16acc, m.fp16_fp16acc_flops);
  TakeLower(c.h2d_pinned, m.copies.h2d_pinned);
  TakeLower(c.d2h_pinned, m.copies.d2h_pinned);
  TakeLower(c.h2d_pageable, m.copies.h2d_pageable);
  TakeLower(c.d2h_pageable, m.copies.d2h_pageable);
  TakeLower(c.device_copy, m.copies.device_copy);
  // The link is optional (no sysfs in some containers): unknown leaves the base's figures.
  if (Result<PcieLink> link = ReadPcieLink("/sys/bus/pci/devices", info.pci_bus_id); link.ok()) {
    const bool first = m.link.generation == 0;
    m.link.generation = first ? link->generation : std::min(m.link.generation, link->generation);
    m.link.lanes = first ? link->lanes : std::min(m.link.lanes, link->lanes);
  }
  return Status::Ok();
}
#endif  // FERRY_WITH_CUDA

}  // namespace

Result<std::vector<std::vector<double>>> TimeRuns(Device* d, int warmup, int runs,
                                                  std::span<const std::function<Status()>> steps) {
  if (runs < 1 || warmup < 0) {
    return Status::InvalidArgument("timed runs: " + std::to_string(runs) + " runs after " +
                                   std::to_string(warmup) +
                                   " warm-up runs; at least 1 run and no negative warm-up");
  }
  std::vector<std::vector<double>> seconds(steps.size());
  for (int r = 0; r < warmup + runs; ++r) {
    const bool timed = r >= warmup;
    for (size_t s = 0; s < steps.size(); ++s) {
      const Clock::time_point t0 = Clock::now();
      Status status = steps[s]();
      if (status.ok() && d != nullptr) status = d->Synchronize();
      if (!status.ok()) {
        return status.WithContext(
            (timed ? "timed run " + std::to_string(r - warmup + 1) + " of " + std::to_string(runs)
                   : "warm-up run " + std::to_string(r + 1) + " of " + std::to_string(warmup)) +
            (steps.size() > 1 ? ", step " + std::to_string(s + 1) : std::string()));
      }
      if (timed) seconds[s].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  return seconds;
}

Result<std::vector<double>> TimeRuns(Device& d, int warmup, int runs,
                                     const std::function<Status()>& step) {
  FERRY_ASSIGN_OR_RETURN(std::vector<std::vector<double>> seconds,
                         TimeRuns(&d, warmup, runs, std::span(&step, 1)));
  return std::move(seconds.front());
}

double BestOf(std::span<const double> seconds) {
  return *std::min_element(seconds.begin(), seconds.end());
}

double MedianOf(std::span<const double> seconds) {
  std::vector<double> v(seconds.begin(), seconds.end());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Result<double> BestSeconds(Device& d, int repeats, const std::function<Status()>& step) {
  FERRY_ASSIGN_OR_RETURN(const std::vector<double> seconds,
                         TimeRuns(d, 1, std::max(1, repeats), step));
  return BestOf(seconds);
}

Result<double> ProbeDeviceGemmFlops(Device& d, DType t, int64_t n, int launches, int repeats) {
  return ProbeGemm(d, t, n, launches, repeats,
                   [](Device& dev, const GemmArgs& g) { return Gemm(dev, g); });
}

Result<CopyRates> ProbeCopyRates(Device& d, size_t bytes, int repeats) {
  bytes = std::max<size_t>(bytes / 4 * 4, 4);
  FERRY_ASSIGN_OR_RETURN(DeviceBuffer buf, d.Allocate(2 * bytes, "probe.copy"));
  FERRY_ASSIGN_OR_RETURN(HostAllocation pinned, HostAllocation::Map(bytes, "probe.pinned"));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<HostRegistration> reg, d.RegisterHost(pinned));
  pinned.Attach(std::move(reg));
  FERRY_ASSIGN_OR_RETURN(HostAllocation pageable, HostAllocation::Map(bytes, "probe.pageable"));
  std::memset(pinned.data(), 1, bytes);  // touch every page: no first-touch faults timed
  std::memset(pageable.data(), 1, bytes);
  const DevicePtr<std::byte> dev = buf.data();
  const auto rate = [&](const std::function<Status()>& copy) -> Result<double> {
    FERRY_ASSIGN_OR_RETURN(const double s, BestSeconds(d, repeats, copy));
    return double(bytes) / s;
  };
  CopyRates r;
  FERRY_ASSIGN_OR_RETURN(r.h2d_pinned,
                         rate([&] { return d.CopyToDevice(dev, pinned.Whole(), bytes); }));
  FERRY_ASSIGN_OR_RETURN(r.d2h_pinned,
                         rate([&] { return d.CopyToHost(pinned.Whole(), dev, bytes); }));
  FERRY_ASSIGN_OR_RETURN(r.h2d_pageable,
                         rate([&] { return d.CopyToDevice(dev, pageable.Whole(), bytes); }));
  FERRY_ASSIGN_OR_RETURN(r.d2h_pageable,
                         rate([&] { return d.CopyToHost(pageable.Whole(), dev, bytes); }));
  const Shape words{int64_t(bytes / 4)};
  const CastArgs copy{buf.View(DType::kF32, words), buf.View(DType::kF32, words, bytes)};
  FERRY_ASSIGN_OR_RETURN(const double device_copy, rate([&] { return Cast(d, copy); }));
  r.device_copy = 2 * device_copy;  // each byte is read and written
  return r;
}

Result<PcieLink> ReadPcieLink(const std::string& sysfs_devices, std::string_view bus_id) {
  // CUDA writes an 8-digit domain ("00000000:01:00.0"); sysfs a 4-digit one, lower case.
  std::string id(bus_id);
  const size_t colon = id.find(':');
  if (colon != std::string::npos && colon > 4) id.erase(0, colon - 4);
  for (char& c : id) c = char(std::tolower(static_cast<unsigned char>(c)));
  std::error_code ec;
  const std::filesystem::path dir =
      std::filesystem::canonical(std::filesystem::path(sysfs_devices) / id, ec);
  if (ec) {
    return Status::NotFound("PCI device " + id + " not found under " + sysfs_devices + ": " +
                            ec.message());
  }
  PcieLink link = LinkOf(dir);
  if (link.generation == 0 || link.lanes <= 0) {
    return Status::NotFound("PCI device " + id + ": no max_link_speed/max_link_width in " +
                            dir.string());
  }
  const PcieLink port = LinkOf(dir.parent_path());
  if (port.generation > 0) link.generation = std::min(link.generation, port.generation);
  if (port.lanes > 0) link.lanes = std::min(link.lanes, port.lanes);
  return link;
}

void ApplyGpuMeasurement(const GpuMeasurement& m, HardwareProfile& p) {
  GpuSpec& g = p.gpu;
  g.model = m.model;
  g.count = m.count;
  g.memory_label_bytes = m.memory_total_bytes;
  g.memory_usable_bytes = std::min(m.memory_free_bytes, m.memory_total_bytes);
  g.memory_reserve_bytes = g.memory_label_bytes - g.memory_usable_bytes;
  g.bf16_flops = m.bf16_flops;
  g.fp16_fp16acc_flops = m.fp16_fp16acc_flops;
  g.matmul_efficiency = kLayerShareOfGemmRate;
  g.memory_bandwidth = m.copies.device_copy;
  const double tera = 1e12, giga = 1e9;
  g.source = "measured by ferry probe (" + m.details + "): GEMM TFLOP/s fp32 " +
             Fixed(m.fp32_flops, tera) + ", bf16 " + Fixed(m.bf16_flops, tera) + ", fp16 " +
             Fixed(m.fp16_flops, tera) + ", fp16 with fp16 accumulate " +
             Fixed(m.fp16_fp16acc_flops, tera) +
             " (fp32 compute, no TF32, except the last). bf16_flops is the measured bf16 GEMM "
             "rate, not a datasheet peak; matmul_efficiency " +
             Fixed(kLayerShareOfGemmRate * 100, 1) +
             "% is the share of it a decoder layer sustains. Label memory = the device's total, "
             "usable = what cudaMemGetInfo reported free with a CUDA context open; "
             "memory_bandwidth = a device-to-device copy (" +
             Fixed(m.copies.device_copy, giga) +
             " GB/s, read + write). peer_access not measured (kept from the base profile).";
  p.pcie.h2d_pinned = m.copies.h2d_pinned;
  p.pcie.d2h_pinned = m.copies.d2h_pinned;
  p.pcie.h2d_pageable = m.copies.h2d_pageable;
  p.pcie.d2h_pageable = m.copies.d2h_pageable;
  const bool link_known = m.link.generation > 0 && m.link.lanes > 0;
  if (link_known) {
    p.pcie.generation = m.link.generation;
    p.pcie.lanes = m.link.lanes;
  }
  p.pcie.source = "measured by ferry probe (" + m.details +
                  "): copies through the device's upload and download streams from page-locked "
                  "(cudaHostRegister) and pageable host memory, best of the repeats. " +
                  (link_known ? std::string("Generation and lanes: sysfs max_link_speed/width of "
                                            "the GPU and its upstream port (the lower).")
                              : std::string("Generation and lanes not measured (kept from the "
                                            "base profile)."));
}

Result<GpuMeasurement> MeasureGpus(const GpuProbeOptions& o) {
#ifdef FERRY_WITH_CUDA
  FERRY_ASSIGN_OR_RETURN(const int count, CudaDevice::CountDevices());
  GpuMeasurement m;
  m.count = count;
  std::vector<std::string> models;
  std::vector<CudaDeviceInfo> measured;
  for (int i = 0; i < count; ++i) {  // every GPU first: free memory before any probe's arena
    FERRY_ASSIGN_OR_RETURN(const CudaDeviceInfo info, CudaDevice::Describe(i));
    m.memory_total_bytes =
        i == 0 ? info.total_bytes : std::min<uint64_t>(m.memory_total_bytes, info.total_bytes);
    m.memory_free_bytes =
        i == 0 ? info.free_bytes : std::min<uint64_t>(m.memory_free_bytes, info.free_bytes);
    if (std::find(models.begin(), models.end(), info.name) == models.end()) {
      models.push_back(info.name);
      measured.push_back(info);
    }
  }
  for (const std::string& name : models) m.model += (m.model.empty() ? "" : " + ") + name;
  for (const CudaDeviceInfo& info : measured) {
    FERRY_RETURN_IF_ERROR(MeasureOneGpu(info, o, m)
                              .WithContext("probing CUDA device " + std::to_string(info.ordinal)));
  }
  m.details = std::to_string(count) + " GPU(s), measured on CUDA device(s)";
  for (size_t i = 0; i < measured.size(); ++i) {
    m.details += (i == 0 ? " " : ", ") + std::to_string(measured[i].ordinal);
  }
  m.details += "; GEMM " + std::to_string(o.gemm_n) + "^3, copies of " +
               std::to_string(o.copy_bytes >> 20) + " MiB" +
               (models.size() > 1 ? "; models differ: each figure is the slowest model's" : "");
  return m;
#else
  (void)o;
  return Status::Unavailable(
      "this build has no CUDA backend (configure with -DFERRY_CUDA=ON where the CUDA toolkit is "
      "installed)");
#endif
}

}  // namespace ferry::plan
