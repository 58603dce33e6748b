#include "kernels/cpu/residual.h"

#include "kernels/cpu/cast.h"

namespace ferry::cpu {

Status ResidualAdd(ThreadPool& pool, const ResidualAddArgs& a) {
  ParallelPieces(pool, a.y.numel(), [&](int64_t i, int64_t len) {
    float as[kStageElems], bs[kStageElems], ys[kStageElems];
    const float* x = LoadFloats(a.a, i, len, as);
    const float* z = LoadFloats(a.b, i, len, bs);
    float* y = OutputFloats(a.y, i, ys);
    for (int64_t j = 0; j < len; ++j) y[j] = x[j] + z[j];
    StoreFloats(y, a.y, i, len);
  });
  return Status::Ok();
}

Status ResidualAccumulate(ThreadPool& pool, const ResidualAccumulateArgs& a) {
  ParallelPieces(pool, a.dx.numel(), [&](int64_t i, int64_t len) {
    float dys[kStageElems];
    const float* dy = LoadFloats(a.dy, i, len, dys);
    AccumulateFloats(dy, a.dx, i, len);
  });
  return Status::Ok();
}

}  // namespace ferry::cpu
