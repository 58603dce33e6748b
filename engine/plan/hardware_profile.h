// HardwareProfile: what the planner knows about a machine — GPUs, PCIe links, host RAM, NVMe and
// the CPU optimizer rate — loaded from configs/hardware/*.json or written by `ferry probe`, plus
// the budget overrides of `ferry plan` (--gpu-memory, --host-memory, --nvme-dir, --nvme-space).
//
// Units: sizes in bytes, rates in bytes per second (FLOP/s for compute, parameters per second
// for the optimizer). All GPUs of a profile are alike. Each field group carries a free-text
// `source` saying where its numbers came from; it is kept through load and save.
//
// JSON: byte sizes may be written as integers or as strings ("24GiB", see byte_size.h); rates are
// numbers. A missing or malformed field is an InvalidArgument naming the file and the field
// path (e.g. "gpu.memory_usable_bytes"). Plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/status.h"

namespace ferry::plan {

struct GpuSpec {
  std::string model;                  // "RTX 4090"
  int count = 0;                      // GPUs in the machine
  uint64_t memory_label_bytes = 0;    // total device memory as the driver reports it
  uint64_t memory_reserve_bytes = 0;  // CUDA context, library workspaces, slack
  uint64_t memory_usable_bytes = 0;   // what a program may allocate: label - reserve, or measured
  double bf16_flops = 0;              // dense bf16/fp16 tensor rate, fp32 accumulate (peak)
  double fp16_fp16acc_flops = 0;      // dense fp16 with fp16 accumulate (peak); 0 = unknown
  double matmul_efficiency = 0;       // achievable fraction of peak, in (0, 1]
  double memory_bandwidth = 0;        // device memory, bytes/s
  bool peer_access = false;           // GPU-to-GPU copies without host RAM
  std::string source;

  // Peak times the achievable fraction: the rate the cost model uses.
  double EffectiveBf16Flops() const { return bf16_flops * matmul_efficiency; }
  // The same for a job's GEMM mode: fp16 with fp16 accumulation (PlanJob::fp16_accumulate) runs
  // at the fp16-accumulate peak, everything else at the fp32-accumulate one.
  // REQUIRES: fp16_fp16acc_flops > 0 when fp16_accumulate.
  double EffectiveFlops(bool fp16_accumulate) const {
    return fp16_accumulate ? fp16_fp16acc_flops * matmul_efficiency : EffectiveBf16Flops();
  }
};

struct PcieSpec {
  int generation = 0;
  int lanes = 0;
  double h2d_pinned = 0;    // host->device from page-locked memory, bytes/s per GPU
  double d2h_pinned = 0;    // device->host into page-locked memory
  double h2d_pageable = 0;  // from ordinary (pageable) memory
  double d2h_pageable = 0;
  std::string source;
};

struct HostSpec {
  uint64_t ram_bytes = 0;         // installed
  uint64_t ram_usable_bytes = 0;  // what ferry may use (pinned + pageable)
  double memory_bandwidth = 0;    // achievable copy bandwidth, bytes/s, all sockets together
  int numa_nodes = 0;
  int cpu_cores = 0;
  std::string source;
};

// The host memory that the PCIe links of one NUMA node's GPUs draw on together. Their copies, in
// both directions, land in or come from that node's memory (the host pool is node-local), so
// however fast each link is, all of them at once move no more than the node's memory
// controllers serve. 0 = no cap beyond host.memory_bandwidth. GPUs sit on nodes in order, evenly:
// GPU g on node g * numa_nodes / count. JSON: "host_links": {"shared_bandwidth_per_node": ...,
// "source": ...}, optional.
struct HostLinkSpec {
  double shared_bandwidth_per_node = 0;  // bytes/s
  std::string source;
};

struct NvmeSpec {
  std::string dir;           // where ferry may write; empty = no NVMe tier
  uint64_t space_bytes = 0;  // what ferry may use in `dir`
  double read_rate = 0;      // bytes/s
  double write_rate = 0;     // while the drive's write cache lasts
  double sustained_write_rate = 0;
  uint64_t endurance_bytes_written = 0;  // rated total writes (0 = unknown)
  std::string source;
};

struct OptimizerSpec {
  double cpu_adamw_params_per_s = 0;  // fp32 AdamW on the host, all cores
  std::string source;
};

// One layer's measured compute time for one micro-batch on one GPU of the profile. `key` names
// the layer kind and every shape the time depends on (LayerTimeKey in planner.h); the planner uses
// the times of a key it finds instead of its FLOP formulas. JSON: "layer_times": [{"key": ...,
// "forward_s": ..., "backward_s": ...}] (optional; written by hand or by a probe of the layers).
struct MeasuredLayerTime {
  std::string key;
  double forward_s = 0;
  double backward_s = 0;
};

struct HardwareProfile {
  std::string name;
  std::string description;
  GpuSpec gpu;
  PcieSpec pcie;
  HostSpec host;
  HostLinkSpec host_links;
  NvmeSpec nvme;
  OptimizerSpec optimizer;
  std::vector<MeasuredLayerTime> layer_times;  // optional: measured beats formulas

  // The measured times for `key`, or null.
  const MeasuredLayerTime* FindLayerTime(std::string_view key) const {
    for (const MeasuredLayerTime& t : layer_times) {
      if (t.key == key) return &t;
    }
    return nullptr;
  }

  // True when the planner may place data on NVMe: a directory is named and has space.
  bool HasNvme() const { return !nvme.dir.empty() && nvme.space_bytes > 0; }
};

// Checks ranges and consistency (count >= 1, usable <= label, rates > 0, efficiency in (0, 1],
// ...). InvalidArgument names the field and the value.
[[nodiscard]] Status ValidateHardwareProfile(const HardwareProfile& profile);

// Parses a profile from JSON text; `origin` (a file name) prefixes error messages. Validates.
[[nodiscard]] Result<HardwareProfile> ParseHardwareProfile(std::string_view json_text,
                                                           std::string_view origin);
[[nodiscard]] Result<HardwareProfile> LoadHardwareProfile(const std::string& path);

// The profile as pretty-printed JSON (sizes as integers); ParseHardwareProfile reads it back equal.
std::string HardwareProfileToJson(const HardwareProfile& profile);
[[nodiscard]] Status SaveHardwareProfile(const HardwareProfile& profile, const std::string& path);

// The budgets `ferry plan` takes on its command line; unset fields keep the profile's values.
struct BudgetOverrides {
  std::optional<uint64_t> gpu_memory;   // usable bytes per GPU
  std::optional<uint64_t> host_memory;  // usable host bytes
  std::optional<std::string> nvme_dir;
  std::optional<uint64_t> nvme_space;
};

// Parses the command-line spellings ("22GiB", "500GB", ...); empty strings mean unset.
[[nodiscard]] Result<BudgetOverrides> ParseBudgetOverrides(std::string_view gpu_memory,
                                                           std::string_view host_memory,
                                                           std::string_view nvme_dir,
                                                           std::string_view nvme_space);

// Applies `overrides` to `profile`. A GPU budget above the device's label memory or a host budget
// above installed RAM is an InvalidArgument (a budget can only lower what exists); an NVMe space
// without a directory is an InvalidArgument too.
[[nodiscard]] Status ApplyBudgetOverrides(const BudgetOverrides& overrides,
                                          HardwareProfile& profile);

}  // namespace ferry::plan
