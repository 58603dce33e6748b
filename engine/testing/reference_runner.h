// The reference runner: ModelRunner's plain implementation on ONE device, the independent
// reference the pipeline executor is checked against (tests, train_bench). No job runs on it.
//
//  - The embedding gather and its gradient scatter-add run on the host (engine/model/embedding.h):
//    only hidden states travel.
//  - Blocks run in order; the head (final norm + LM head + cross-entropy, fused forward and
//    backward) runs at the tail; the backward runs the blocks in reverse. A block marked for
//    recomputation keeps only its input and re-runs its forward before its backward.
//  - Device memory is sized once, at creation, from the layer specs (nothing allocates inside a
//    step); every allocation is named in the device's arena log.
//  - It runs micro-batch after micro-batch, driving the device only through its streams and
//    events (weights uploaded from the host master copy, gradients downloaded to it).
//
// Semantics: engine/model/model_runner.h's. Thread-safety: one host thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model/lora_config.h"
#include "engine/model/model_config.h"
#include "engine/model/model_runner.h"
#include "kernels/device.h"
#include "kernels/status.h"

namespace ferry {

struct ReferenceRunnerOptions {
  BatchShape shape;  // micro-batch B x T (fixed for the runner's life)
  // Storage dtype of weights and activations on the device: f32 (the exact reference) or bf16
  // (GEMMs on bf16 inputs with fp32 accumulation, element-wise math in fp32; gradients of
  // parameters, norm statistics and the loss stay fp32).
  DType compute_dtype = DType::kF32;
  std::vector<bool> recompute;      // per block; empty = save everything
  int64_t loss_chunk_tokens = 256;  // fused LM-head chunk
  // Forward only (evaluation): no gradient buffers are allocated (ParamGrads::kNone, no gradient
  // stream, a HeadMode::kForwardOnly head) and AccumulateGradients / AccumulateStep fail with
  // FailedPrecondition.
  bool inference_only = false;
};

// Sizes and allocates the device buffers. Errors: OutOfMemory from the device arena naming the
// buffer; InvalidArgument for a config the runner cannot run (naming the feature).
Result<std::unique_ptr<ModelRunner>> CreateReferenceRunner(Device& device,
                                                           const ModelConfig& config,
                                                           const LoraConfig& lora,
                                                           const ReferenceRunnerOptions& options);

}  // namespace ferry
