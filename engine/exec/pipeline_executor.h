// PipelineExecutor: runs one training step of a Plan (engine/plan/planner.h) on a set of devices
// (DESIGN.md, "Execution"): the forward stages, then the fused head + loss tail, then the backward
// stages in reverse, each handed by a global counter to the next device in turn (round robin);
// that device runs the stage for every micro-batch.
//
//  - Device memory: at Create, each device allocates exactly the plan's GPU allocation map
//    (plan.memory.gpu: names and sizes from engine/plan/memory_model.h), one arena block per
//    entry, named as the plan names it, and nothing else, ever. The model's components (the
//    decoder blocks, the head, the stage's DeviceParams) are then placed into those blocks through
//    a CarveSource: "params.weights" -> weights.slot0/1 (alternating per stage on a device),
//    "params.grads" -> grads.accum, "blocks.saved.<k>" and "head.saved" -> saved.slot<k>,
//    "blocks.workspace" and "head.workspace" -> grad.work, "blocks.scratch" and "head.scratch" ->
//    scratch; the executor itself fills "positions" (RoPE ids),
//    "rope.inv_freq" (RopeInvFreq: plain or Llama 3-scaled) and "doc_ids" (packed rows, per
//    micro-batch; MicroBatchInput doc_ids/positions as ModelRunner reads them). The executor never
//    sizes a device buffer itself: a component that does not fit its planned block fails with
//    OutOfMemory naming both, and a device too small for the map fails at Create with the arena's
//    OutOfMemory naming the allocation.
//  - A stage's weights are uploaded from the host master copy (fp32, HostTensors) at the stage's
//    start; its gradients accumulate on the device across micro-batches and are downloaded and
//    added (+=) to the host gradients once per stage, or stored (=) when the first micro-batch
//    asks to overwrite them (MicroBatchInput::overwrite_grads; engine/model/device_params.h,
//    GradOverwrite).
//  - Activations: every layer's input, and its saved set unless the plan recomputes the layer,
//    go to host memory after the layer's forward and come back for its backward (recomputed
//    layers re-run their forward from the input). Stage outputs and input gradients travel
//    device -> host -> device. The embedding gather and its scatter-add run on the host.
//  - Semantics as ModelRunner (engine/model/model_runner.h): each micro-batch's loss is
//    sum(-log p) over its non-masked targets / normalizer; gradients are added into `grads`.
//
// Scheduling is sequential in this version: the host runs one stage at a time and orders each
// copy after the compute before it with events, so devices do not overlap one another and a
// stage's upload does not overlap the previous stage's compute (the plan's memory is obeyed; its
// predicted time is not).
//
// Ownership: borrows the devices (they must outlive the executor); owns its arena blocks and host
// staging. Thread-safety: one host thread drives an executor at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/model_runner.h"
#include "engine/plan/planner.h"
#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry::exec {

struct ExecutorStats {
  int64_t stages_run = 0;           // per step, forward + tail + backward
  int64_t block_forward_calls = 0;  // counts recomputation too
  // Per plan allocation name: the most bytes any component used of it (<= its planned size).
  std::vector<plan::Allocation> used;
};

class PipelineExecutor {
 public:
  virtual ~PipelineExecutor() = default;

  // Validates the plan against the model (stages cover the blocks, recompute has one entry per
  // layer, f32 compute) and allocates the plan's GPU map on every device. Errors: InvalidArgument
  // naming the problem; OutOfMemory from a device arena naming the allocation.
  static Result<std::unique_ptr<PipelineExecutor>> Create(std::vector<Device*> devices,
                                                          const ModelConfig& config,
                                                          const plan::Plan& plan);

  // One step over plan.micro_batches micro-batches (each plan.micro_batch_size x job.seq_len):
  // returns the summed loss contributions and adds the gradients of the trainable parameters into
  // `grads` (one zeroed or accumulating buffer per storage-owning trainable parameter), or, when
  // batches[0].overwrite_grads, overwrites `grads` with them (zero where they have none).
  virtual Result<double> Step(const HostTensors& weights, std::span<const MicroBatchInput> batches,
                              HostTensors& grads) = 0;
  virtual ExecutorStats stats() const = 0;
};

}  // namespace ferry::exec
