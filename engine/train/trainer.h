// Trainer: optimizer steps of one model on one device. It owns the host fp32 master weights and
// the AdamW state, and drives the device only through a ModelRunner (weights uploaded from the
// master copy, gradients downloaded into host buffers), so the pipeline executor can generalize
// it rather than replace it.
//
// One Step(global batch):
//   1. zero the host gradient of every trainable storage-owning parameter;
//   2. ModelRunner::AccumulateStep over the micro-batches (a pipeline runs them stage by stage;
//      one device, one after another with AccumulateGradients) with normalizer = the non-masked
//      targets of the whole global batch (BatchSource::ValidTargets), so the accumulated gradient
//      is exactly that of one big batch; a tied alias's gradient arrives already added to its
//      owner's (the runner's contract);
//   3. the global gradient norm (double sums in parameter order, cpu::AdamWKernel::SumOfSquares)
//      -> the clip coefficient (grad_clip.h), applied as AdamW's grad_scale;
//   4. AdamW (bias-corrected, decoupled weight decay only where ParamSpec::decays) at the
//      warm-up + cosine rate of this update (lr_schedule.h), on trainable parameters only —
//      frozen LoRA base weights have no gradient and no optimizer state;
//   5. ModelRunner::UploadWeights from the updated master copy.
// Everything is a pure function of the initial weights and the batches: no hidden RNG state.
//
// Per-layer updates (DESIGN.md, "Execution"): with a runner that streams weights (a pipeline:
// ModelRunner::streams_weights), steps 3 and 4 run layer by layer inside the step, on the thread
// that drives it, while the devices go on (StepHooks):
//   - each parameter's sum of squares is taken as soon as its layer's gradients land, and the
//     norm adds those sums in parameter order afterwards, so it is the same double as above;
//   - without clipping a parameter is updated as soon as it lands (its update needs nothing
//     else), overlapping the backward stages still running;
//   - with clipping every update needs the global norm, so the step ends with all of them
//     pending; the next step applies them layer by layer just before it reads each layer's
//     weights (forward order), so its first stages start while later layers are still updated.
// The arithmetic of every update is the one above, so the results are bit for bit those of the
// whole-step order. Pending updates are applied by FinishUpdates, which must run before the
// weights or moments are read (weights(), exp_avg(), exp_avg_sq() check it). Step 5 is skipped:
// the runner reads the master copy itself.
//
// Stale updates (OptimizerOptions::stale_updates): every update of step k stays pending into step
// k + 1 and is applied as soon as step k + 1 has read that parameter's weights (so it reads w_k)
// and before its new gradient lands (StepHooks::weights_read). The first step runs on the initial
// weights, as does the second. FinishUpdates makes the newest weights current, so a checkpoint is
// a synchronization point: the step after it runs on the weights it saved, and a run resumed
// from it repeats the uninterrupted run bit for bit.
//
// Optimizer state on NVMe (OptimizerStateOptions::nvme_dir, when the plan says optimizer_on_nvme):
// each layer's fp32 master weights and AdamW moments are one record of a VersionedStore
// (offload/versioned_store.h) in that folder, not in RAM. A layer's update acquires its record
// (read ahead in the order updates run: backward order when updates run as gradients land, forward
// order otherwise), applies AdamW there with the same arithmetic, copies the new master values
// into weights() and commits the record to its other slot, so a kill -9 leaves every layer wholly
// at one step (the store's header says which). What stays in RAM: weights() (the copy the
// runner uploads from; with f32 compute it equals the master values), the gradients, and two
// staging buffers of one layer's record each (the plan counts two stages' worth,
// optimizer.staging). RestoreOptimizer rebuilds the store from a checkpoint; ReadOptimizerState
// reads the moments back for one. With stale updates a layer's record is updated once the step
// has read all of its parameters (a tied one by its last reader), so records are updated, and
// read ahead, in the order the step finishes reading them.
//
// fp16 dynamic loss scaling (OptimizerOptions::loss_scaling, engine/train/loss_scaler.h): the
// runner gets the step's scale (MicroBatchInput::loss_scale), so the gradients that land are of
// loss * scale. Whether they are finite is global like the clip norm, so updates wait the same
// way (the step ends with all of them pending): the sum of squares, taken as gradients land, is
// finite exactly when every gradient is. Finite: the norm is that of the unscaled gradients
// (sum / scale^2, exact for a power of two) and AdamW's grad_scale is clip_coef / scale, so the
// gradients are unscaled before clipping and the update and are never rewritten. Non-finite: the
// step's update is skipped — no weight, moment or AdamW step count changes (AdamW's bias
// correction counts the updates made, steps_done() - skipped steps) — and the scale halves. The
// learning-rate schedule still advances with steps_done(), as with torch's GradScaler when
// scheduler.step() is called every iteration: the schedule follows the data position and the
// run's --steps, so a skipped step (rare after the first few, which find the scale) does not
// stretch the run. The scaler's state goes into checkpoints (RestoreOptimizer).
//
// Ownership: the runner and pool are borrowed and must outlive the Trainer.
// Thread-safety: one thread drives a Trainer at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/exec/trace_recorder.h"
#include "engine/model/model_runner.h"
#include "engine/model/param_spec.h"
#include "engine/train/dataset.h"
#include "engine/train/loss_scaler.h"
#include "engine/train/lr_schedule.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/status.h"
#include "offload/io_env.h"
#include "offload/versioned_store.h"

namespace ferry {

struct OptimizerOptions {
  LrSchedule schedule;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied only to parameters whose spec decays
  double grad_clip = 0.0;     // global-norm threshold; 0: off
  // One-step-stale updates (opt-in; they change the numerics): each step runs on the weights one
  // update older than the newest, w_{k+1} = AdamW(w_k, g(w_{k-1})), so the whole optimizer
  // overlaps the next step. Needs a runner that streams weights (see below).
  bool stale_updates = false;
  // fp16 dynamic loss scaling (see above); disabled: scale 1, nothing changes.
  LossScalerOptions loss_scaling = {};
};

// Where the optimizer state lives (see above).
struct OptimizerStateOptions {
  std::string nvme_dir;  // non-empty: master weights and AdamW moments on NVMe here, else RAM
  IoEnv* env = nullptr;  // the store's IoEnv (tests inject faults); null: the real OS
  // Test seam (production passes none): called on the updating thread right after a layer's
  // record is committed, with the version it now holds (the steps it has seen) and the layer.
  std::function<void(int64_t version, int64_t layer)> committed = nullptr;
  // Resuming: what RestoreOptimizer takes, taken by Create instead, the moments moved in (or, on
  // NVMe, written into the store) rather than allocated as zeros beside them, so a resumed run
  // never holds its moments twice. Null: a new run.
  struct Resumed {
    int64_t steps_done = 0;
    HostTensors exp_avg, exp_avg_sq;  // emptied by Create
    std::optional<LossScalerState> loss_scaler;
  };
  std::shared_ptr<Resumed> resume = nullptr;
};

struct StepStats {
  int64_t step = 0;           // 0-based index of the update just made
  double loss = 0;            // mean over the global batch's non-masked targets
  double lr = 0;              // the rate this update used
  double grad_norm = 0;       // global norm before clipping
  double clip_coef = 1;       // min(1, clip / (norm + 1e-6)); 1 without clipping
  double loss_scale = 1;      // the scale this step's gradients were computed at
  bool skipped = false;       // non-finite gradients (fp16 loss scaling): no update was made
  int64_t tokens = 0;         // tokens processed (B * T over the micro-batches)
  int64_t valid_targets = 0;  // the loss normalizer
  // Wall time of the step's parts: the runner's forward + backward over the micro-batches, and
  // the rest (gradient norm, AdamW on the host, uploading the updated weights).
  // With a runner that streams weights, optimizer work inside the step (updates applied as
  // gradients land or as the step reads the weights) overlaps the devices: it is counted in
  // optimizer_in_step_seconds, not in compute_seconds. optimizer_seconds is the part after the
  // devices finished (exposed).
  double compute_seconds = 0;
  double optimizer_seconds = 0;
  double optimizer_in_step_seconds = 0;
};

class Trainer {
 public:
  // `weights` holds every storage-owning parameter of `layers` (master_weights.h); they are
  // uploaded to the runner here. `pool` (may be null) runs the optimizer on the host. Errors:
  // InvalidArgument for bad optimizer options; the runner's upload errors.
  static Result<std::unique_ptr<Trainer>> Create(ModelRunner* runner, std::vector<LayerSpec> layers,
                                                 HostTensors weights,
                                                 const OptimizerOptions& options, ThreadPool* pool,
                                                 OptimizerStateOptions state = {});

  // One optimizer update over the global batch `micro_batches` (all of one shape); with a runner
  // that streams weights and clipping on, the update may still be pending at return (see above).
  // Errors: InvalidArgument when the batch has no non-masked target; the runner's errors.
  Result<StepStats> Step(std::span<const MicroBatch> micro_batches);
  // Applies every pending update, so the weights and moments are those after steps_done()
  // updates. Cheap when none is pending.
  Status FinishUpdates();
  bool updates_pending() const { return pending_count_ > 0; }

  int64_t steps_done() const { return step_; }
  bool loss_scaling() const { return scaler_.enabled(); }
  // The loss scaler's state (scale 1 and no skips without loss scaling).
  const LossScalerState& loss_scaler_state() const { return scaler_.state(); }
  // Records each layer's optimizer work (norm and update) as a span on the trace's CPU optimizer
  // lane (null: none). Borrowed; must outlive the Trainer or be reset.
  void set_trace(exec::TraceRecorder* trace) { trace_ = trace; }
  // REQUIRES (for these three): !updates_pending() (checked: aborts naming FinishUpdates).
  const HostTensors& weights() const;
  const std::vector<LayerSpec>& layers() const { return layers_; }
  // Bytes of AdamW state (m and v) held in RAM: 8 per trainable element (0 with it on NVMe).
  size_t optimizer_state_bytes() const;
  bool has_optimizer_state(const std::string& name) const { return state_.count(name) != 0; }
  // Trainable storage-owning parameter names, in layer order.
  const std::vector<std::string>& trainable_names() const { return order_; }
  // AdamW's first (exp_avg) and second (exp_avg_sq) moments of a trainable parameter, for
  // checkpoints. REQUIRES: has_optimizer_state(name), and the state is in RAM (else it aborts:
  // see ReadOptimizerState).
  std::span<const float> exp_avg(const std::string& name) const;
  std::span<const float> exp_avg_sq(const std::string& name) const;
  // Reads AdamW's moments wherever they live, for a checkpoint: in RAM, the trainer's own buffers;
  // on NVMe, the committed record of each layer, read once and held (the next one read ahead)
  // while its parameters are read, so asking in trainable_names() order reads every record once.
  // Borrows the trainer, which must not update while it lives; releases what it holds.
  class OptimizerStateReader {
   public:
    OptimizerStateReader(const OptimizerStateReader&) = delete;
    OptimizerStateReader& operator=(const OptimizerStateReader&) = delete;
    ~OptimizerStateReader() { Release(); }
    struct Moments {
      std::span<const float> exp_avg, exp_avg_sq;
    };
    // `name`'s moments, valid until a read of another layer's parameter or the reader's end.
    // Errors: the store's, naming the layer. REQUIRES: has_optimizer_state(name).
    Result<Moments> Read(const std::string& name);

   private:
    friend class Trainer;
    explicit OptimizerStateReader(const Trainer& t) : t_(t) {}
    void Release();
    const Trainer& t_;
    std::optional<size_t> held_;  // the record acquired from the store
    std::span<const std::byte> record_;
  };
  // REQUIRES: !updates_pending().
  OptimizerStateReader StateReader() const;
  // Copies both moments of `name` (StateReader's Read).
  Status ReadOptimizerState(const std::string& name, std::vector<float>* exp_avg,
                            std::vector<float>* exp_avg_sq) const;
  // The NVMe store of the optimizer state; null when it is in RAM.
  const VersionedStore* state_store() const { return store_.get(); }
  // Whether the optimizer state lives on NVMe (even when a failed rebuild left no store).
  bool optimizer_state_on_nvme() const { return on_nvme(); }
  // Resumes from a checkpoint: the moments of every trainable parameter, the number of updates
  // already made (the master weights come in through Create) and, when given, the loss scaler's
  // state (absent: the scaler starts afresh). Errors: InvalidArgument naming a tensor that is
  // missing or has the wrong size, or a scaler state that does not fit (nothing is changed then).
  // The moments are taken by value: pass them with std::move not to hold them twice.
  Status RestoreOptimizer(int64_t steps_done, HostTensors exp_avg, HostTensors exp_avg_sq,
                          const std::optional<LossScalerState>& loss_scaler = std::nullopt);

 private:
  struct State {
    const ParamSpec* spec = nullptr;
    std::vector<float> m, v;  // empty when the state is on NVMe
    size_t index = 0;         // in order_
  };
  // The hyperparameters of one update, all but those of its parameter.
  struct Update {
    double lr = 0;
    int64_t step = 0;     // AdamW's, 1-based: the updates made (skipped steps do not count)
    int64_t version = 0;  // steps_done() after this step: the NVMe store's version
    double grad_scale = 1;
  };
  Trainer(ModelRunner* runner, std::vector<LayerSpec> layers, HostTensors weights,
          const OptimizerOptions& options, ThreadPool* pool, OptimizerStateOptions state);

  // AdamW on the trainable parameter order_[k] (state in RAM).
  Status Apply(size_t k, const Update& u);
  // AdamW on order_[k]'s values p, m, v (wherever they are) with its gradient.
  Status UpdateParam(size_t k, const Update& u, float* p, float* m, float* v);
  // AdamW on every parameter of record g, state on NVMe: acquire, update, commit.
  Status ApplyRecord(size_t g, const Update& u);
  // Applies order_[k]'s update wherever its state is (on NVMe: its whole record's) and clears
  // the pending marks it covers.
  Status ApplyAndClear(size_t k, const Update& u);
  // (Re)creates the store at `step` from weights_ and the given moments (null: zeros).
  Status CreateStore(int64_t step, const HostTensors* exp_avg, const HostTensors* exp_avg_sq);
  // Lands layer l's parameters not landed yet; without clipping, updates them.
  Status LandLayer(size_t l, const Update& u);
  // Applies the pending updates of the parameters whose master values layers [first, last) read.
  Status ApplyPending(int64_t first, int64_t last);
  // Takes order_[k]'s sum of squares (and, without clipping, updates it at `u`).
  Status Land(size_t k, const Update& u);
  void RequireNoPending(const char* what) const;
  void RequireStateInRam(const char* what) const;  // aborts naming ReadOptimizerState
  bool on_nvme() const { return !state_options_.nvme_dir.empty(); }
  // Updates wait for a global figure (the clip norm, the loss scaler's finiteness check) or for
  // the next step (stale updates) instead of running as gradients land.
  bool updates_wait() const {
    return options_.grad_clip > 0 || options_.stale_updates || options_.loss_scaling.enabled;
  }
  // FailedPrecondition when the state is on NVMe but a failed CreateStore left no store.
  Status RequireStore() const;
  Status CheckLayers(int64_t first, int64_t last) const;  // a StepHooks range

  ModelRunner* runner_;  // not owned
  std::vector<LayerSpec> layers_;
  HostTensors weights_;                 // storage-owning parameters: fp32 masters (frozen ones
                                        // may be NF4 or served from the model's files)
  HostTensors grads_;                   // trainable storage-owning parameters only
  std::map<std::string, State> state_;  // AdamW moments, trainable parameters only
  std::vector<std::string> order_;      // trainable names in layer order (deterministic sums)
  OptimizerOptions options_;
  OptimizerStateOptions state_options_;
  ThreadPool* pool_;  // not owned; may be null
  cpu::AdamWKernel kernel_;
  int64_t step_ = 0;
  LossScaler scaler_;
  exec::TraceRecorder* trace_ = nullptr;  // not owned; may be null
  // Per layer: the trainable parameters (indices into order_) whose gradients land with it, and
  // those whose master values it reads (its own and the owners of its tied parameters).
  std::vector<std::vector<size_t>> lands_, reads_;
  // Per trainable parameter, for the step in flight: its sum of squares and whether it landed;
  // stale updates: how many of the layers that read it have not read it yet (of readers_).
  std::vector<double> sum_sq_;
  std::vector<char> landed_;
  std::vector<int> readers_, unread_;
  // Updates waiting for the next step's reads (or FinishUpdates): per parameter, and their
  // common hyperparameters.
  std::vector<char> pending_;
  size_t pending_count_ = 0;
  // Stale updates: whether the weights changed since the last step (FinishUpdates applied
  // updates; the first step has none before it), so what the runner read ahead is stale
  // (StepHooks::weights_changed).
  bool changed_between_steps_ = true;
  Update pending_update_;
  // Optimizer state on NVMe: one record per layer with trainable parameters (record_layer_),
  // each parameter's [master | exp_avg | exp_avg_sq] at record_offset_ floats into its record.
  std::unique_ptr<VersionedStore> store_;
  std::vector<size_t> record_of_, record_offset_;   // per trainable parameter
  std::vector<size_t> record_layer_;                // per record
  std::vector<std::vector<size_t>> record_params_;  // per record, indices into order_
  // Updates that wait (clipping, loss scaling, stale updates) with the state on NVMe: the records
  // in the order the next step's reads apply them, which the store reads ahead in, and the next
  // record after each in that order (records(): none). First guessed from the layers (the first
  // layer that reads a record's parameters; stale: the last), then learned from each step that
  // applied them all (applied_): the executor reads its stages' weights in the order it prepares
  // them, which is not the layers' order on several devices. record_unread_: stale updates, per
  // record, for the step in flight, how many of its parameters some layer has still to read.
  std::vector<size_t> update_order_, update_next_, record_unread_, applied_;
  void SetUpdateOrder(std::span<const size_t> order);
  bool updates_descend_ = false;  // this step's updates run in backward layer order
};

}  // namespace ferry
