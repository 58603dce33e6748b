// PipelineExecutor: runs one training step of a Plan (engine/plan/planner.h) on a set of devices
// (DESIGN.md, "Execution"): the forward stages, then the fused head + loss tail, then the backward
// stages in reverse, each handed to the next device in turn (round robin, plan::StageRoundRobin;
// a LoRA job's step starts where the last one ended); that device runs the stage for every
// micro-batch. The tail may run in parts (plan.tail_parts): its micro-batches split over that
// many consecutive stages, each on the next device, each part uploading the head, zeroing and
// downloading its own gradients (every part after the first into a pinned landing buffer of its
// own, "grads.landing" counting the head's once per part) and adding them on the host in part
// order; the first backward stage reads each micro-batch from the part that ran it.
//
//  - Device memory: at Create, each device allocates exactly the plan's GPU allocation map
//    (plan.memory.gpu: names and sizes from engine/plan/memory_model.h), one arena block per
//    entry, named as the plan names it, and nothing else, ever. The model's components (the
//    decoder blocks, the head, the stage's DeviceParams) are then placed into those blocks through
//    a CarveSource: "params.weights" -> weights.slot0/1 (alternating per stage on a device;
//    a backward stage right after its forward stage there takes that stage's slot),
//    "params.grads" -> grads.accum (grads.accum1 for a stage in weight slot 1 when the plan has
//    two accumulators), "blocks.saved.<k>" and "head.saved" -> saved.slot<k>,
//    "blocks.workspace" and "head.workspace" -> grad.work, "blocks.scratch" and "head.scratch" ->
//    scratch; the executor itself fills "positions" (RoPE ids),
//    "rope.inv_freq" (RopeInvFreq: plain or Llama 3-scaled) and "doc_ids" (packed rows, per
//    micro-batch; MicroBatchInput doc_ids/positions as the reference runner reads them; two slots
//    of each, micro-batch m's in slot m % 2, so the next one uploads while this one computes). The
//    executor never sizes a device buffer itself: a component that does not fit its planned block
//    fails with OutOfMemory naming both, and a device too small for the map fails at Create with
//    the arena's OutOfMemory naming the allocation.
//  - Storage dtype: the plan's compute dtype (job.compute_dtype), f32, bf16 or f16 (f16 with the
//    Trainer's dynamic loss scaling: the head's gradients are of loss * MicroBatchInput::
//    loss_scale, so small activation gradients stay in f16's range). Weights, activations,
//    activation gradients and their host staging are stored in it; parameter gradients, norm
//    statistics, RoPE's table, positions, doc ids, targets and per-token losses stay as they are
//    (fp32 / i32), as in the reference runner (engine/testing/reference_runner.h) with the same
//    compute_dtype (f32 or bf16: it does not take f16), whose results a one-micro-batch plan
//    reproduces bit for bit.
//  - A stage's weights are uploaded from the host master copy (fp32, HostTensors, rounded to the
//    compute dtype as they are packed) into the device's free weight slot, unless that slot still
//    holds them (ExecutorStats::weight_bytes_uploaded); its gradients accumulate
//    on the device across micro-batches and are downloaded once per stage and added (+=) to the
//    host gradients, or stored (=) when the first micro-batch asks to overwrite them
//    (MicroBatchInput::overwrite_grads; engine/model/device_params.h, GradOverwrite), in stage
//    order, so the sums do not depend on which device finishes first.
//  - Activations: every layer's input, and its saved set unless the plan recomputes the layer,
//    go to host memory after the layer's forward and come back for its backward (recomputed
//    layers re-run their forward from the input). A plan that keeps activations
//    (plan.keep_activations: one or two devices, nothing recomputed) leaves them on the device
//    instead, in "activations.keep" (per block of the device's forward stages this step, in
//    stage order, and micro-batch, its input then its saved slot: the blocks are built with a
//    saved slot per layer and micro-batch there; round-robin on one or two devices runs each
//    backward stage where its forward stage ran), and only stage inputs and outputs cross the
//    host. Stage outputs and input gradients travel
//    device -> host -> device. The embedding gather and its scatter-add run on the host in fp32,
//    converted to and from the compute dtype (HostEmbedding::ForwardAs, BackwardFrom); a LoRA
//    job's embedding is frozen, so its last backward stage downloads no input gradient (as the
//    plan's schedule has it). The tail downloads each micro-batch's per-token losses before its
//    input gradient: the next micro-batch's head overwrites the losses' buffer, and would
//    otherwise wait for the gradient's copy too.
//  - Semantics as ModelRunner (engine/model/model_runner.h): each micro-batch's loss is
//    sum(-log p) over its non-masked targets / normalizer; gradients are added into `grads`.
//
// Scheduling (DESIGN.md, "Execution"): Step enqueues the whole step on every device's streams
// and blocks only at its end (on each stage's gradient download, in stage order, then on every
// device), so
//  - devices run at once: a stage's upload of micro-batch m waits (a cross-device event wait) for
//    the downloads of m by the stages it reads from, not for those stages to end, so the next
//    device starts as soon as the first micro-batch has crossed;
//  - on each device the upload, compute and download streams overlap, ordered by the plan buffers
//    each copy and kernel reads and writes (StreamHazards): a download waits for the compute that
//    wrote its buffer, and the compute that next overwrites that buffer waits for the download;
//    forward stages and the tail rotate three of the hidden buffers, so a micro-batch's input is
//    uploaded while the one before it computes;
//  - a device's next stage's weights are copied into its free weight slot while the current stage
//    computes, in one bounded chunk after each group of the current stage's activation uploads
//    (each micro-batch's; in backward stages each layer's), so they never delay those by more than
//    a chunk (a stream runs its copies in order: stream priorities do not reorder copy engines);
//  - with one-step-stale updates (StepHooks::read_ahead: the caller's master copy does not change
//    between this step's reads and the next step's), the next step's first stage's weights are
//    packed once every stage is enqueued and this step's copies from its mirror are done, and
//    uploaded into the slot the round robin gives that stage next, behind the slot's last
//    compute, so they go up while this step's last gradients come down; the next step takes them
//    unless the caller says its weights changed (StepHooks::weights_changed), or an evaluation or
//    a generation ran between (ExecutorStats::stages_read_ahead counts the steps that took them).
// Nothing is allocated inside a step after the first: every event and arena block is created at
// Create and re-used; all host staging the devices copy to and from is pinned host-pool memory
// taken at Create, one block per entry of the plan's pinned map (plan.memory.pinned_host), named
// as the plan names it and carved here: the per layer and micro-batch activations, boundary
// gradients, row layouts, targets, losses and RoPE's table, and each layer range's weight and
// gradient mirrors, shared by the stages over that range in every step, whichever device runs
// them (the forward stage packs the weights once a step; its backward stage uploads the same
// bytes). The pool's pinned peak is the plan's pinned total. Host memory is written only after
// the copies that read it.
// Backward stages alternate each layer's input between two hidden buffers (1 and 3), so the next
// layer's input uploads while a layer computes, and turn the residual gradient over three (0, 2
// and 4; 0, 2 and 1 when activations are kept), so the next micro-batch's dY uploads while this
// one computes and the one before's dX downloads: five hidden buffers with two micro-batches or
// more, four with one, three when activations are kept or nothing trains.
// Saved activations on NVMe (plan.activations == Tier::kNvme, a training plan; Create's
// `activation_store`): the stage inputs (the head's included) stay in pinned host RAM, where the
// next stage's device reads them; every other block input and every saved set is an entry of the
// store ("input.<layer>.<micro-batch>", "saved.<layer>.<micro-batch>"). A forward stage downloads
// each into one of its device's two outgoing staging slots (plan entry "activations.staging") and
// a host function on the download stream hands it to the store (priority kSpill); the slot's next
// download first waits for that write. A backward stage, once a micro-batch's inputs have landed,
// starts reading that micro-batch's entries (kActivationNow) two ahead into its device's two
// incoming slots, each read waiting first for its entry's write; each upload waits for its read,
// then starts the read two entries on. So the disk runs beside the copies and compute, two entries
// deep each way, and a step writes and reads every entry once: the plan's NVMe bytes. A failed
// write or read stops the step with an error naming the device's stream, stage, layer and
// micro-batch.
// Not yet: a host-side transfer scheduler that reorders copies as they become ready (here the
// order is fixed when the step is enqueued).
//
// Tracing (Create's `trace`, engine/exec/trace_recorder.h): every copy and kernel group the
// executor enqueues is bracketed by a pair of the device's timed events (DeviceTimeline), placed
// after the waits that order it, so a span is when the stream ran the work; the step's start
// anchors each device's clock to the host's. Spans are named and laned as the plan's round-robin
// timeline (compute "F0.1" / "T.1" / "B0.1", with a stage's gradient zeroing in its "B0.0" / "T.0"
// as the plan counts it; a task is one span per layer or tensor, its name repeated), uploads
// "IF1.0", "IB0.1" (inputs, saved sets, layouts, targets), downloads "OF0.1", weights
// "WF1/<chunk>", gradients "GB0"; on the host the embedding, "E.0" and "EB.0", each range's
// weight packing "PF1" / "PT" and each stage's gradient adding "AT" / "AB0"; a tail in parts
// numbers its parts' own tasks, "WT1/<chunk>", "GT0", "AT1", "PT0", and zeroes in each part's
// first micro-batch; the next step's first weights read ahead, "PF0 (next step)" and "WF0 (next
// step)", in the step that reads them). At the step's end the executor waits for the traced work
// only, then reads the events. The events are created in the first step and reused.
// Ownership: borrows the devices (they must outlive the executor) and a caller's host pool (it
// must outlive the executor too); owns its arena blocks, its host-pool blocks and, without a
// caller's pool, the pool. Thread-safety: one host thread drives an executor at a time (the
// devices' stream threads run its work).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/exec/trace_recorder.h"
#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/model_runner.h"
#include "engine/plan/planner.h"
#include "kernels/device.h"
#include "kernels/status.h"
#include "offload/host_pool.h"
#include "offload/nvme_store.h"

namespace ferry::exec {

struct ExecutorStats {
  int64_t stages_run = 0;           // per step, forward + tail + backward
  int64_t block_forward_calls = 0;  // counts recomputation too
  // Bytes of weights copied to the devices so far. A stage whose weight slot still holds its
  // weights, packed from the same master copy, copies none: in a step, the backward stage that
  // follows its own forward stage into that slot (plan::StageRoundRobin: usually two stages
  // later on the device; right after it, taking its slot; or, the device's stage after such a
  // stage, three stages later); in generation, every stage that keeps its slot
  // from token to token. In a LoRA job's steps and evaluations, a stage whose slot holds its
  // layers' frozen base, packed from the same master copy, copies only the trainable ranges
  // (DeviceParams::UploadTrainableWeights).
  uint64_t weight_bytes_uploaded = 0;
  // Steps that found their first stage's weights read ahead at the last step's end and took them
  // (StepHooks::read_ahead; the caller's master copy unchanged since): that stage packed and
  // uploaded nothing at the step's start.
  int64_t stages_read_ahead = 0;
  // Weight packings (one per layer range a step) that wrote the trainable tensors only: a LoRA
  // job's host mirror keeps its frozen base, packed from the same master copy, from step to step,
  // and any job's the tensors the model's files serve (an evaluation's whole base).
  int64_t frozen_packs_skipped = 0;
  // With the frozen base streamed from NVMe (plan.frozen_weights there: the model's files, or a
  // copy converted once): the bytes of it read from there so far, as stored (a stage whose weight
  // slot holds its layers' base reads none).
  uint64_t base_bytes_streamed = 0;
  // All of it is read from the drive (engine/model/base_reader.h: the model's files, the copy
  // through its descriptor): base_file_bytes of tensors, in base_bytes_from_drive of whole
  // 4096-byte blocks, up to two blocks a tensor more (where its neighbours lie); O_DIRECT where
  // the filesystem takes it, so the process's own I/O counters (/proc/self/io) show the same.
  uint64_t base_file_bytes = 0;
  uint64_t base_bytes_from_drive = 0;
  // Per plan allocation name: the most bytes any component used of it (<= its planned size).
  std::vector<plan::Allocation> used;
  // Host mappings made so far: the host pool's pinned mappings (at Create) and any mirror a
  // DeviceParams had to map itself (none while the plan's host map holds the mirrors): none
  // after Create.
  int64_t host_mappings = 0;
  // The pinned host staging taken from the host pool at Create: per plan entry, its block's
  // page-rounded bytes (as engine/plan/memory_model.h counts them), and the pool's counters.
  std::vector<plan::Allocation> host_pinned;
  HostPoolStats pinned;
};

// What the executor has just enqueued on a device, for an EnqueueObserver.
enum class Enqueued {
  kWeights,  // every copy of a stage's weights, on the device's upload stream
  kStage,    // all of a stage's work, its last copy included
};
// A test seam (production passes none): called on the thread that runs Step right after the
// executor enqueued `what` of stage `stage` (its index in the step: forward stages, the tail's
// parts, backward stages) on `device`, before the executor waits on any of it, so a test can put
// its own work behind the executor's on the device's streams (hold a stream; record an event to
// learn when the executor's work has run).
using EnqueueObserver = std::function<void(Enqueued what, int64_t stage, Device& device)>;

// The options of a store for `plan`'s saved activations on NVMe in `directory`: the memory
// model's block (MemoryEstimate::nvme_activation_block_bytes) and queue depth (its bounce
// buffers are the plan's pageable "activations.store"), and one segment of the plan's NVMe space
// for them, reserved when the store first writes, so the store never takes more than the plan
// counts.
NvmeStoreOptions ActivationStoreOptions(const plan::Plan& plan, std::string directory);

class PipelineExecutor {
 public:
  virtual ~PipelineExecutor() = default;

  // Validates the plan against the model (stages cover the blocks, recompute has one entry per
  // layer, f32 or bf16 compute), allocates the plan's GPU map on every device and takes the
  // plan's pinned host map from `host_pool` (borrowed; it must outlive the executor and have
  // been created with these devices, so its pinned mappings are registered with them), or
  // without one from a pool of its own whose pinned budget is exactly the plan's pinned total.
  // Errors: InvalidArgument naming the problem; OutOfMemory from a device arena or the host pool
  // naming the allocation.
  // With `trace` (borrowed; it must outlive the executor and record as many devices), each step's
  // tasks are timed by the devices' own events and added to it (see "Tracing" above); without
  // one nothing is recorded.
  // With the plan's activations on NVMe (a training plan), `activation_store` (borrowed; it must
  // outlive the executor) holds the saved activations: see "Saved activations on NVMe" above;
  // without a store such a plan is refused (InvalidArgument). Frozen weights on NVMe are refused.
  // `isolate_compute` (the layer probe's mode, engine/probe/layer_probe.h; off for training):
  // nothing runs beside a device's kernels that would slow them on a CPU device, so a traced
  // kernel span times the kernels alone: a device's compute waits for each stage's weights to be
  // up (the next stage's prefetch no longer overlaps the running stage), and the host adds a
  // step's gradients only after every device has finished. Results are unchanged.
  static Result<std::unique_ptr<PipelineExecutor>> Create(
      std::vector<Device*> devices, const ModelConfig& config, const plan::Plan& plan,
      EnqueueObserver observer = nullptr, TraceRecorder* trace = nullptr,
      HostPool* host_pool = nullptr, NvmeStore* activation_store = nullptr,
      bool isolate_compute = false);

  // One step over plan.micro_batches micro-batches (each plan.micro_batch_size x job.seq_len):
  // returns the summed loss contributions and adds the gradients of the trainable parameters into
  // `grads` (one zeroed or accumulating buffer per storage-owning trainable parameter), or, when
  // batches[0].overwrite_grads, overwrites `grads` with them (zero where they have none).
  // `hooks` (engine/model/model_runner.h) hear, on the calling thread, before and after each
  // forward stage's and the tail's weights are packed from `weights` (a backward stage uploads
  // its forward stage's packed bytes) and the embedding reads them, and after each tail or
  // backward stage's gradients, then the embedding's, are final in `grads`.
  // In a LoRA job the frozen base stays in the devices' weight slots from call to call: between
  // Step and Evaluate calls with the same `weights` object only its trainable tensors may change
  // (the Trainer's contract); a changed base needs another object that was never passed here, or
  // a Decode at past 0. Likewise, in any job, the tensors the model's files serve
  // (HostTensors::files) stay packed in the host mirrors from call to call.
  virtual Result<double> Step(const HostTensors& weights, std::span<const MicroBatchInput> batches,
                              HostTensors& grads, const StepHooks& hooks = {}) = 0;
  // Forward only (evaluation): the forward stages and the tail's loss-only pass over 1 to
  // plan.micro_batches micro-batches, round robin as Step; returns the summed loss contributions.
  // Nothing is saved for a backward: only stage outputs travel. `hooks`' weights_needed and
  // weights_read hear as in Step. Errors: InvalidArgument for a bad batch count or shape.
  virtual Result<double> Evaluate(const HostTensors& weights,
                                  std::span<const MicroBatchInput> batches,
                                  const StepHooks& hooks = {}) = 0;
  // Generation (a plan made with PlanJob::generate_positions; engine/plan/memory_model.h): runs
  // `tokens` (1 to job.seq_len of them) of one sequence at positions [past, past + n) through the
  // forward stages, each block attending over its KV cache (rows [0, past): the sequence's earlier
  // tokens, which earlier calls wrote) and appending the new keys and values to it, then the
  // head; returns the logits, f32, of the last token (V) or, without last_only, of all n (n x V;
  // n at most job.logit_rows). Forward stage s runs on device plan::GenerationDevice(s) at every
  // call (the head on the next), so a block's cache stays on one device; a weight slot that still
  // holds a stage's weights from an earlier call of the same sequence is not uploaded again, so a
  // model whose stages fit the devices' slots moves no weights after its first token, and a
  // larger one streams them every token. A past of 0 starts a sequence: the weights are packed
  // from `weights` afresh (the caller may have changed them); within a sequence they must not
  // change. `hooks`' weights_needed and weights_read hear as in Evaluate. Not traced.
  // Errors: FailedPrecondition for a plan without a cache; InvalidArgument for n or past out of
  // range (nothing is run, the cache is unchanged).
  virtual Result<std::vector<float>> Decode(const HostTensors& weights,
                                            std::span<const int32_t> tokens, int64_t past,
                                            bool last_only, const StepHooks& hooks = {}) = 0;
  virtual ExecutorStats stats() const = 0;
  // Host RAM the executor's own buffers occupy now: its pinned staging's pages in RAM
  // (HostPool::ResidentBytes of its pool; none of a borrowed pool, which its owner measures) and
  // the embedding's fp32 gather (pageable "activations.embedding", filled at Create).
  virtual size_t HostResidentBytes() const = 0;
};

}  // namespace ferry::exec
