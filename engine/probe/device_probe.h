// Device probes for `ferry probe`: GEMM rates through the GEMM op and copy rates through the
// Device interface, on any Device (a CpuDevice in tests and for the host's GEMM figure; each GPU
// model on a CUDA build), and how a machine's GPU measurement replaces a hardware profile's GPU
// and PCIe sections.
//
// Timing is wall-clock around enqueue + Synchronize (TimeRuns; best of the repeats, after one
// warm-up), so every figure includes what a caller of the Device interface pays. Each probe owns
// what it allocates (device buffers, host staging) and frees it before returning. Thread-safe (no
// shared state), though concurrent probes disturb each other's timings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/plan/hardware_profile.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/status.h"

namespace ferry::plan {

// The one clock for device work (the probes here, layer_probe, machine_probe): every
// run is timed from before its step to after d.Synchronize() returns, so a figure includes what a
// caller of the Device interface pays.
//
// Seconds of each of `runs` runs of `step` (step(), then d.Synchronize()), after `warmup` untimed
// runs of the same; result[r] is run r's. Errors: InvalidArgument for runs < 1 or warmup < 0; a
// step's or a synchronize's error, with the run it stopped.
[[nodiscard]] Result<std::vector<double>> TimeRuns(Device& d, int warmup, int runs,
                                                   const std::function<Status()>& step);
// The same with several steps per run, called (and each timed) in order: for a step that needs the
// one before it, such as a backward after its forward. result[s][r] is step s's seconds in run r.
// `d` == nullptr: the steps run on the host and are done when they return (nothing to
// synchronize).
[[nodiscard]] Result<std::vector<std::vector<double>>> TimeRuns(
    Device* d, int warmup, int runs, std::span<const std::function<Status()>> steps);

// Views of TimeRuns' seconds. REQUIRES: `seconds` is not empty.
double BestOf(std::span<const double> seconds);
double MedianOf(std::span<const double> seconds);  // the mean of the middle two for an even count

// Seconds of the fastest of max(1, `repeats`) runs of `step` followed by d.Synchronize(), after
// one warm-up run: BestOf(TimeRuns(d, 1, repeats, step)).
[[nodiscard]] Result<double> BestSeconds(Device& d, int repeats,
                                         const std::function<Status()>& step);

// FLOP/s (2 n^3 per product) of n x n x n GEMMs with A, B and C of dtype `t` through the GEMM op
// on `d` (fp32 math), `launches` products per timed run. A and B hold values in [-1, 1] (zeros
// would flatter a GPU's power-limited clock). Allocates 3 matrices (+ the op's scratch) on d.
[[nodiscard]] Result<double> ProbeDeviceGemmFlops(Device& d, DType t, int64_t n, int launches = 1,
                                                  int repeats = 3);

// Bytes/s of host<->device and device-internal copies.
struct CopyRates {
  double h2d_pinned = 0;    // CopyToDevice from host memory registered with d (page-locked)
  double d2h_pinned = 0;    // CopyToHost into registered host memory
  double h2d_pageable = 0;  // from plain (pageable, touched) host memory
  double d2h_pageable = 0;
  double device_copy = 0;  // a same-dtype Cast (device-to-device copy), read + write counted
};

// Copies of `bytes` each way on d's upload and download streams, best of `repeats`.
[[nodiscard]] Result<CopyRates> ProbeCopyRates(Device& d, size_t bytes, int repeats = 3);

// A PCIe link's capability: the lower of the device's and its upstream port's maximum speed and
// width (an idle GPU's current link may be trained down; the slot is what the profile describes).
struct PcieLink {
  int generation = 0;  // 0: unknown
  int lanes = 0;
};

// Reads the link of the PCI device `bus_id` (sysfs's "0000:01:00.0", or CUDA's longer
// "00000000:01:00.0") under `sysfs_devices` (normally "/sys/bus/pci/devices"): max_link_speed
// ("16.0 GT/s PCIe" -> generation 4) and max_link_width of the device and of its parent
// directory when that is a PCI port. NotFound when the device or its files are missing.
[[nodiscard]] Result<PcieLink> ReadPcieLink(const std::string& sysfs_devices,
                                            std::string_view bus_id);

// What `ferry probe` measured on a machine's GPUs. Rates are FLOP/s and bytes/s; when the GPUs
// are of several models, each figure is the lowest of the models (a profile's GPUs are alike).
struct GpuMeasurement {
  std::string model;                // "NVIDIA H200", or "A + B" for mixed models
  int count = 0;                    // GPUs visible
  uint64_t memory_total_bytes = 0;  // smallest device memory of the GPUs
  uint64_t memory_free_bytes = 0;   // smallest a program could allocate (after its CUDA context)
  double fp32_flops = 0;            // fp32 storage, fp32 compute (no TF32)
  double bf16_flops = 0;            // bf16 storage, fp32 accumulate
  double fp16_flops = 0;            // fp16 storage, fp32 accumulate
  double fp16_fp16acc_flops = 0;    // fp16 with fp16 accumulate; 0 = not measured
  CopyRates copies;                 // PCIe (one GPU at a time) and device memory
  PcieLink link;                    // from sysfs; 0s when unknown
  std::string details;              // sizes and GPUs measured, for the profile's source text
};

// The share of a large bf16 GEMM's measured rate that a decoder layer's work sustains: the
// datasheet profiles' matmul_efficiency (0.65 of peak for a layer) over the ~0.75 of peak large
// bf16 GEMMs reach (configs/hardware/README.md).
inline constexpr double kLayerShareOfGemmRate = 0.85;

// Replaces p's GPU and PCIe sections with `m`: model, count, label memory (total), usable memory
// (free), reserve (the difference), bf16_flops = the measured bf16 GEMM rate (not a datasheet
// peak) with matmul_efficiency kLayerShareOfGemmRate, fp16_fp16acc_flops, memory bandwidth (the
// device copy), the four PCIe rates, and the PCIe generation and lanes when the link is known
// (else the base's). Peer access is not measured: it stays the base's. The sources say so.
void ApplyGpuMeasurement(const GpuMeasurement& m, HardwareProfile& p);

struct GpuProbeOptions {
  int64_t gemm_n = 8192;  // GEMM size: large enough for a big GPU's peak
  int gemm_launches = 5;  // products per timed run
  size_t copy_bytes = size_t(256) << 20;
  int repeats = 3;
};

// Measures every visible GPU: each is described (name, memory), each model is measured once on
// its first GPU. Unavailable (with the reason) when this build has no CUDA backend or no GPU is
// visible; other errors are the GPU's.
[[nodiscard]] Result<GpuMeasurement> MeasureGpus(const GpuProbeOptions& options);

}  // namespace ferry::plan
