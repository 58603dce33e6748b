// RunTraining: runs a resolved, validated job to the end on a CPU device, writing its run folder:
//   metrics.jsonl      one JSON object per update: step (1-based), loss, lr, grad_norm,
//                      tokens_per_s, elapsed_s (seconds since the first update began), and
//                      val_loss (mean over the validation set) every --eval-every updates
//   model.safetensors  the final weights, Hugging Face names (with LoRA: the frozen base)
//   adapter_model.safetensors + adapter_config.json   with LoRA: the adapter in PEFT's format
//   config.json        the model's Hugging Face config
//   job.json           the resolved job (already written by the caller)
//   checkpoints/       every job.save_every updates, at the end, and when stopped (checkpoint.h)
// Progress goes to stderr (progress_bar.h).
//
// With RunControl::resume, the run continues from the newest intact checkpoint in job.out: the
// trainable weights, AdamW moments and step are restored, metrics.jsonl is cut back to the
// checkpoint's lines and appended to, and the losses match an uninterrupted run's bit for bit
// (batches are a pure function of the step; the frozen part of the model is rebuilt from the job).
// When RunControl::stop_requested returns non-zero, the run finishes the current update, saves a
// checkpoint and returns Cancelled saying how to resume.
// A run ends (or stops) by printing measured vs predicted step time and peak
// memory per tier (engine/train/run_report.h) to stderr.
//
// REQUIRES: ValidateJobSpec(job, model) is ok and PrepareRunFolder(job.out) succeeded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "engine/job/job_spec.h"
#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/param_spec.h"
#include "engine/plan/planner.h"
#include "engine/train/checkpoint.h"
#include "kernels/status.h"

namespace ferry {

struct RunControl {
  bool resume = false;  // continue job.out's newest intact checkpoint
  // Polled after every update: a non-zero value (the signal's number) stops the run. May be empty.
  std::function<int()> stop_requested;
  // With `resume`: called with the step of the checkpoint chosen (one whose saved job is this
  // job's, CompareSavedJob) and the job as the run resolved it (--epochs' steps set) before the
  // run writes anything; a non-ok Status ends the run. May be empty.
  std::function<Status(int64_t checkpoint_step, const JobSpec& job)> on_resume;
  // Test-only (CheckpointOptions::fault_hook).
  std::function<Status(int64_t step, std::string_view stage)> checkpoint_fault_hook;
  // Test-only (OptimizerStateOptions::committed): with the optimizer state on NVMe.
  std::function<void(int64_t version, int64_t layer)> optimizer_commit_hook = nullptr;
  // Non-empty: write what the pipeline's devices and the host ran, as Chrome-trace JSON
  // (engine/exec/trace_recorder.h), to this file when the run ends or is stopped.
  std::string trace;
  // Which devices the run uses and why (ResolveJobDevices' line), printed with the other lines
  // that start the run ("ferry train: devices: ..."); empty: not printed.
  std::string devices_line;
  // Re-prices the plan on this machine's measured rates when the job runs on CPU devices, given
  // the profile it was planned on and the job's threads, and returns a line for the log (the app
  // passes PriceOnCpuDevices, engine/probe/layer_probe.h, which sits above this layer). The
  // process's peak resident set is reset after it (and without it), so the run's host peak is
  // never the probe's.
  // Empty (`ferry train --skip-rate-probe`), or failing (a warning then): the prediction stays at
  // the profile's nominal rates.
  std::function<Result<std::string>(plan::Plan& plan, const plan::HardwareProfile& profile,
                                    int threads)>
      price_plan;
};

Status RunTraining(const JobSpec& job, const ModelConfig& model, const RunControl& control = {});

}  // namespace ferry
