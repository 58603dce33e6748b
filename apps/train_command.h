// `ferry train`: option parsing (flags and --config job files, CLI11) into a JobSpec, validation,
// the run folder, then RunTraining.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/job/job_spec.h"

namespace ferry {

class JobFileKeys;  // apps/job_file.h

struct TrainCommand {
  const JobFileKeys* job_file = nullptr;  // what a --config job file set (may be null)
  CLI::App* app = nullptr;
  JobSpec job;
  std::string lora_targets = "all";
  std::string resume;            // --resume RUN_DIR; empty: a new run
  bool force = false;            // --force: replace the run folder --out (engine/job/run_folder.h)
  std::string trace;             // --trace FILE: the measured timeline (Chrome trace)
  bool skip_rate_probe = false;  // --skip-rate-probe: predict at the profile's nominal rates
};

// Adds the `train` subcommand to `parent`; the returned object receives the parsed options and
// must outlive parsing.
void AddTrainCommand(CLI::App& parent, TrainCommand* cmd);

// Validates the parsed job, prepares the run folder, writes job.json and trains (or, with
// --resume RUN_DIR, reads RUN_DIR/job.json — only --steps or --epochs, --threads, --save-every,
// --keep-checkpoints and --checkpoint-compress may differ from it — and continues the run).
// SIGINT/SIGTERM stop the run after the current update with a checkpoint (StopSignals).
// Returns the process exit code: 0 done, 1 bad input or I/O failure (one line on stderr saying
// what to change), 2 training not available yet, 128 + the signal's number (130 SIGINT,
// 143 SIGTERM) when stopped by a signal after saving a checkpoint.
//
// Test-only: FERRY_TEST_CHECKPOINT_KILL=<step>:<stage> makes the process kill itself with
// SIGKILL at that stage of that step's checkpoint (CheckpointOptions::fault_hook), to prove that
// a kill -9 mid-save leaves the previous checkpoint usable; FERRY_TEST_COMMIT_KILL=<version>:<n>,
// with the optimizer state on NVMe, kills it right after the n-th layer record committed at that
// version (OptimizerStateOptions::committed), its other layers not yet updated: inside step
// <version> with --grad-clip 0 (updates as gradients land), else inside the next step's forward.
int RunTrainCommand(TrainCommand& cmd);

}  // namespace ferry
