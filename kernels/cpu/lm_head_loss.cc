#include "kernels/cpu/lm_head_loss.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "kernels/backend_access.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/onednn.h"

namespace ferry::cpu {

namespace {

constexpr int64_t kWBlockRows = 128;  // W rows widened to fp32 at a time (bf16 storage)
constexpr size_t kAlign = 64;

size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the scratch pieces (see LmHeadLossScratchBytes).
struct ScratchLayout {
  size_t logits = 0;      // (chunk, V) f32
  size_t token_loss = 0;  // (chunk) f32
  size_t h_panel = 0;     // (chunk, C) f32, when h is not f32
  size_t per_thread = 0;  // first thread's block; thread k at per_thread + k * thread_stride
  size_t thread_stride = 0;
  size_t w_panel = 0;     // within a thread's block: (kWBlockRows, C) f32, when W is not f32
  size_t dw_panel = 0;    // (kWBlockRows, C) f32, when a dW is computed and not f32 (backward)
  size_t dh_partial = 0;  // (chunk, C) f32 (backward)
  size_t total = 0;
};

ScratchLayout MakeLayout(int threads, int64_t chunk, int64_t V, int64_t C, DType h_dtype,
                         std::optional<DType> dw_dtype, bool backward) {
  ScratchLayout l;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += AlignUp(bytes);
    return at;
  };
  l.logits = take(size_t(chunk * V) * 4);
  l.token_loss = take(size_t(chunk) * 4);
  if (h_dtype != DType::kF32) l.h_panel = take(size_t(chunk * C) * 4);
  l.per_thread = off;
  off = 0;
  if (h_dtype != DType::kF32) l.w_panel = take(size_t(kWBlockRows * C) * 4);
  if (backward && dw_dtype.has_value() && *dw_dtype != DType::kF32)
    l.dw_panel = take(size_t(kWBlockRows * C) * 4);
  if (backward) l.dh_partial = take(size_t(chunk * C) * 4);
  l.thread_stride = off;
  l.total = l.per_thread + size_t(threads) * l.thread_stride;
  return l;
}

// Rows [v0, v0 + rows) of W as fp32: W itself when stored in fp32, else widened into `panel`.
const float* WeightRows(const float* w, int64_t v0, int64_t rows, int64_t C, float*) {
  return w + v0 * C;
}
const float* WeightRows(const bf16* w, int64_t v0, int64_t rows, int64_t C, float* panel) {
  ConvertToFloat(DType::kBF16, w + v0 * C, panel, size_t(rows * C));
  return panel;
}
const float* WeightRows(const f16* w, int64_t v0, int64_t rows, int64_t C, float* panel) {
  ConvertToFloat(DType::kF16, w + v0 * C, panel, size_t(rows * C));
  return panel;
}

// Rows of W per GEMM: a part's whole range when W is fp32, else what one panel holds.
template <typename T>
int64_t BlockRows(int64_t part_rows) {
  return std::is_same_v<T, float> ? std::max<int64_t>(1, part_rows) : kWBlockRows;
}

// dW rows [v0, v0 + rows) += dlogits[:, v0 : v0 + rows]^T h_chunk.
void AccumulateWeightGrad(float* dw, const float* dlogits, const float* hc, int64_t cn, int64_t V,
                          int64_t C, int64_t v0, int64_t rows, float*) {
  Blas().Sgemm(true, false, int(rows), int(C), int(cn), 1.0f, dlogits + v0, int(V), hc, int(C),
               1.0f, dw + v0 * C, int(C));
}
void AccumulateWeightGrad(bf16* dw, const float* dlogits, const float* hc, int64_t cn, int64_t V,
                          int64_t C, int64_t v0, int64_t rows, float* panel) {
  Blas().Sgemm(true, false, int(rows), int(C), int(cn), 1.0f, dlogits + v0, int(V), hc, int(C),
               0.0f, panel, int(C));
  bf16* out = dw + v0 * C;
  for (int64_t i = 0; i < rows * C; ++i) out[i] = FloatToBF16(BF16ToFloat(out[i]) + panel[i]);
}

// One token's row of logits: returns -log softmax(row)[t]; with `gradient`, rewrites the row as
// (softmax - onehot(t)) * s.
float SoftmaxCrossEntropyRow(float* row, int64_t V, int32_t t, float s, bool gradient) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
  const float target_logit = row[t];
  double z = 0;
  if (gradient) {
    for (int64_t j = 0; j < V; ++j) {
      const float e = std::exp(row[j] - mx);
      row[j] = e;
      z += e;
    }
    const float k = float(double(s) / z);
    for (int64_t j = 0; j < V; ++j) row[j] *= k;
    row[t] -= s;
  } else {
    for (int64_t j = 0; j < V; ++j) z += std::exp(row[j] - mx);
  }
  return float((double(mx) - double(target_logit)) + std::log(z));
}

Status CheckTargets(const int32_t* targets, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    const int32_t t = targets[i];
    if (t != kIgnoreIndex && (t < 0 || t >= V)) {
      return Status::InvalidArgument("lm_head_loss: target[" + std::to_string(i) +
                                     "] = " + std::to_string(t) + " is outside [0, " +
                                     std::to_string(V) + ") and is not the ignore index " +
                                     std::to_string(kIgnoreIndex));
    }
  }
  return Status::Ok();
}

template <typename T, typename G>
Status Run(ThreadPool& pool, const LmHeadLossArgs& a, bool backward) {
  const int64_t N = a.h.dim(0), C = a.h.dim(1), V = a.w.dim(0);
  const int64_t chunk = a.chunk_tokens;
  const int parts = pool.size();
  const ScratchLayout L =
      MakeLayout(parts, chunk, V, C, a.h.dtype, LmHeadLossWeightGradDType(a, backward), backward);
  if (a.scratch.bytes() < L.total) {
    return Status::InvalidArgument("lm_head_loss: scratch has " +
                                   std::to_string(a.scratch.bytes()) + " bytes; " +
                                   std::to_string(L.total) + " needed (LmHeadLossScratchBytes)");
  }
  const T* h = BackendAccess::Data<T>(a.h);                                  // (N, C)
  const T* w = BackendAccess::Data<T>(a.w);                                  // (V, C)
  const int32_t* targets = N > 0 ? BackendAccess::Raw(a.targets) : nullptr;  // (N)
  FERRY_RETURN_IF_ERROR(CheckTargets(targets, N, V));
  T* dh = backward ? BackendAccess::Data<T>(a.dh) : nullptr;                          // (N, C)
  G* dw = backward && !a.dw.data.is_null() ? BackendAccess::Data<G>(a.dw) : nullptr;  // (V, C)
  float* token_loss_out =
      a.token_loss.data.is_null() ? nullptr : BackendAccess::Data<float>(a.token_loss);  // (N)

  std::byte* base = BackendAccess::Raw(a.scratch.data);
  float* logits = reinterpret_cast<float*>(base + L.logits);  // (chunk, V)
  float* chunk_loss = reinterpret_cast<float*>(base + L.token_loss);
  float* h_panel = reinterpret_cast<float*>(base + L.h_panel);
  auto thread_piece = [&](int k, size_t offset) {
    return reinterpret_cast<float*>(base + L.per_thread + size_t(k) * L.thread_stride + offset);
  };
  if (backward) {
    for (int k = 0; k < parts; ++k)
      std::memset(thread_piece(k, L.dh_partial), 0, size_t(chunk * C) * 4);
  }
  auto part_begin = [&](int64_t k) { return k * V / parts; };
  const float s = float(a.loss_scale / a.normalizer);
  const int64_t row_grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(V, 1));
  double loss_sum = 0;
  const OneDnn* dnnl = std::is_same_v<T, bf16> ? Bf16GemmLibrary() : nullptr;  // f16: panels

  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t cn = std::min(chunk, N - n0);
    // h rows of this chunk in fp32.
    const float* hc = nullptr;  // unused in a forward on oneDNN
    if constexpr (std::is_same_v<T, float>) {
      hc = h + n0 * C;
    } else if (dnnl == nullptr || backward) {
      pool.ParallelFor(
          cn, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t b, int64_t e, int) {
            ConvertToFloat(a.h.dtype, h + (n0 + b) * C, h_panel + b * C, size_t((e - b) * C));
          });
      hc = h_panel;
    }
    // A: logits (cn, V), each part its vocabulary range. bf16 h and W go straight to oneDNN's
    // bf16 kernels where the CPU has them (exact products, fp32 sums, as the panels below), one
    // product per part, the worker's W panel its scratchpad; otherwise W is widened a block of
    // rows at a time.
    std::vector<Status> part_status(static_cast<size_t>(parts));
    pool.ParallelFor(parts, 1, [&](int64_t pb, int64_t pe, int worker) {
      for (int64_t k = pb; k < pe; ++k) {
        const int64_t v_begin = part_begin(k), v_end = part_begin(k + 1);
        if constexpr (!std::is_same_v<T, float>) {
          if (dnnl != nullptr && v_end > v_begin && C > 0) {
            part_status[size_t(k)] = dnnl->Run({.trans_b = true,
                                                .m = cn,
                                                .n = v_end - v_begin,
                                                .k = C,
                                                .a = h + n0 * C,
                                                .lda = C,
                                                .b = w + v_begin * C,
                                                .ldb = C,
                                                .c = logits + v_begin,
                                                .ldc = V,
                                                .scratch = thread_piece(worker, L.w_panel),
                                                .scratch_bytes = size_t(kWBlockRows * C) * 4});
            continue;
          }
        }
        const int64_t block = BlockRows<T>(v_end - v_begin);
        for (int64_t v0 = v_begin; v0 < v_end; v0 += block) {
          const int64_t rows = std::min(block, v_end - v0);
          const float* wr = WeightRows(w, v0, rows, C, thread_piece(worker, L.w_panel));
          Blas().Sgemm(false, true, int(cn), int(rows), int(C), 1.0f, hc, int(C), wr, int(C), 0.0f,
                       logits + v0, int(V));
        }
      }
    });
    for (const Status& st : part_status) FERRY_RETURN_IF_ERROR(st);
    // B: per-token loss; backward turns logits into dlogits in place.
    float* losses = token_loss_out != nullptr ? token_loss_out + n0 : chunk_loss;
    pool.ParallelFor(cn, row_grain, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) {
        float* row = logits + r * V;
        const int32_t t = targets[n0 + r];
        if (t == kIgnoreIndex) {
          losses[r] = 0.0f;
          if (backward) std::fill(row, row + V, 0.0f);
        } else {
          losses[r] = SoftmaxCrossEntropyRow(row, V, t, s, backward);
        }
      }
    });
    for (int64_t r = 0; r < cn; ++r) loss_sum += losses[r];
    if (!backward) continue;
    // C: dW rows of each part (when there is a dW), and each part's dh partial.
    pool.ParallelFor(parts, 1, [&](int64_t pb, int64_t pe, int worker) {
      for (int64_t k = pb; k < pe; ++k) {
        const int64_t v_end = part_begin(k + 1);
        const int64_t block = BlockRows<T>(v_end - part_begin(k));
        float* partial = thread_piece(int(k), L.dh_partial);  // (cn, C)
        for (int64_t v0 = part_begin(k); v0 < v_end; v0 += block) {
          const int64_t rows = std::min(block, v_end - v0);
          if (dw != nullptr) {
            AccumulateWeightGrad(dw, logits, hc, cn, V, C, v0, rows,
                                 thread_piece(worker, L.dw_panel));
          }
          const float* wr = WeightRows(w, v0, rows, C, thread_piece(worker, L.w_panel));
          Blas().Sgemm(false, false, int(cn), int(C), int(rows), 1.0f, logits + v0, int(V), wr,
                       int(C), 1.0f, partial, int(C));
        }
      }
    });
    // D: dh rows = sum of partials in part order; partials are cleared for the next chunk.
    pool.ParallelFor(cn, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)),
                     [&](int64_t b, int64_t e, int) {
                       for (int64_t r = b; r < e; ++r) {
                         float* p0 = thread_piece(0, L.dh_partial) + r * C;
                         T* out = dh + (n0 + r) * C;
                         for (int k = 1; k < parts; ++k) {
                           float* pk = thread_piece(k, L.dh_partial) + r * C;
                           for (int64_t c = 0; c < C; ++c) p0[c] += pk[c];
                           std::memset(pk, 0, size_t(C) * 4);
                         }
                         for (int64_t c = 0; c < C; ++c) out[c] = FromFloat<T>(p0[c]);
                         std::memset(p0, 0, size_t(C) * 4);
                       }
                     });
  }
  if (!a.loss_sum.data.is_null()) {
    *BackendAccess::Data<float>(a.loss_sum) = float(loss_sum / a.normalizer);
  }
  return Status::Ok();
}

}  // namespace

size_t LmHeadLossScratchBytes(int threads, int64_t chunk_tokens, int64_t V, int64_t C,
                              DType h_dtype, std::optional<DType> dw_dtype, bool backward) {
  return MakeLayout(std::max(1, threads), chunk_tokens, V, C, h_dtype, dw_dtype, backward).total;
}

Status LmHeadLossForward(ThreadPool& pool, const LmHeadLossArgs& a) {
  if (a.h.dtype == DType::kF32) return Run<float, float>(pool, a, false);
  if (a.h.dtype == DType::kF16) return Run<f16, float>(pool, a, false);
  return Run<bf16, float>(pool, a, false);
}

// f16 h and W (fp16 training): W's gradient is fp32 (the executor's parameter gradients).
Status LmHeadLossForwardBackward(ThreadPool& pool, const LmHeadLossArgs& a) {
  if (a.h.dtype == DType::kF32) return Run<float, float>(pool, a, true);
  if (a.h.dtype == DType::kF16) {
    if (a.dw.data.is_null() || a.dw.dtype == DType::kF32) return Run<f16, float>(pool, a, true);
    return Status::InvalidArgument("lm_head_loss: f16 h needs an f32 dw, got " + a.dw.ToString());
  }
  if (a.dw.data.is_null() || a.dw.dtype == DType::kF32) return Run<bf16, float>(pool, a, true);
  return Run<bf16, bf16>(pool, a, true);
}

}  // namespace ferry::cpu
