// `ferry plan`: the memory-budget planner on the command line. Takes the job
// options of `ferry train` (and its job files) plus a hardware profile and
// budgets; prints the plan and the per-device memory table (or JSON with
// --json), writes the timeline as SVG and Chrome trace on request, and exits
// non-zero when nothing fits, naming what is short and what would fit.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/job/job_spec.h"
#include "engine/model/model_config.h"
#include "engine/plan/planner.h"

namespace ferry {

class JobFileKeys;  // apps/job_file.h

struct PlanCommand {
  const JobFileKeys* job_file = nullptr;  // what a --config job file set (may be null)
  CLI::App* app = nullptr;
  JobSpec job;
  std::string lora_targets = "all";
  std::string hardware = "1x-rtx4090-pcie4";
  std::string gpu_memory, host_memory, nvme_dir, nvme_space;
  bool json = false;
  bool explain = false;  // --explain: the candidates weighed and why the plan won
  std::string svg, trace;
  std::string dtype = "bf16";  // --dtype: bf16, fp16, or f32 (CPU devices)
};

// A preset name (configs/<kind>/<name>.json; configs/ of the source tree, or $FERRY_CONFIG_DIR)
// or a path to a file (a folder: its config.json). `kind`: "models" or "hardware".
std::string ResolveConfigPath(const std::string& kind, const std::string& name);

// --model as train, eval and generate resolve it (a Hugging Face folder, "tiny"), plus the presets
// in configs/models and config.json files.
Result<ModelConfig> ResolvePlanModel(const std::string& name);

// The planner's job for parsed job options: batch, sequence, micro-batches (auto unless
// `micro_batches_given`), LoRA on `lora_targets`, and the compute dtype `dtype` ("bf16", "fp16",
// or "f32": CPU devices, op scratch for job.threads threads, all cores when 0). InvalidArgument
// names the option. REQUIRES: ValidateJobShape(job, model) is ok.
Result<plan::PlanJob> PlanJobOf(const JobSpec& job, const std::string& lora_targets,
                                bool micro_batches_given, const std::string& dtype);

// Adds the `plan` subcommand to `parent`; `cmd` receives the options and must
// outlive parsing.
void AddPlanCommand(CLI::App& parent, PlanCommand* cmd);

// Exit code: 0 a plan fits; 1 bad input or I/O failure (one line on stderr); 3
// nothing fits (the binding constraint and the changes that would fit are
// printed).
int RunPlanCommand(PlanCommand& cmd);

}  // namespace ferry
