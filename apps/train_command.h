// `ferry train`: option parsing (flags and --config job files, CLI11) into a JobSpec, validation,
// the run folder, then RunTraining.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/job/job_spec.h"

namespace ferry {

struct TrainCommand {
  CLI::App* app = nullptr;
  JobSpec job;
  std::string lora_targets = "all";
};

// Adds the job options `ferry train` and `ferry plan` share (model, data, steps, batch, sequence,
// optimizer, LoRA, seed) to `app`, bound to `job`; --lora-targets goes to `lora_targets` (parse
// it with ParseLoraTargets). `job` and `lora_targets` must outlive parsing.
void AddJobOptions(CLI::App& app, JobSpec& job, std::string* lora_targets);

// Adds the `train` subcommand to `parent`; the returned object receives the parsed options and
// must outlive parsing.
void AddTrainCommand(CLI::App& parent, TrainCommand* cmd);

// Validates the parsed job, prepares the run folder, writes job.json and trains. Returns the
// process exit code: 0 done, 1 bad input or I/O failure (one line on stderr saying what to
// change), 2 training not available yet.
int RunTrainCommand(TrainCommand& cmd);

}  // namespace ferry
