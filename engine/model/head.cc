#include "engine/model/head.h"

#include <algorithm>
#include <optional>

#include "engine/model/decoder_blocks.h"
#include "engine/model/model_stack.h"
#include "engine/model/projection.h"
#include "engine/model/tensor_carver.h"
#include "kernels/ops/layernorm.h"
#include "kernels/ops/lm_head_loss.h"
#include "kernels/ops/rmsnorm.h"

namespace ferry {
namespace {

const char* NormName(const ModelConfig& c, bool bias) {
  const FamilyNames& n = NamesOf(c);
  return bias ? n.final_norm_bias.c_str() : n.final_norm_weight.c_str();
}

// The saved set: normed input, norm statistics, per-token loss.
struct HeadSaved {
  Tensor xn, mean, rstd, token_loss;
};
void SavedLayout(const ModelConfig& c, int64_t N, DType act, TensorCarver& cv, HeadSaved& s) {
  s.xn = cv.Take(act, {N, c.hidden_size});
  if (c.norm == NormKind::kLayerNorm) s.mean = cv.Take(DType::kF32, {N});
  s.rstd = cv.Take(DType::kF32, {N});
  s.token_loss = cv.Take(DType::kF32, {N});
}

// The workspace: the targets; to train, the normed input's gradient and the frozen-parameter sink.
struct HeadWork {
  Tensor targets, dxn, sink;
};
void WorkspaceLayout(const ModelConfig& c, int64_t N, DType act, HeadMode mode, TensorCarver& cv,
                     HeadWork& w) {
  w.targets = cv.Take(DType::kI32, {N});
  if (mode != HeadMode::kTrain) return;
  w.dxn = cv.Take(act, {N, c.hidden_size});
  w.sink = cv.Take(DType::kF32, {2 * c.hidden_size});
}

}  // namespace

HeadBufferBytes HeadBuffersOf(const ModelConfig& c, int64_t tokens, DType act, HeadMode mode) {
  HeadSaved s;
  HeadWork w;
  TensorCarver saved, workspace;
  SavedLayout(c, tokens, act, saved, s);
  WorkspaceLayout(c, tokens, act, mode, workspace, w);
  return {saved.bytes(), saved.unaligned_bytes(), workspace.bytes()};
}

Result<std::unique_ptr<Head>> Head::Create(Device& d, const ModelConfig& c,
                                           const DeviceParams& params, BatchShape shape,
                                           int64_t loss_chunk_tokens, HeadMode mode,
                                           CarveSource* source) {
  std::unique_ptr<Head> h(new Head(d, c, params, mode));
  const bool backward = mode == HeadMode::kTrain;
  const int64_t N = shape.tokens(), C = c.hidden_size, V = c.vocab_size;
  const DType act = params.dtype();  // the normed input and its gradient; the rest f32
  h->chunk_ = std::min(loss_chunk_tokens, N);
  auto saved = [&](TensorCarver& cv) {
    HeadSaved t;
    SavedLayout(c, N, act, cv, t);
    h->xn_ = t.xn, h->mean_ = t.mean, h->rstd_ = t.rstd, h->token_loss_ = t.token_loss;
  };
  FERRY_ASSIGN_OR_RETURN(h->saved_buffer_, AllocateCarved(d, source, "head.saved", saved));
  // A frozen head weight (LoRA) has no gradient: the loss op computes no dW (and needs no scratch
  // for one). A forward-only head needs neither the backward's scratch nor the input gradient.
  const bool frozen = params.at(NamesOf(c).lm_head).grad.data.is_null();
  const size_t scratch = LmHeadLossScratchBytes(
      d, h->chunk_, V, C, act,
      frozen || !backward ? std::nullopt : std::optional<DType>(DType::kF32), backward);
  auto workspace = [&](TensorCarver& cv) {
    HeadWork t;
    WorkspaceLayout(c, N, act, mode, cv, t);
    h->targets_ = t.targets, h->dxn_ = t.dxn, h->sink_ = t.sink;
  };
  FERRY_ASSIGN_OR_RETURN(h->workspace_buffer_,
                         AllocateCarved(d, source, "head.workspace", workspace));
  auto scratch_layout = [&](TensorCarver& cv) {
    h->scratch_ = cv.Take(DType::kF32, {int64_t((std::max<size_t>(scratch, 4) + 3) / 4)});
  };
  FERRY_ASSIGN_OR_RETURN(h->scratch_buffer_,
                         AllocateCarved(d, source, "head.scratch", scratch_layout));
  return h;
}

Tensor Head::W(const char* name) const { return params_.at(name).w; }

Tensor Head::G(const char* name, int64_t sink_offset) const {
  const DeviceParam& p = params_.at(name);
  if (!p.grad.data.is_null()) return p.grad;
  return SinkView(sink_, p.w.numel(), sink_offset).Reshape(p.w.shape);
}

Status Head::NormForward(Tensor x) {
  const float eps = float(c_.norm_eps);
  if (c_.norm == NormKind::kLayerNorm) {
    return LayerNormForward(
        d_, {x, W(NormName(c_, false)), W(NormName(c_, true)), xn_, mean_, rstd_, eps});
  }
  return RmsNormForward(d_, {x, W(NormName(c_, false)), xn_, rstd_, eps});
}

LmHeadLossArgs Head::LossArgs() const {
  LmHeadLossArgs a;
  a.h = xn_;
  a.w = W(NamesOf(c_).lm_head.c_str());
  a.targets = targets_.data.As<const int32_t>();
  a.chunk_tokens = chunk_;
  a.token_loss = token_loss_;
  a.scratch = scratch_;
  return a;
}

Status Head::ForwardBackward(Tensor x, double normalizer, Tensor dx, double loss_scale) {
  if (mode_ == HeadMode::kForwardOnly) {
    return Status::FailedPrecondition(
        "Head::ForwardBackward: this head was created with HeadMode::kForwardOnly (generation, "
        "evaluation) and has no backward buffers; create it with HeadMode::kTrain");
  }
  FERRY_RETURN_IF_ERROR(NormForward(x));
  LmHeadLossArgs a = LossArgs();
  a.normalizer = normalizer;
  a.loss_scale = loss_scale;
  a.dh = dxn_;
  a.dw = params_.at(NamesOf(c_).lm_head).grad;  // null when frozen: no weight gradient
  FERRY_RETURN_IF_ERROR(LmHeadLossForwardBackward(d_, a));
  if (c_.norm == NormKind::kLayerNorm) {
    return LayerNormBackward(d_, {dxn_, x, W(NormName(c_, false)), mean_, rstd_, dx,
                                  G(NormName(c_, false)), G(NormName(c_, true), c_.hidden_size)});
  }
  return RmsNormBackward(d_, {dxn_, x, W(NormName(c_, false)), rstd_, dx, G(NormName(c_, false))});
}

Status Head::Forward(Tensor x) {
  FERRY_RETURN_IF_ERROR(NormForward(x));
  return LmHeadLossForward(d_, LossArgs());
}

Status Head::Logits(Tensor x, Tensor logits, Tensor scratch) {
  FERRY_RETURN_IF_ERROR(NormForward(x));
  return MatMul(d_, xn_, W(NamesOf(c_).lm_head.c_str()), logits, false, true, 1, 0, {}, scratch);
}

}  // namespace ferry
