#include "kernels/ops/lm_head_loss.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/ops/backend.h"

namespace ferry {

namespace {

Status Bad(const std::string& what) { return Status::InvalidArgument("lm_head_loss: " + what); }

// `t` must exist with `dtype` (or f32/bf16 when `any_storage`) and the shape `want`.
Status CheckTensor(const Tensor& t, const char* name, Shape want, DType dtype) {
  if (t.data.is_null()) return Bad(std::string(name) + " is missing");
  if (t.dtype != dtype) {
    return Bad(std::string(name) + " is " + t.ToString() + "; expected " +
               std::string(DTypeName(dtype)));
  }
  if (!(t.shape == want)) {
    return Bad(std::string(name) + " has shape " + t.shape.ToString() + "; expected " +
               want.ToString());
  }
  return Status::Ok();
}

}  // namespace

Status ValidateLmHeadLoss(const LmHeadLossArgs& a, bool backward) {
  if (a.h.data.is_null() || a.h.shape.rank() != 2) return Bad("h must be a (N, C) tensor");
  if (a.h.dtype != DType::kF32 && a.h.dtype != DType::kBF16 && a.h.dtype != DType::kF16) {
    return Bad("h is " + a.h.ToString() + "; expected f32, bf16 or f16");
  }
  const int64_t N = a.h.dim(0), C = a.h.dim(1);
  if (C < 1) return Bad("h has no features: " + a.h.ToString());
  if (a.w.data.is_null() || a.w.shape.rank() != 2 || a.w.dim(0) < 1) {
    return Bad("w must be a (V, C) tensor with V >= 1; got " + a.w.ToString());
  }
  const int64_t V = a.w.dim(0);
  FERRY_RETURN_IF_ERROR(CheckTensor(a.w, "w", Shape{V, C}, a.h.dtype));
  if (N > 0 && a.targets.is_null()) return Bad("targets are missing");
  if (!(a.normalizer > 0) || !std::isfinite(a.normalizer)) {
    return Bad("normalizer = " + std::to_string(a.normalizer) +
               "; expected the (positive) count of non-ignored targets of the global batch");
  }
  if (!(a.loss_scale > 0) || !std::isfinite(a.loss_scale)) {
    return Bad("loss_scale = " + std::to_string(a.loss_scale) + "; expected > 0");
  }
  if (a.chunk_tokens < 1)
    return Bad("chunk_tokens = " + std::to_string(a.chunk_tokens) + "; expected >= 1");
  if (!a.token_loss.data.is_null()) {
    FERRY_RETURN_IF_ERROR(CheckTensor(a.token_loss, "token_loss", Shape{N}, DType::kF32));
  }
  if (!a.loss_sum.data.is_null()) {
    FERRY_RETURN_IF_ERROR(CheckTensor(a.loss_sum, "loss_sum", Shape{1}, DType::kF32));
  }
  if (backward) {
    FERRY_RETURN_IF_ERROR(CheckTensor(a.dh, "dh", Shape{N, C}, a.h.dtype));
    if (!a.dw.data.is_null()) {  // absent: no weight gradient (a frozen head)
      const DType dw_dtype = a.dw.dtype == DType::kF32 ? DType::kF32 : a.w.dtype;
      FERRY_RETURN_IF_ERROR(CheckTensor(a.dw, "dw", Shape{V, C}, dw_dtype));
    }
  }
  if (a.scratch.data.is_null()) return Bad("scratch is missing (LmHeadLossScratchBytes)");
  return Status::Ok();
}

CudaLmHeadLossLayout MakeCudaLmHeadLossLayout(int64_t chunk_tokens, int64_t V, int64_t C,
                                              DType h_dtype, std::optional<DType> dw_dtype,
                                              bool backward) {
  CudaLmHeadLossLayout l;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += (bytes + kCudaLmHeadLossAlign - 1) / kCudaLmHeadLossAlign * kCudaLmHeadLossAlign;
    return at;
  };
  l.logits = take(size_t(chunk_tokens) * size_t(V) * 4);
  l.chunk_loss = take(size_t(chunk_tokens) * 4);
  l.state = take(kCudaLmHeadLossStateBytes);
  if (backward && h_dtype != DType::kF32) {
    if (dw_dtype.has_value()) l.h_panel = take(size_t(chunk_tokens) * size_t(C) * 4);
    l.panel_rows = std::min(V, kCudaLmHeadLossPanelRows);
    l.w_panel = take(size_t(l.panel_rows) * size_t(C) * 4);
    l.dh_acc = take(size_t(chunk_tokens) * size_t(C) * 4);
  }
  l.total = off;
  return l;
}

size_t LmHeadLossScratchBytes(OpTarget t, int64_t chunk_tokens, int64_t V, int64_t C, DType h_dtype,
                              std::optional<DType> dw_dtype, bool backward) {
  return ScratchReportsFor(t.kind).lm_head_loss(t.threads, chunk_tokens, V, C, h_dtype, dw_dtype,
                                                backward);
}

size_t LmHeadLossScratchBytes(const Device& d, int64_t chunk_tokens, int64_t V, int64_t C,
                              DType h_dtype, std::optional<DType> dw_dtype, bool backward) {
  return LmHeadLossScratchBytes(OpTargetOf(d), chunk_tokens, V, C, h_dtype, dw_dtype, backward);
}

namespace {

Status Enqueue(Device& d, const LmHeadLossArgs& a, bool backward) {
  FERRY_RETURN_IF_ERROR(ValidateLmHeadLoss(a, backward));
  FERRY_ASSIGN_OR_RETURN(const Kernel<LmHeadLossArgs>* k,
                         FindKernel(d, backward ? &Backend::lm_head_loss_forward_backward
                                                : &Backend::lm_head_loss_forward));
  const size_t need = LmHeadLossScratchBytes(d, a.chunk_tokens, a.w.dim(0), a.h.dim(1), a.h.dtype,
                                             LmHeadLossWeightGradDType(a, backward), backward);
  if (a.scratch.bytes() < need) {
    return Bad("scratch is " + std::to_string(a.scratch.bytes()) + " bytes; " +
               std::to_string(need) + " needed on device '" + d.name() + "'");
  }
  return k->run(d, k->op, a);
}

}  // namespace

Status LmHeadLossForward(Device& d, const LmHeadLossArgs& a) { return Enqueue(d, a, false); }

Status LmHeadLossForwardBackward(Device& d, const LmHeadLossArgs& a) { return Enqueue(d, a, true); }

}  // namespace ferry
