// The Generator (engine/model/generator.h) `ferry generate` runs: a generation plan
// (plan::PlanJob::generate_positions) run by the pipeline executor (PipelineExecutor::Decode), so
// generation takes the path training and evaluation take: the plan's exact memory on each device,
// its stages round robin over the devices, and a model larger than device memory streamed through
// them token by token. Each block's KV cache (f32) lives on the device that runs its stage.
//
// Ownership: owns the executor; borrows the devices and `weights` (the host master copy:
// HostTensors as LoadModelFolder / InitMasterWeights give them, LoRA A/B and NF4 projections
// included), which must outlive it and not change while a sequence runs (a Reset, or a Forward at
// length 0, packs them afresh). Thread-safety: one host thread at a time.
#pragma once

#include <memory>
#include <vector>

#include "engine/exec/pipeline_executor.h"
#include "engine/model/generator.h"
#include "engine/model/host_tensors.h"
#include "engine/model/model_config.h"
#include "engine/plan/planner.h"
#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry::exec {

// A Generator that also reports what its executor did (weights uploaded, memory used).
class PlannedGenerator : public Generator {
 public:
  virtual ExecutorStats stats() const = 0;
};

// capacity() is plan.job.generate_positions; a Forward runs 1 to plan.job.seq_len tokens and
// returns the logits of all of them only when they are at most plan.job.logit_rows.
// Errors: those of PipelineExecutor::Create (InvalidArgument for a plan that is not a generation
// plan, naming why).
Result<std::unique_ptr<PlannedGenerator>> CreatePlannedGenerator(std::vector<Device*> devices,
                                                                 const ModelConfig& config,
                                                                 const plan::Plan& plan,
                                                                 const HostTensors& weights);

// A generation plan of `config` (and `lora`) without the planner's search: the given forward
// stages (blocks 1..L in order; empty: one stage of them all) over `gpus` devices, a KV cache of
// `positions` tokens, steps of up to `max_step` tokens, logits of up to `logit_rows` of them, op
// scratch for `scratch`; its memory is the memory model's (engine/plan/memory_model.h). For tests
// and for callers that fix the partition. REQUIRES: 1 <= logit_rows <= max_step <= positions.
plan::Plan GenerationPlan(const ModelConfig& config, const LoraConfig& lora,
                          std::vector<plan::LayerRange> stages, int gpus, int64_t positions,
                          int64_t max_step, int64_t logit_rows, plan::ScratchTarget scratch);

}  // namespace ferry::exec
