#include "kernels/cpu/swiglu.h"

#include "kernels/cpu/cast.h"
#include "kernels/cpu/vec_math.h"

namespace ferry::cpu {

// Both kernels walk the (N, I) output in pieces that never cross a row, so a piece's gate and up
// halves are contiguous in the (N, 2I) tensor.
Status SwiGluForward(ThreadPool& pool, const SwiGluForwardArgs& a) {
  const int64_t inter = a.h.dim(1);
  ParallelPieces(pool, a.h.numel(), [&](int64_t i, int64_t len) {
    float gs[kStageElems], us[kStageElems], hs[kStageElems];
    for (int64_t p = i; p < i + len;) {  // split the piece at row ends
      const int64_t r = p / inter, j0 = p % inter;
      const int64_t n = std::min(i + len - p, inter - j0);
      const float* g = LoadFloats(a.gate_up, r * 2 * inter + j0, n, gs);
      const float* u = LoadFloats(a.gate_up, r * 2 * inter + inter + j0, n, us);
      float* h = OutputFloats(a.h, p, hs);
      MapF4(
          n, h, [](VecF4 gv, VecF4 uv) { return gv / (1.0f + ExpF4(-gv)) * uv; }, g, u);
      StoreFloats(h, a.h, p, n);
      p += n;
    }
  });
  return Status::Ok();
}

Status SwiGluBackward(ThreadPool& pool, const SwiGluBackwardArgs& a) {
  const int64_t inter = a.dh.dim(1);
  ParallelPieces(pool, a.dh.numel(), [&](int64_t i, int64_t len) {
    float gs[kStageElems], us[kStageElems], dhs[kStageElems], dgs[kStageElems], dus[kStageElems];
    for (int64_t p = i; p < i + len;) {
      const int64_t r = p / inter, j0 = p % inter;
      const int64_t n = std::min(i + len - p, inter - j0);
      const int64_t gate_at = r * 2 * inter + j0, up_at = gate_at + inter;
      const float* g = LoadFloats(a.gate_up, gate_at, n, gs);
      const float* u = LoadFloats(a.gate_up, up_at, n, us);
      const float* dh = LoadFloats(a.dh, p, n, dhs);
      float* dg = OutputFloats(a.dgate_up, gate_at, dgs);
      float* du = OutputFloats(a.dgate_up, up_at, dus);
      float sig[kStageElems];  // sigmoid(g)
      MapF4(
          n, sig, [](VecF4 gv, VecF4) { return 1.0f / (1.0f + ExpF4(-gv)); }, g);
      for (int64_t j = 0; j < n; ++j) {
        const float s = sig[j];
        dg[j] = dh[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
        du[j] = dh[j] * g[j] * s;
      }
      StoreFloats(dg, a.dgate_up, gate_at, n);
      StoreFloats(du, a.dgate_up, up_at, n);
      p += n;
    }
  });
  return Status::Ok();
}

}  // namespace ferry::cpu
