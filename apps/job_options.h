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

// What --quantize describes: the frozen base under LoRA (train, plan, probe) or the base a model
// runs on (eval, generate).
enum class QuantizeUse { kTraining, kInference };

// Adds --quantize none|nf4 (parsed into `quantize` by ParseBaseQuant: fp4 and unknown names are
// refused by name) and --[no-]double-quant (into `double_quant`) to `app`, described for `use`.
// Both must outlive parsing.
void AddQuantizeOptions(CLI::App& app, BaseQuant* quantize, bool* double_quant, QuantizeUse use);

}  // namespace ferry
