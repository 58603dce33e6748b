// `ferry plan`: the memory-budget planner on the command line. Takes the job
// options of `ferry train` (and its job files) plus a hardware profile and
// budgets; prints the plan and the per-device memory table (or JSON with
// --json), writes the timeline as SVG and Chrome trace on request, and exits
// non-zero when nothing fits, naming what is short and what would fit.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/job/job_spec.h"

namespace ferry {

struct PlanCommand {
  CLI::App* app = nullptr;
  JobSpec job;
  std::string lora_targets = "all";
  std::string hardware = "1x-rtx4090-pcie4";
  std::string gpu_memory, host_memory, nvme_dir, nvme_space;
  bool json = false;
  bool stale_updates = false;  // --stale-updates
  std::string svg, trace;
};

// A preset name (configs/<kind>/<name>.json; configs/ of the source tree, or $FERRY_CONFIG_DIR)
// or a path to a file (a folder: its config.json). `kind`: "models" or "hardware".
std::string ResolveConfigPath(const std::string& kind, const std::string& name);

// Adds the `plan` subcommand to `parent`; `cmd` receives the options and must
// outlive parsing.
void AddPlanCommand(CLI::App& parent, PlanCommand* cmd);

// Exit code: 0 a plan fits; 1 bad input or I/O failure (one line on stderr); 3
// nothing fits (the binding constraint and the changes that would fit are
// printed).
int RunPlanCommand(PlanCommand& cmd);

}  // namespace ferry
