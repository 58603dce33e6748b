// Head: the model's tail — final norm (RMSNorm or LayerNorm) and the fused LM
// head + cross-entropy (kernels/ops/lm_head_loss.h), forward and backward in
// one pass.
//
// Buffers (planned at creation): "head.saved" (normed input, norm statistics, per-token loss:
// what ComputeLayerCost counts), "head.workspace" (the targets, the normed input's gradient and a
// gradient sink for frozen norm weights) and "head.scratch" (the loss op's scratch). A frozen LM
// head weight (LoRA) gets no gradient buffer: the fused op then skips its weight-gradient products.
// With a CarveSource they are regions of the caller's allocations instead (engine/exec).
// HeadMode::kForwardOnly (generation, evaluation: no backward ever) sizes "head.scratch" for the
// loss-only pass and gives "head.workspace" only the targets (no input gradient, no sink);
// ForwardBackward then fails with FailedPrecondition.
//
// Accumulation: dx (the gradient of the head's input) is written (=); the
// gradients of trainable head parameters (final norm, lm_head — tied or not)
// are accumulated (+=).
//
// Ownership: owns its buffers; refers to the DeviceParams it was created with.
// Thread-safety: one host thread at a time.
#pragma once

#include <memory>

#include "engine/model/device_params.h"
#include "engine/model/model_config.h"
#include "engine/model/param_spec.h"
#include "engine/model/tensor_carver.h"
#include "kernels/device.h"
#include "kernels/ops/lm_head_loss.h"

namespace ferry {

// What a Head will be asked to run: kTrain allows ForwardBackward (a trainable or a frozen head);
// kForwardOnly (generate, eval) only Forward and Logits, with less memory.
enum class HeadMode { kTrain, kForwardOnly };

// The bytes of a head's saved set ("head.saved") and workspace ("head.workspace") at `tokens`
// tokens with activations in `act`, as Create carves them (its layouts, run over a counting
// carver): the memory model and LayerCost::saved_bytes size the head by these.
struct HeadBufferBytes {
  size_t saved = 0;            // each tensor aligned (TensorCarver)
  size_t saved_unaligned = 0;  // the same tensors without alignment (LayerCost::saved_bytes)
  size_t workspace = 0;        // for `mode`: kForwardOnly holds the targets alone
};
HeadBufferBytes HeadBuffersOf(const ModelConfig& c, int64_t tokens, DType act, HeadMode mode);

class Head {
 public:
  static Result<std::unique_ptr<Head>> Create(Device& d, const ModelConfig& c,
                                              const DeviceParams& params, BatchShape shape,
                                              int64_t loss_chunk_tokens, HeadMode mode,
                                              CarveSource* source = nullptr);

  // i32 (N): the targets, kIgnoreIndex where masked; the caller uploads them
  // before a step.
  Tensor targets() const { return targets_; }
  // f32 (N): -log p of each target (0 where masked), written by
  // ForwardBackward.
  Tensor token_loss() const { return token_loss_; }

  // token_loss and gradients of sum(token_loss) * loss_scale / normalizer: dx (=),
  // parameters (+=); loss_scale > 1 only with fp16 loss scaling. FailedPrecondition for a
  // HeadMode::kForwardOnly head.
  Status ForwardBackward(Tensor x, double normalizer, Tensor dx, double loss_scale = 1);
  // token_loss only (evaluation): no gradients.
  Status Forward(Tensor x);
  // logits (N, V) = norm(x) W^T, written (=); `scratch`: GemmScratchBytes of that product when
  // the params are not f32.
  Status Logits(Tensor x, Tensor logits, Tensor scratch = {});

 private:
  Head(Device& d, const ModelConfig& c, const DeviceParams& params, HeadMode mode)
      : d_(d), c_(c), params_(params), mode_(mode) {}
  Status NormForward(Tensor x);
  // The loss op's arguments shared by Forward and ForwardBackward (normed input, head weight,
  // targets, token_loss, scratch).
  LmHeadLossArgs LossArgs() const;
  Tensor W(const char* name) const;
  // The gradient of a norm parameter, or a view of the sink from element sink_offset when frozen
  // (the sink holds the norm weight's at 0, the norm bias's at C).
  Tensor G(const char* name, int64_t sink_offset = 0) const;

  Device& d_;
  const ModelConfig& c_;
  const DeviceParams& params_;
  const HeadMode mode_;
  int64_t chunk_ = 256;
  Tensor xn_, mean_, rstd_, token_loss_;   // (N, C), (N) LayerNorm only, (N), (N)
  Tensor targets_, dxn_, scratch_, sink_;  // i32 (N), (N, C), bytes, (2C); kTrain: dxn_, sink_
  DeviceBuffer saved_buffer_, workspace_buffer_, scratch_buffer_;
};

}  // namespace ferry
