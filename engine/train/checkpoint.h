// Checkpoints of a training run: what a resume needs to continue bit for bit, written so that a
// crash or a kill -9 at any moment leaves the previous checkpoint intact.
//
// Layout (RUN_DIR/checkpoints/):
//   step-00000040/                 one checkpoint, named by the updates done
//     trainable.safetensors[.zst]  every trainable storage-owning parameter (full fine-tuning: the
//                                  whole model; LoRA: the adapter only — the frozen base is
//                                  rebuilt from the job, as at the start of the run), ferry's
//                                  names, master layout, fp32, 1-D
//     optimizer.safetensors[.zst]  AdamW's "<name>/exp_avg" and "<name>/exp_avg_sq" for each
//     metrics.jsonl                the run's metrics lines 1..step
//     state.json                   written last: format, step, data_position, rng, elapsed_s, the
//                                  resolved job, for every other file its size, CRC-32C and
//                                  compression, and with f16 loss scaling the scaler's state
//                                  (loss_scaler: scale, growth_tracker, skipped_steps)
//   latest                         the name of the newest checkpoint ("step-00000040\n")
//
// Data position and RNG state: a micro-batch is a pure function of (seed, step, micro)
// (dataset.h) and initialization of (seed, name, index), so there is no RNG state to save: the
// data position is the step, recorded as such.
//
// Writing (SaveCheckpoint): every file goes into ".tmp-step-K/" and is fsynced; the folder is
// fsynced, renamed to "step-K" and the parent fsynced; then `latest` is replaced the same way
// (WriteFileAtomically); then checkpoints beyond the newest `keep` are renamed to ".trash-*" and
// removed. Leftover ".tmp-*" and ".trash-*" folders (a killed save) are removed by the next save.
// With `compress`, the tensor files are zstd-compressed in frames (the header's, then at most
// 16 MiB of a tensor each; offload/zstd_codec.h), which a reader decompresses as one. A tensor file
// is written straight from the trainer's buffers as it is produced, and read back a piece at a time
// straight into its tensors when it is not compressed: no second copy of the state in RAM.
//
// Reading (ReadCheckpoint) verifies every file's size and checksum before using it: a corrupt or
// truncated checkpoint is a Corruption error naming the file. LoadLatestCheckpoint tries `latest`
// and then every other checkpoint newest first, warning about each one that fails, so a run
// resumes from the newest intact checkpoint (policy: fall back with a warning, never silently).
//
// Stateless functions; thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "engine/json.h"
#include "engine/model/model_runner.h"
#include "engine/model/param_spec.h"
#include "engine/train/trainer.h"
#include "kernels/status.h"

namespace ferry {

struct CheckpointOptions {
  int64_t keep = 3;       // newest checkpoints kept (>= 1); older ones are removed after a save
  bool compress = false;  // zstd the tensor files
  // Test-only fault injection: called with the checkpoint's step and the stage reached
  // ("trainable", "optimizer", "metrics", "state": that file is written into the temporary folder;
  // "publish": before the rename) — a non-ok Status aborts the save there, and a hook may also kill
  // the process.
  std::function<Status(int64_t step, std::string_view stage)> fault_hook;
  // Gets one line when a save replaces another job's checkpoint of the same step. May be empty.
  std::function<void(const std::string&)> warn;
};

// The run's bookkeeping that goes beside the trainer's state.
struct CheckpointMeta {
  double elapsed_s = 0;  // training seconds so far (metrics' elapsed_s continues from it)
  nlohmann::json job;    // the resolved job (JobSpecToJson)
  std::string metrics;   // metrics.jsonl lines 1..step
};

// A checkpoint read back and verified.
struct CheckpointState {
  std::string dir;   // the checkpoint folder
  int64_t step = 0;  // updates done == the data position
  CheckpointMeta meta;
  HostTensors trainable;  // master weights of the trainable parameters
  HostTensors exp_avg, exp_avg_sq;
  std::optional<LossScalerState> loss_scaler;  // present for runs with loss scaling (f16)
};

// RUN_DIR/checkpoints
std::string CheckpointsDir(const std::string& run_dir);
// "step-00000040"
std::string CheckpointName(int64_t step);

// Writes checkpoint step-<trainer.steps_done()> of `run_dir` as described above and returns its
// folder. When that folder already exists and is an intact checkpoint of this job (meta.job,
// compared by CompareSavedJob: a resumed run saving the step it resumed from) it is left as it
// is: by determinism it holds the same state. Another job's folder of that step (copied in), or an
// unreadable one, is replaced once the new one is complete (options.warn says so). Pruning keeps
// the newest `keep` checkpoints of this job and never counts or removes another job's. Errors
// name the file; nothing already saved is touched by a failed save.
Result<std::string> SaveCheckpoint(const std::string& run_dir, const Trainer& trainer,
                                   const CheckpointMeta& meta, const CheckpointOptions& options);

// Reads and verifies one checkpoint folder. Corruption naming the file for a bad size, checksum,
// header or state.json; NotFound when state.json is absent (an unfinished save).
Result<CheckpointState> ReadCheckpoint(const std::string& dir);

// The newest intact checkpoint of `run_dir` (see above); `warn` gets one line per checkpoint
// skipped. NotFound, with advice, when there is none.
// `accept`, when given, is asked about each intact one: a non-ok Status (a checkpoint of another
// job) skips it with a warning like a corrupt one.
Result<CheckpointState> LoadLatestCheckpoint(
    const std::string& run_dir, const std::function<void(const std::string&)>& warn,
    const std::function<Status(const CheckpointState&)>& accept = {});

// Overwrites the trainable parameters of `weights` with the checkpoint's, moving them out of
// `checkpoint` (its `trainable` is empty after). InvalidArgument naming the tensor when one is
// missing or mis-sized (a checkpoint of another model); nothing is moved then.
Status ApplyCheckpointWeights(CheckpointState& checkpoint, const std::vector<LayerSpec>& layers,
                              HostTensors& weights);

}  // namespace ferry
