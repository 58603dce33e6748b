// Fused LM head + cross-entropy on CUDA (semantics: kernels/ops/lm_head_loss.h; the CPU kernel is
// kernels/cpu/lm_head_loss.cc), on the device's compute stream, in the scratch that
// CudaLmHeadLossLayout describes. Per chunk of tokens (cn <= chunk_tokens rows):
//   1. logits (cn, V) f32 = h_chunk W^T, cuBLAS (bf16 x bf16 -> f32 or f32, fp32 compute);
//   2. a block per row: max (exact), z = sum exp(l - max) in DOUBLE as the CPU sums (fixed order:
//      each thread's strided share, then reduce.cuh's tree), token loss = (max - l_t) + log z in
//      double, rounded to f32; the backward rewrites the row as (P - Y) s in place with the CPU's
//      rounding points (e * float(s / z), then row[t] -= s);
//   3. one thread adds the chunk's token losses to a double in token order: the CPU's order, so
//      with equal token losses the loss sum has the CPU's bits; no atomics;
//   4. backward: dW += G^T h_chunk (when a dW is given; a frozen head skips it) and
//      dh_chunk = G W (`=`), cuBLAS. cuBLAS multiplies no fp32 x bf16 mix, so with bf16 storage W
//      is widened to fp32 panel_rows rows at a time, dh sums in an fp32 block (rounded once at the
//      end of the chunk) and h is widened once per chunk; a bf16 dW gets each block's fp32
//      product added and rounded once per chunk (Residual), as the CPU's AccumulateWeightGrad.
// Targets: one block scans them before anything else and keeps the first bad one (integer
// atomicMin: the minimum, whatever the order); EnqueueComputeCheck copies it to the host and fails
// the stream with the CPU's InvalidArgument message. The kernels treat a bad target as ignored, so
// they never read outside a row.
// Accumulation: dW `+=`, dh `=`, token_loss and loss_sum `=`. Deterministic: cuBLAS with fixed
// shapes and fixed-order reductions give the same bits on every run, and dh does not depend on
// whether dW is computed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/backend_access.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce.cuh"

namespace ferry::cuda {
namespace {

// The scratch's `state` piece.
struct LossState {
  double loss_sum;               // sum of token losses so far
  unsigned long long first_bad;  // index of the first bad target; kNoBadTarget if none
  int32_t bad_value;             // its value
};
static_assert(sizeof(LossState) <= kCudaLmHeadLossStateBytes);
static_assert(sizeof(LossState) <= CudaDevice::kCheckBytes);
constexpr unsigned long long kNoBadTarget = ~0ull;

__device__ __forceinline__ bool BadTarget(int32_t t, int64_t V) {
  return t != kIgnoreIndex && (t < 0 || int64_t(t) >= V);
}

// One block: state = {0, first bad target index or kNoBadTarget, its value}.
__global__ void CheckTargetsKernel(const int32_t* __restrict__ targets,  // (N)
                                   int64_t n, int64_t V, LossState* state) {
  __shared__ unsigned long long first;
  if (threadIdx.x == 0) first = kNoBadTarget;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (BadTarget(targets[i], V)) {
      atomicMin(&first, static_cast<unsigned long long>(i));
      break;  // this thread's later indices are larger
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    state->loss_sum = 0.0;
    state->first_bad = first;
    state->bad_value = first == kNoBadTarget ? 0 : targets[first];
  }
}

// A block per row r of the chunk: losses[r] = -log softmax(row)[t] (0 for an ignored or bad
// target); with `gradient`, the row becomes (softmax - onehot(t)) * s (zeros for those targets).
__global__ void SoftmaxCrossEntropyKernel(float* __restrict__ logits,           // (cn, V)
                                          const int32_t* __restrict__ targets,  // (cn)
                                          float* __restrict__ losses,           // (cn), written
                                          int64_t V, float s, bool gradient) {
  float* row = logits + int64_t(blockIdx.x) * V;
  const int32_t t = targets[blockIdx.x];
  if (t == kIgnoreIndex || BadTarget(t, V)) {  // uniform over the block
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    if (gradient) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) row[j] = 0.0f;
    }
    return;
  }
  const float target_logit = row[t];  // read by every thread before any write (BlockSum syncs)
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = BlockMax(mx);
  double z = 0.0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) z += double(expf(row[j] - mx));
  z = BlockSum(z);
  if (threadIdx.x == 0) {
    losses[blockIdx.x] = float((double(mx) - double(target_logit)) + log(z));
  }
  if (!gradient) return;
  const float k = float(double(s) / z);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    // The same expf as in the sum (the CPU stores e, then e * k); __fmul_rn: never fused with the
    // subtraction below (the CPU rounds e * k, then e * k - s).
    float v = __fmul_rn(expf(row[j] - mx), k);
    if (j == t) v -= s;
    row[j] = v;
  }
}

// state->loss_sum += losses[0..cn) in order (the CPU's order), one thread.
__global__ void AddChunkLossKernel(const float* __restrict__ losses, int64_t cn, LossState* state) {
  double sum = state->loss_sum;
  for (int64_t r = 0; r < cn; ++r) sum += double(losses[r]);
  state->loss_sum = sum;
}

// *out = float(loss_sum / normalizer), one thread.
__global__ void WriteLossSumKernel(const LossState* state, double normalizer, float* out) {
  *out = float(state->loss_sum / normalizer);
}

template <typename T>
T* At(const DevicePtr<std::byte>& base, size_t offset) {
  return reinterpret_cast<T*>(BackendAccess::Raw(base) + offset);
}

// A (rows, cols) view of `t`'s rows starting at `row` (t is (*, cols) and contiguous).
Tensor Rows(const Tensor& t, int64_t row, int64_t rows) {
  const int64_t cols = t.dim(1);
  return Tensor{t.data + std::ptrdiff_t(row * cols * int64_t(DTypeSize(t.dtype))), t.dtype,
                Shape{rows, cols}};
}
// A (rows, cols) f32 view of the scratch at `offset`.
Tensor ScratchF32(const LmHeadLossArgs& a, size_t offset, int64_t rows, int64_t cols) {
  return Tensor{a.scratch.data + std::ptrdiff_t(offset), DType::kF32, Shape{rows, cols}};
}

// One cuBLAS product on the compute stream.
Status Product(CudaDevice& d, const char* what, const StridedGemm& g) {
  return d.EnqueueCompute(what, [&](const CudaContext& ctx) { return CublasStridedGemm(ctx, g); });
}

// The gradient products, all fp32, on column blocks of G = (P - Y) s, the (cn, V) logits block;
// `g_cols` points at column v0 of its first row (row stride V).
// dW's: out (rows, C) = beta out + G[:, v0 : v0 + rows]^T x, x = h_chunk (cn, C).
Status WeightGradProduct(CudaDevice& d, const float* g_cols, int64_t V, const void* x, int64_t cn,
                         int64_t C, void* out, int64_t rows, float beta) {
  return Product(d, "lm_head_loss (dW)",
                 {.a = g_cols,
                  .lda = V,
                  .trans_a = true,
                  .b = x,
                  .ldb = C,
                  .c = out,
                  .ldc = C,
                  .m = rows,
                  .n = C,
                  .k = cn,
                  .beta = beta});
}
// dh's: out (cn, C) = beta out + G[:, v0 : v0 + rows] w_rows, w_rows = W[v0 : v0 + rows] (rows, C).
Status InputGradProduct(CudaDevice& d, const float* g_cols, int64_t V, const void* w_rows,
                        int64_t rows, int64_t C, void* out, int64_t cn, float beta) {
  return Product(d, "lm_head_loss (dh)",
                 {.a = g_cols,
                  .lda = V,
                  .b = w_rows,
                  .ldb = C,
                  .c = out,
                  .ldc = C,
                  .m = cn,
                  .n = C,
                  .k = rows,
                  .beta = beta});
}

Status Run(CudaDevice& d, const LmHeadLossArgs& a, bool backward) {
  const int64_t N = a.h.dim(0), C = a.h.dim(1), V = a.w.dim(0), chunk = a.chunk_tokens;
  const bool bf16 = a.h.dtype != DType::kF32;
  const bool has_dw = backward && !a.dw.data.is_null();
  const CudaLmHeadLossLayout L = MakeCudaLmHeadLossLayout(
      chunk, V, C, a.h.dtype, LmHeadLossWeightGradDType(a, backward), backward);
  if (a.scratch.bytes() < L.total) {
    return Status::InvalidArgument("lm_head_loss: scratch has " +
                                   std::to_string(a.scratch.bytes()) + " bytes; " +
                                   std::to_string(L.total) + " needed (LmHeadLossScratchBytes)");
  }
  FERRY_RETURN_IF_ERROR(CheckGridRows("lm_head_loss", std::min(chunk, std::max<int64_t>(N, 1))));
  float* logits = At<float>(a.scratch.data, L.logits);  // (chunk, V)
  LossState* state = At<LossState>(a.scratch.data, L.state);
  const int32_t* targets = N > 0 ? BackendAccess::Raw(a.targets) : nullptr;  // (N)
  float* token_loss =
      a.token_loss.data.is_null() ? nullptr : BackendAccess::Data<float>(a.token_loss);  // (N)
  const float s = float(a.loss_scale / a.normalizer);

  FERRY_RETURN_IF_ERROR(d.EnqueueCompute("lm_head_loss (targets)", [&](const CudaContext& ctx) {
    CheckTargetsKernel<<<1, kRowThreads, 0, ctx.compute>>>(targets, N, V, state);
    return Status::Ok();
  }));
  FERRY_RETURN_IF_ERROR(d.EnqueueComputeCheck(
      "lm_head_loss", a.scratch.data + std::ptrdiff_t(L.state), sizeof(LossState),
      [V](const std::byte* host) -> Status {
        const auto* st = reinterpret_cast<const LossState*>(host);
        if (st->first_bad == kNoBadTarget) return Status::Ok();
        return Status::InvalidArgument("lm_head_loss: target[" + std::to_string(st->first_bad) +
                                       "] = " + std::to_string(st->bad_value) + " is outside [0, " +
                                       std::to_string(V) + ") and is not the ignore index " +
                                       std::to_string(kIgnoreIndex));
      }));

  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t cn = std::min(chunk, N - n0);
    const Tensor hc = Rows(a.h, n0, cn);  // (cn, C)
    // 1. logits = h_chunk W^T.
    FERRY_RETURN_IF_ERROR(Product(d, "lm_head_loss (logits)",
                                  {.a = BackendAccess::Raw(hc.data),
                                   .a_dtype = a.h.dtype,
                                   .lda = C,
                                   .b = BackendAccess::Raw(a.w.data),
                                   .b_dtype = a.w.dtype,
                                   .ldb = C,
                                   .trans_b = true,
                                   .c = logits,
                                   .ldc = V,
                                   .m = cn,
                                   .n = V,
                                   .k = C}));
    // 2, 3. Token losses (and P - Y in place), the running loss sum.
    float* losses =
        token_loss != nullptr ? token_loss + n0 : At<float>(a.scratch.data, L.chunk_loss);
    FERRY_RETURN_IF_ERROR(d.EnqueueCompute("lm_head_loss (softmax)", [&](const CudaContext& ctx) {
      SoftmaxCrossEntropyKernel<<<unsigned(cn), RowThreads(V), 0, ctx.compute>>>(
          logits, targets + n0, losses, V, s, backward);
      AddChunkLossKernel<<<1, 1, 0, ctx.compute>>>(losses, cn, state);
      return Status::Ok();
    }));
    if (!backward) continue;
    // 4. Gradients. G = logits (cn, V), f32.
    if (!bf16) {
      if (has_dw) {  // dW (V, C) += G^T h_chunk
        FERRY_RETURN_IF_ERROR(WeightGradProduct(d, logits, V, BackendAccess::Raw(hc.data), cn, C,
                                                BackendAccess::Raw(a.dw.data), V, 1.0f));
      }
      // dh_chunk (cn, C) = G W.
      FERRY_RETURN_IF_ERROR(InputGradProduct(d, logits, V, BackendAccess::Raw(a.w.data), V, C,
                                             BackendAccess::Raw(Rows(a.dh, n0, cn).data), cn,
                                             0.0f));
      continue;
    }
    // bf16 storage: fp32 panels.
    const Tensor h_panel = ScratchF32(a, L.h_panel, cn, C);  // (cn, C)
    const Tensor dh_acc = ScratchF32(a, L.dh_acc, cn, C);    // (cn, C)
    void* const h_panel_raw = BackendAccess::Raw(h_panel.data);
    if (has_dw) {
      FERRY_RETURN_IF_ERROR(Cast(d, hc, h_panel));
      if (a.dw.dtype == DType::kF32) {  // dW (V, C) += G^T h_panel, all rows at once
        FERRY_RETURN_IF_ERROR(WeightGradProduct(d, logits, V, h_panel_raw, cn, C,
                                                BackendAccess::Raw(a.dw.data), V, 1.0f));
      }
    }
    for (int64_t v0 = 0; v0 < V; v0 += L.panel_rows) {
      const int64_t rows = std::min(L.panel_rows, V - v0);
      const Tensor panel = ScratchF32(a, L.w_panel, rows, C);  // (rows, C)
      if (has_dw && a.dw.dtype != DType::kF32) {
        // panel = G[:, v0 : v0 + rows]^T h_panel; dW rows = round(dW rows + panel).
        FERRY_RETURN_IF_ERROR(WeightGradProduct(d, logits + v0, V, h_panel_raw, cn, C,
                                                BackendAccess::Raw(panel.data), rows, 0.0f));
        const Tensor dw_rows = Rows(a.dw, v0, rows);
        FERRY_RETURN_IF_ERROR(Residual(d, dw_rows, panel, dw_rows));
      }
      // dh_acc (+)= G[:, v0 : v0 + rows] W[v0 : v0 + rows] (widened into the panel).
      FERRY_RETURN_IF_ERROR(Cast(d, Rows(a.w, v0, rows), panel));
      FERRY_RETURN_IF_ERROR(InputGradProduct(d, logits + v0, V, BackendAccess::Raw(panel.data),
                                             rows, C, BackendAccess::Raw(dh_acc.data), cn,
                                             v0 == 0 ? 0.0f : 1.0f));
    }
    FERRY_RETURN_IF_ERROR(Cast(d, dh_acc, Rows(a.dh, n0, cn)));
  }
  if (!a.loss_sum.data.is_null()) {
    float* out = BackendAccess::Data<float>(a.loss_sum);
    const double normalizer = a.normalizer;
    FERRY_RETURN_IF_ERROR(d.EnqueueCompute("lm_head_loss (sum)", [&](const CudaContext& ctx) {
      WriteLossSumKernel<<<1, 1, 0, ctx.compute>>>(state, normalizer, out);
      return Status::Ok();
    }));
  }
  return Status::Ok();
}

}  // namespace

Status LmHeadLossForward(CudaDevice& d, const LmHeadLossArgs& a) { return Run(d, a, false); }

Status LmHeadLossForwardBackward(CudaDevice& d, const LmHeadLossArgs& a) { return Run(d, a, true); }

}  // namespace ferry::cuda
