// Machine probes for `ferry probe`: what this machine sustains — fp32 GEMM through the GEMM op on
// a CpuDevice, host memory bandwidth (STREAM triad), CPU AdamW through the AdamW op on a
// CpuDevice, NVMe through the NVMe store (offload/store_rate.h), and on a CUDA build with a GPU
// visible the GPUs' GEMM rates, memory and PCIe copy rates (engine/probe/device_probe.h) — and a
// hardware profile built from them. Without a GPU (or a CUDA build) the GPU and PCIe figures come
// from a base profile and their `source` says so.
//
// Each probe owns what it allocates and frees it before returning; thread-safe (no shared state),
// though concurrent probes disturb each other's timings.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "engine/plan/hardware_profile.h"
#include "engine/probe/device_probe.h"
#include "kernels/status.h"

namespace ferry::plan {

// fp32 FLOP/s of an n x n x n GEMM on a CpuDevice with `threads` compute threads (best of
// `repeats` timed runs after one warm-up).
[[nodiscard]] Result<double> ProbeGemmFlops(int threads, int64_t n, int repeats = 3);

// Bytes/s of a[i] = b[i] + s * c[i] over three arrays of `bytes_per_array` doubles' bytes, on
// `threads` threads (STREAM's count: 3 x 8 bytes per element; best of `repeats`).
[[nodiscard]] Result<double> ProbeTriadBandwidth(int threads, size_t bytes_per_array,
                                                 int repeats = 3);

// Parameters/s of fp32 AdamW over n parameters on a CpuDevice with `threads` threads.
[[nodiscard]] Result<double> ProbeAdamWRate(int threads, int64_t n, int repeats = 3);

struct ProbeOptions {
  int threads = 0;        // 0: all cores
  int64_t gemm_n = 2048;  // GEMM size
  size_t triad_bytes = size_t(256) << 20;
  int64_t adamw_params = int64_t(64) << 20;
  std::string nvme_dir;  // empty: no NVMe figures (the profile names no NVMe tier)
  size_t nvme_bytes = size_t(1) << 30;
  bool measure_gpus = true;  // false: GPU and PCIe figures from the base even when a GPU exists
  GpuProbeOptions gpu;
};

// The sizes of `ferry probe --quick` (seconds, rougher figures), also those `ferry train` measures
// its CPU devices' host rates at. NVMe bytes: at most 64 MiB of `nvme_bytes`.
inline ProbeOptions QuickProbeOptions(ProbeOptions o = {}) {
  o.gemm_n = 512;
  o.triad_bytes = size_t(32) << 20;
  o.adamw_params = int64_t(4) << 20;
  o.nvme_bytes = std::min<size_t>(o.nvme_bytes, size_t(64) << 20);
  o.gpu.gemm_n = 2048;
  o.gpu.copy_bytes = size_t(64) << 20;
  return o;
}

// Measures this machine and returns a profile: host (RAM from the OS, cores, NUMA nodes,
// triad bandwidth), optimizer (AdamW rate), NVMe (store rates, free space of nvme_dir), and the GPU
// and PCIe sections measured (ApplyGpuMeasurement) or, when no GPU can be measured (MeasureGpus
// says Unavailable), those of `base` marked as not measured with the reason. A GPU failure other
// than Unavailable is returned. `gpu_report` (optional) receives lines for the printed report:
// the measured GPU and PCIe figures, or why they were not measured. Validates the result.
[[nodiscard]] Result<HardwareProfile> ProbeMachine(const ProbeOptions& options,
                                                   const HardwareProfile& base,
                                                   std::string* gpu_report = nullptr);

}  // namespace ferry::plan
