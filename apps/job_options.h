// The job options `ferry train`, `ferry plan` and `ferry probe --model` share (model, data, steps,
// batch, sequence, optimizer, LoRA, seed): the flags and, through --config job files
// (apps/job_file.h), the job files' keys.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/job/job_spec.h"

namespace ferry {

// Adds the shared job options to `app`, bound to `job`; --lora-targets goes to `lora_targets`
// (parse it with ParseLoraTargets). `job` and `lora_targets` must outlive parsing.
void AddJobOptions(CLI::App& app, JobSpec& job, std::string* lora_targets);

}  // namespace ferry
