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

// Adds --quantize none|nf4 to `app`, parsed into `quantize` (ParseBaseQuant: fp4 and unknown
// names are refused by name), described by `help`. `quantize` must outlive parsing.
void AddQuantizeOption(CLI::App& app, BaseQuant* quantize, const std::string& help);

}  // namespace ferry
