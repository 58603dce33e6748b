// `ferry probe`: measures this machine (fp32 GEMM, host memory bandwidth, CPU AdamW, NVMe through
// the NVMe store) and writes a hardware profile `ferry plan --hardware FILE` reads. GPU and PCIe
// figures need a CUDA build with a GPU; until then they are copied from --base and marked so.
// With --model M and job options it also measures M's layers (apps/layer_probe_options.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "apps/layer_probe_options.h"

namespace ferry {

class JobFileKeys;  // apps/job_file.h

struct ProbeCommand {
  const JobFileKeys* job_file = nullptr;  // what a --config job file set (may be null)
  CLI::App* app = nullptr;
  std::string out = "hardware-profile.json";
  std::string base = "1x-rtx4090-pcie4";
  std::string nvme_dir;
  std::string nvme_bytes = "1GiB";
  int64_t threads = 0;  // (0: all cores); int64 so a huge value is refused by name
  bool quick = false;
  LayerProbeCommand layers;  // --model M [job options]: also measure M's layers
};

// Adds the `probe` subcommand to `parent`; `cmd` must outlive parsing.
void AddProbeCommand(CLI::App& parent, ProbeCommand* cmd);

// Exit code: 0 written; 1 a probe or the write failed (one line on stderr).
int RunProbeCommand(ProbeCommand& cmd);

}  // namespace ferry
