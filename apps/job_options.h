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

class JobFileKeys;  // apps/job_file.h

// The run's length, --steps or --epochs, from one place: given on the command line, either wins
// over the other from a job file `file` (a --steps there turns the file's epochs off; --epochs 0
// is off anyway); both from the same place is refused, naming them. Call after parsing.
Status SettleRunLength(const CLI::App& app, const JobFileKeys* file, JobSpec& job);

// --devices (engine/job/job_devices.h: a count, cpu,cpu, cuda:0,cuda:1 or cuda:0,cuda:0), parsed
// into job.devices, job.device_kind and job.gpus; a malformed value is a CLI11 validation error
// naming the item. `help` ends the option's description. `job` must outlive parsing.
CLI::Option* AddDevicesOption(CLI::App& app, JobSpec& job, const std::string& help);

// Adds --gpu-memory SIZE (into job.gpu_memory: what each CUDA device may use, at most its share;
// JobGpuBudget checks it). `job` must outlive parsing.
CLI::Option* AddGpuMemoryOption(CLI::App& app, JobSpec& job);

// What --quantize describes: the frozen base under LoRA (train, plan, probe) or the base a model
// runs on (eval, generate).
enum class QuantizeUse { kTraining, kInference };

// Adds --quantize none|nf4 (parsed into `quantize` by ParseBaseQuant: fp4 and unknown names are
// refused by name) and --[no-]double-quant (into `double_quant`) to `app`, described for `use`.
// Both must outlive parsing.
void AddQuantizeOptions(CLI::App& app, BaseQuant* quantize, bool* double_quant, QuantizeUse use);

}  // namespace ferry
