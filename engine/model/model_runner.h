// ModelRunner: the contract between the Trainer (engine/train) and what runs a whole model's
// forward and backward for the micro-batches of a step, with the types it exchanges (a micro-batch,
// the step's hooks, the runner's counters).
//
// Every job runs through one implementation, the pipeline executor's PipelineRunner
// (engine/exec/pipeline_runner.h): one device is a one-stage plan sized by the exact memory model.
// A second, plain implementation stays as the independent reference the executor is checked
// against (engine/testing/reference_runner.h: tests, bench/ and the interop tool; never linked into
// ferry).
//
// Gradient semantics: AccumulateGradients adds (+=) into HostGradients across micro-batches; the
// loss of a micro-batch is sum(-log p) over its non-masked targets divided by `normalizer` (the
// number of non-masked targets of the whole global batch), so accumulating all micro-batches gives
// exactly the gradient of one big batch. With tied embeddings the head's gradient is added to the
// embedding's (HostGradients has one buffer per storage-owning parameter).
//
// Thread-safety: one host thread drives a runner at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/host_tensors.h"
#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/param_spec.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry {

// A micro-batch. Packed rows (several documents per row) give doc_ids and positions: attention
// never crosses a change of doc id within a row, and RoPE / learned positions use `positions`
// (restarting at 0 per document, as Hugging Face's packed position_ids). Both empty: each row is
// one document at positions 0..T-1.
struct MicroBatchInput {
  std::span<const int32_t> tokens;        // (B, T)
  std::span<const int32_t> targets = {};  // (B, T), -100 where masked
  double normalizer = 1;                  // non-masked targets of the global batch (> 0)
  // fp16 dynamic loss scaling (engine/train/loss_scaler.h): the gradients are those of
  // loss * loss_scale (the loss returned is not scaled); 1 otherwise.
  double loss_scale = 1;
  std::span<const int32_t> doc_ids = {};  // (B, T) or empty
  // (B, T) or empty; each below max_position_embeddings with learned positions (GPT-2).
  std::span<const int32_t> positions = {};
  // true: `grads` is overwritten with this micro-batch's gradients (zero where it has none)
  // instead of added to, so the first micro-batch of a step needs no zeroed buffers. The result
  // equals zeroing then adding (0 + g == g).
  bool overwrite_grads = false;
  ThreadPool* host_pool = nullptr;  // host-side gradient work runs on it; nullptr = inline
};

// What a runner that reads the host master weights during a step (streams_weights()) tells its
// caller as the step goes, on the thread that called AccumulateStep, so the optimizer can run
// inside the step (engine/train/trainer.h). Layers are indices into BuildLayerSpecs' list
// (0: embedding, then the blocks, then the head). Either may be empty.
struct StepHooks {
  // Called before the runner reads the master weights of layers [first, last), the owners of
  // their tied parameters included, so pending updates of those can be applied first. An error
  // stops the step.
  std::function<Status(int64_t first, int64_t last)> weights_needed;
  // Called once the runner has read what it reads this step of layers [first, last)'s master
  // weights (their owners' included): each layer is reported once a step, so a parameter read by
  // several layers (a tied one) has been read when the last of them is reported.
  std::function<Status(int64_t first, int64_t last)> weights_read;
  // Called once the gradients of the storage-owning parameters of layers [first, last) are final
  // in `grads` (a tied parameter's gradient is final when its owner's layer is reported). Every
  // gradient is final when AccumulateStep returns, reported or not.
  std::function<Status(int64_t first, int64_t last)> grads_landed;
  // Set by a caller whose master weights, once this step has read them, stay as they are until
  // its next Step (one-step-stale updates: the Trainer applies a step's updates only as the next
  // step reads each layer): a runner may read the next step's first layers at this step's end,
  // so their upload overlaps the end of this step. It then calls those layers' weights_needed in
  // this step, before reading them, and their weights_read in the next Step, where it would read
  // them.
  bool read_ahead = false;
  // Whether the master weights changed since the caller's last Step (updates applied between
  // steps, before a checkpoint or an evaluation): what was read ahead is then read again.
  bool weights_changed = true;
};

struct RunnerStats {
  int64_t block_forward_calls = 0;  // counts recomputation too
  size_t arena_peak_bytes = 0;
  // Bytes the drive read of the frozen base to stream it (the model's files or its converted
  // copy), so far, in whole 4096-byte blocks (ExecutorStats::base_bytes_from_drive): a plan that
  // streams the base (its frozen weights on NVMe); else 0.
  uint64_t base_bytes_from_drive = 0;
  // Steps that took the first weights read ahead at the step before's end (StepHooks::
  // read_ahead; ExecutorStats::stages_read_ahead).
  int64_t stages_read_ahead = 0;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // Uploads the parameters (frozen and trainable) from the host master copy. A runner that
  // streams weights (streams_weights()) instead borrows `weights` until the next call and reads
  // it during each AccumulateStep.
  virtual Status UploadWeights(const HostTensors& weights) = 0;
  // true: AccumulateStep reads the master weights given to UploadWeights layer by layer during
  // the step (announcing each read through StepHooks::weights_needed), so updates made between
  // steps need no new UploadWeights. false: the device holds its own copy.
  virtual bool streams_weights() const { return false; }
  // Forward + backward of one micro-batch; returns its loss contribution (sum of -log p over its
  // non-masked targets / normalizer) and adds its gradients into `grads` (trainable parameters
  // only; grads must hold a zero-initialized or accumulating buffer for each), or overwrites
  // them when mb.overwrite_grads.
  virtual Result<double> AccumulateGradients(const MicroBatchInput& mb, HostTensors& grads) = 0;
  // Forward only: sum of -log p over the non-masked targets / normalizer, through the fused
  // head's loss-only pass (no backward, no gradients, no (N, V) logits).
  // (Default for test doubles: Unavailable.)
  virtual Result<double> EvaluateLoss(const MicroBatchInput& mb) {
    (void)mb;
    return Status::Unavailable("this runner has no forward-only loss");
  }

  // All micro-batches of one optimizer step: the sum of their loss contributions, gradients added
  // into `grads` as AccumulateGradients does. The default runs them one after another (and calls
  // no hook); a pipeline (engine/exec/pipeline_runner.h) runs them stage by stage and reports
  // through `hooks` as it goes.
  virtual Result<double> AccumulateStep(std::span<const MicroBatchInput> batches,
                                        HostTensors& grads, const StepHooks& hooks) {
    (void)hooks;
    double loss = 0;
    for (const MicroBatchInput& mb : batches) {
      FERRY_ASSIGN_OR_RETURN(double l, AccumulateGradients(mb, grads));
      loss += l;
    }
    return loss;
  }
  // Forward only: the full logits (B*T, V) in fp32, for tests and evaluation.
  virtual Result<std::vector<float>> Logits(std::span<const int32_t> tokens) = 0;
  // As Logits, for packed rows: mb.tokens with mb.doc_ids and mb.positions (targets unused).
  virtual Result<std::vector<float>> PackedLogits(const MicroBatchInput& mb) {
    (void)mb;
    return Status::Unavailable("this runner has no packed logits");
  }
  virtual RunnerStats stats() const = 0;
  // Host RAM the runner's own buffers occupy now (a pipeline's pinned staging, as it is filled or
  // locked, and its other host buffers: PipelineExecutor::HostResidentBytes); 0 for a runner
  // with none.
  virtual uint64_t host_resident_bytes() const { return 0; }
};

}  // namespace ferry
