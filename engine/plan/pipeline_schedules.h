// Schedule builders: ferry's round-robin dispatch (DESIGN.md, "Execution") and the weight-bound
// baselines GPipe and 1F1B (each stage pinned to one GPU), as task graphs for the simulator.
// Inputs are plain per-stage numbers (seconds and bytes), so the builders are testable without
// model code; the planner fills them from the model's per-layer costs.
//
// Task names: F<s>.<j> forward of stage s on micro-batch j, B<s>.<j> backward, T.<j> the fused
// head+loss tail, W<s>[.<c>] weight upload (chunk c), I<s>.<j> activation upload, O<s>.<j>
// activation download, G<s> gradient download, U<s> optimizer update, E.<j> / EB.<j> the
// embedding's host gather / gradient scatter-add, P<s> / A<s> the host's weight packing /
// gradient adding.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/plan/simulator.h"
#include "kernels/status.h"

namespace ferry::plan {

// Work on the host (per micro-batch, or per stage): a measured time, or else bytes moved at the
// host memory bandwidth (shared with the transfers running then). Both 0: none.
struct HostWork {
  double seconds = 0;
  double bytes = 0;
};

struct StageCost {
  double fwd_s = 0;         // compute per micro-batch, forward (tail: its forward)
  double bwd_s = 0;         // compute per micro-batch, backward (with any recompute)
  double weight_bytes = 0;  // uploaded once per stage (round-robin); resident in the baselines
  // Of weight_bytes, the trainable weights (what an update changes): all a stage uploads when
  // its slot holds its layers' frozen base from an earlier step (RoundRobinJob::base_resident).
  double trainable_weight_bytes = 0;
  double input_bytes = 0;      // round-robin: uploaded per micro-batch before the stage runs
  double output_bytes = 0;     // round-robin: downloaded per micro-batch after it runs.
                               // Baselines: the stage's boundary activation per micro-batch, sent
                               // forward to stage s+1 and its gradient sent back (via host RAM).
  double grad_bytes = 0;       // downloaded once after the last micro-batch (round-robin)
  double param_count = 0;      // parameters the CPU optimizer updates after the gradients land
  double gpu_optimizer_s = 0;  // baselines: on-GPU optimizer step after the last backward
  // Round-robin: the executor's host thread (engine/exec/pipeline_executor.h) packs a layer
  // range's weights from the master copy into their upload mirror once a step, before the first
  // upload of a stage over them ("P…", named for the first such stage it prepares; the work is
  // the forward stage's and the tail's; a backward stage's only when there are not as many
  // backward stages as forward ones, the sign that the partitions differ), and adds a stage's
  // downloaded gradients into the master gradients before its update ("A…").
  HostWork pack = {}, add_grads = {};
  // A base streamed from NVMe (RoundRobinJob::streamed_base): the stage's frozen base as read
  // there, packing all of its weights, and packing its trainable ones only (its slot holds the
  // base), whichever stage it is.
  double base_read_bytes = 0;
  HostWork full_pack = {}, trainable_pack = {};
};

// GPipe: stage s on GPU s (p = stages.size() GPUs); all forwards, then all backwards. Activations
// and their gradients between stages go device->host->device (no peer access on GeForce cards).
[[nodiscard]] Result<Schedule> BuildGpipeSchedule(const std::vector<StageCost>& stages,
                                                  int micro_batches);

// 1F1B (PipeDream-flush): stage s runs min(p - s - 1, m) warm-up forwards, then alternates one
// forward and one backward, then drains the remaining backwards. Same placement and transfers.
[[nodiscard]] Result<Schedule> Build1F1BSchedule(const std::vector<StageCost>& stages,
                                                 int micro_batches);

struct RoundRobinJob {
  int gpus = 1;
  int micro_batches = 1;
  // The embedding runs on the host (DESIGN.md): its gather of micro-batch j precedes the first
  // forward stage's j, its gradient scatter-add follows the last backward stage's input gradient
  // of j (and precedes that stage's optimizer update, which updates the embedding); micro-batches
  // one after another on the host-memory lane.
  HostWork embedding_forward, embedding_backward;
  std::vector<StageCost> forward;   // forward stages in layer order (fwd_s used)
  StageCost tail;                   // head + loss, fwd_s + bwd_s per micro-batch on one device
  std::vector<StageCost> backward;  // backward stages in execution order, last layers first
  // The tail's micro-batches split among this many consecutive stages of the round robin (each
  // on the next device): part p runs micro-batches [p m / P, (p + 1) m / P), each part uploads the
  // head's weights, downloads its own gradients (into a landing buffer of its own) once after its
  // last micro-batch and adds them on the host thread. The tail's update (StageCost::
  // param_count) follows the last part's adding. 1 to min(micro_batches, gpus); 1: the tail on
  // one device.
  int tail_parts = 1;
  // Gradient accumulators per GPU, 1 or 2. With one, a stage's first micro-batch waits until the
  // gradients of the GPU's stage before it have downloaded; with two a stage accumulates in the one
  // of its weight buffer (StageRoundRobin's slot), so it waits for the stage before it in that
  // buffer: the stages with gradients on a GPU alternate between them.
  int grad_accumulators = 1;
  // Weight uploads are split into this many chunks queued behind the activation uploads of the
  // stage that runs before (0 = one chunk per micro-batch).
  int weight_chunks = 0;
  // The buffers ferry's executor keeps once per device (engine/exec/pipeline_executor.h):
  //  - micro-batch j's input upload of a stage starts once the stage's compute of
  //    j - input_slots is done (the row layout, positions and doc ids, has two slots per device,
  //    a backward stage's dY turns over three buffers, and a kept stage input alternates two
  //    hazard names), and once the download of
  //    j - 2's output is done (three hidden buffers turn over);
  //  - a forward stage computes micro-batch j once its downloads of j - 2 are done (its layers
  //    write two hidden buffers and two saved slots in turn, each once its download is done, so
  //    its compute runs at most about a micro-batch ahead of its downloads);
  //  - a stage with gradients computes micro-batch 0 (which zeroes the device's one gradient
  //    accumulator) once the gradient download of the device's stage before it is done;
  // Measured on CPU devices, leaving them out made the replayed step 13-23% shorter than the
  // recorded one (engine/exec/trace_replay_test.cc).
  bool executor_buffers = false;
  int input_slots = 2;  // with executor_buffers
  // Per stage of the step (forward stages, the tail, backward stages; empty: none): its weight
  // slot holds its layers' frozen base from an earlier step (a LoRA job, ResidentBases), so its
  // upload moves StageCost::trainable_weight_bytes only.
  std::vector<bool> base_resident;
  // The frozen base streamed from NVMe (a LoRA job's frozen weights there): every stage packs its
  // own image on the host thread, reading its base (StageCost::base_read_bytes, on the NVMe read
  // lane) and then packing all of its weights (full_pack), unless base_resident, then its
  // trainable ones only (trainable_pack), as the executor does.
  bool streamed_base = false;
  // The first stage's weights were read ahead (one-step-stale updates, not with a streamed base:
  // the executor packs and uploads them at the step before's end, StepHooks::read_ahead): the
  // step neither packs the first range nor uploads the first stage's weights.
  bool first_weights_ahead = false;
};

// The executor's round robin of stages over devices and their two weight slots
// (engine/exec/pipeline_executor.cc): stage k of a step runs on the device after stage k - 1's,
// in that device's slots in turn, except that a stage over the same layers as the stage before it
// on its device (given `ranges`: a backward stage right after its forward stage there, which
// happens to one layer range a step when the device count plus the tail's parts is odd and the
// device count is below the step's stage count) takes that stage's slot, where its weights
// already are; the device's next stage then takes the other slot, which may still hold its own
// forward stage's weights. With `resume` a step's first stage goes to the
// device and slot of the previous step's last stage (in training, the backward stage over the
// same layers), so a LoRA job's frozen base is still there; without, the counter runs on from the
// previous step.
// (The executor places an evaluation on a copy, so it starts where the next step will.)
// Thread-compatible.
class StageRoundRobin {
 public:
  struct Placement {
    int device = 0;
    int slot = 0;
  };
  explicit StageRoundRobin(int gpus) : gpus_(gpus), runs_(size_t(gpus), 0) {}
  // Places a step's `stages` stages, in order; `ranges` (empty, or one per stage: its layer
  // range, any id) finds the stages that take the slot of the stage before them.
  std::vector<Placement> Place(int stages, bool resume, std::span<const int> ranges = {});
  // Forgets the previous step (after a failed one: the next step starts afresh).
  void Forget() { last_.reset(); }

 private:
  int gpus_;
  int64_t counter_ = 0;
  std::vector<int64_t> runs_;  // per device: stages placed so far
  std::optional<Placement> last_;
};

// The layer range (forward stage index; the tail's is `forward_stages`) that stage `stage` of a
// step runs: forward stages, then the tail (in `tail_parts` parts), then the backward stages in
// reverse.
inline int StepStageRange(int stage, int forward_stages, int tail_parts = 1) {
  return stage < forward_stages                ? stage
         : stage < forward_stages + tail_parts ? forward_stages
                                               : 2 * forward_stages + tail_parts - 1 - stage;
}
// StepStageRange of every stage of a training step, in order.
std::vector<int> StepStageRanges(int forward_stages, int tail_parts = 1);
// The last stage of a training step over layer range `range` (StepStageRange's ids): the backward
// stage over a forward stage's layers, the tail's last part for the tail. Its gradients are the
// range's last to land, so the range's update follows it.
inline int LastStageOver(int range, int forward_stages, int tail_parts = 1) {
  return range < forward_stages ? 2 * forward_stages + tail_parts - 1 - range
                                : forward_stages + tail_parts - 1;
}
// The kind of stage `stage` of a step (forward stages, the tail's parts, backward stages) and its
// letter in task names: F, T or B.
inline TaskKind StepStageKind(int stage, int forward_stages, int tail_parts = 1) {
  return stage < forward_stages                ? TaskKind::kForward
         : stage < forward_stages + tail_parts ? TaskKind::kTail
                                               : TaskKind::kBackward;
}
char StepStageLetter(int stage, int forward_stages, int tail_parts = 1);
// The first micro-batch of the tail's part `part` (of `tail_parts`) in a step of `micro_batches`:
// part p runs [TailPartStart(p), TailPartStart(p + 1)).
inline int64_t TailPartStart(int64_t part, int64_t micro_batches, int64_t tail_parts) {
  return part * micro_batches / tail_parts;
}

// Per stage of a LoRA training step after many (StageRoundRobin with resume, every step alike),
// whether its weight slot still holds its layers' frozen base when the stage starts: the stage
// that last used the slot ran the same layers. `ranges`: each stage's layer range (any id).
std::vector<bool> ResidentBases(const std::vector<int>& ranges, int gpus);

// Round-robin dispatch: a global counter hands stage k (forward stages, the tail, then backward
// stages) to GPU k mod gpus, which runs it for every micro-batch. Each GPU holds two weight
// buffers (StageRoundRobin's slots): stage k's weights upload (in chunks, behind the activation
// uploads of the stage the GPU runs before it) once the stage before it in its buffer has
// finished with it, unless that stage left the very weights there: a backward stage whose buffer
// last held its forward stage (usually k - 2*gpus; k - gpus where it takes the slot of the stage
// before it, and then the device's next stage finds its own three stages back; with one GPU and
// one forward stage, the backward stage reuses the forward stage's upload). Micro-batch j of stage
// k uploads its input after stage k-1 downloaded its output for j. Gradients download once per
// stage after its last micro-batch; the CPU optimizer then updates that stage's parameters, in the
// order the gradients land. The host work runs as the executor's one host thread does it, one task
// after another: the embedding's gathers, then the weight packing in the order the stages are
// enqueued (a device's first stage as it is enqueued, every later stage while the stage before it
// on its device is enqueued, as its weights are prefetched), then each stage's gradient adding in
// stage order, each once its gradients have landed, then the embedding's scatter-adds. A stage's
// weight upload waits for the packing of its layers, its update for its gradient adding.
[[nodiscard]] Result<Schedule> BuildRoundRobinSchedule(const RoundRobinJob& job);

// The round-robin schedule's name for a task of stage `stage` (its index in the step: forward
// stages, the tail, backward stages; `forward_stages` of them forward): `what` is the stage's own
// letter (F, T, B) for its compute, or a task letter (I, O, W, G, U, ...) followed by the stage's
// letter; then the stage's index among its kind (none for the tail in one part; its part when
// split, for tasks not per micro-batch) and ".<micro_batch>" unless micro_batch < 0. (1 forward
// stage) 'I', stage 3, micro-batch 1 -> "IB1.1"; 'T', 1, 0 -> "T.0"; 'G', 2, -1, 2 parts ->
// "GT1". The executor's measured trace (engine/exec/trace_recorder.h) names its tasks with it,
// so a measured and a predicted timeline match task for task.
std::string RoundRobinTaskName(char what, int stage, int forward_stages, int micro_batch,
                               int tail_parts = 1);

}  // namespace ferry::plan
