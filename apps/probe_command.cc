#include "apps/probe_command.h"

#include <cstdio>

#include "apps/job_file.h"
#include "apps/plan_command.h"
#include "engine/job/job_spec.h"
#include "engine/plan/byte_size.h"
#include "engine/probe/machine_probe.h"

namespace ferry {

void AddProbeCommand(CLI::App& parent, ProbeCommand* cmd) {
  CLI::App* p = parent.add_subcommand(
      "probe", "Measure this machine and write a hardware profile for `ferry plan --hardware`.");
  cmd->app = p;
  p->add_option("--out", cmd->out, "Profile file to write (JSON)")->capture_default_str();
  p->add_option("--base", cmd->base,
                "Profile (name in configs/hardware or path) whose GPU and PCIe figures are kept "
                "when no GPU can be measured (no GPU visible, or a build without CUDA)")
      ->capture_default_str();
  p->add_option("--nvme-dir", cmd->nvme_dir, "Directory on the NVMe drive to measure and use");
  p->add_option("--nvme-bytes", cmd->nvme_bytes, "Bytes the NVMe probe writes and reads back")
      ->capture_default_str();
  p->add_option("--threads", cmd->threads, "CPU threads (0: all cores)")->capture_default_str();
  p->add_flag("--quick", cmd->quick, "Small sizes: seconds, rougher figures");
  AddLayerProbeOptions(*p, &cmd->layers);
}

int RunProbeCommand(ProbeCommand& cmd) {
  auto fail = [&cmd](const Status& s) {
    std::fprintf(stderr, "ferry probe: %s\n", AnnotateJobFile(cmd.job_file, s).message().c_str());
    return 1;
  };
  if (Status s = ValidateThreads(cmd.threads); !s.ok()) return fail(s);
  Result<plan::HardwareProfile> base =
      plan::LoadHardwareProfile(ResolveConfigPath("hardware", cmd.base));
  if (!base.ok()) return fail(base.status().WithContext("--base"));
  Result<uint64_t> nvme_bytes = plan::ParseByteSize(cmd.nvme_bytes);
  if (!nvme_bytes.ok()) return fail(nvme_bytes.status().WithContext("--nvme-bytes"));
  plan::ProbeOptions o;
  o.threads = int(cmd.threads);  // checked above
  o.nvme_dir = cmd.nvme_dir;
  o.nvme_bytes = *nvme_bytes;
  if (cmd.quick) o = plan::QuickProbeOptions(o);
  if (cmd.layers.layers_only && !cmd.layers.wanted()) {
    return fail(Status::InvalidArgument("--layers-only measures layers: name them with --model"));
  }
  std::string gpu_report =
      cmd.layers.layers_only ? "GPU figures: kept from --base (--layers-only)" : "";
  Result<plan::HardwareProfile> p =
      cmd.layers.layers_only ? base : plan::ProbeMachine(o, *base, &gpu_report);
  if (!p.ok()) return fail(p.status());
  if (cmd.layers.wanted()) {
    if (Status s = RunLayerProbe(cmd.layers, int(cmd.threads), *p); !s.ok()) return fail(s);
  }
  if (Status s = plan::SaveHardwareProfile(*p, cmd.out); !s.ok()) return fail(s);
  std::printf("host memory %.1f GB/s, CPU AdamW %.2f G params/s", p->host.memory_bandwidth / 1e9,
              p->optimizer.cpu_adamw_params_per_s / 1e9);
  if (p->HasNvme()) {
    std::printf(", NVMe read %.2f GB/s write %.2f GB/s", p->nvme.read_rate / 1e9,
                p->nvme.write_rate / 1e9);
  }
  std::printf("\n%s\n%s\nwrote %s\n", p->host.source.c_str(), gpu_report.c_str(), cmd.out.c_str());
  return 0;
}

}  // namespace ferry
