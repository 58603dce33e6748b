#include "kernels/cpu/nf4_dequantize.h"

#include "kernels/backend_access.h"
#include "kernels/cpu/cast.h"

namespace ferry::cpu {

Status Nf4Dequantize(ThreadPool& pool, const Nf4DequantizeArgs& a) {
  const uint8_t* packed = BackendAccess::Data<const uint8_t>(a.packed);
  const float* code = BackendAccess::Data<const float>(a.code);
  const bool nested = a.nested();
  // Block b's absmax: stored, or (nested) its 8-bit index dequantized as Nf4Absmax does.
  auto absmax_of = [&](int64_t b) {
    if (!nested) return BackendAccess::Data<const float>(a.absmax)[b];
    const uint8_t q = BackendAccess::Data<const uint8_t>(a.absmax)[b];
    return Nf4NestedAbsmax(BackendAccess::Data<const float>(a.nested_code)[q],
                           BackendAccess::Data<const float>(a.nested_absmax)[b / a.nested_block],
                           a.nested_offset);
  };
  ParallelPieces(pool, a.out.numel(), [&](int64_t i0, int64_t len) {
    float stage[kStageElems];
    float* y = OutputFloats(a.out, i0, stage);
    int64_t block = i0 / a.block;
    float absmax = absmax_of(block);
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = i0 + j;
      if (i / a.block != block) absmax = absmax_of(block = i / a.block);
      y[j] = Nf4Value(code[Nf4Nibble(packed, i)], absmax);
    }
    StoreFloats(y, a.out, i0, len);
  });
  return Status::Ok();
}

}  // namespace ferry::cpu
