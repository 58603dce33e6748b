// PipelineRunner: the ModelRunner interface over a PipelineExecutor, so the Trainer (and `ferry
// train`) can run a multi-stage plan on several devices exactly as it runs one device.
//
// UploadWeights borrows the host master weights (streams_weights(): each stage packs its own from
// them as the step is enqueued, after StepHooks::weights_needed), so they must outlive the runner
// or the next UploadWeights; AccumulateStep runs one executor step over all micro-batches of the
// plan, reporting landed gradients through StepHooks::grads_landed; EvaluateLoss runs one
// micro-batch forward only (PipelineExecutor::Evaluate) on the master weights as they are, so a
// caller with pending updates applies them first (Trainer::FinishUpdates).
// AccumulateGradients (one micro-batch at a time) and Logits are not supported: a pipeline runs a
// whole step at once (FailedPrecondition naming the alternative).
//
// Ownership: owns the executor; borrows the devices, which must outlive it. Thread-safety: one
// host thread at a time.
#pragma once

#include <memory>
#include <vector>

#include "engine/exec/pipeline_executor.h"
#include "engine/model/model_runner.h"

namespace ferry::exec {

// `trace` and `activation_store`: as PipelineExecutor::Create's (may be null; the store must
// outlive the runner). Errors: those of PipelineExecutor::Create.
Result<std::unique_ptr<ModelRunner>> CreatePipelineRunner(std::vector<Device*> devices,
                                                          const ModelConfig& config,
                                                          const plan::Plan& plan,
                                                          TraceRecorder* trace = nullptr,
                                                          NvmeStore* activation_store = nullptr);

}  // namespace ferry::exec
