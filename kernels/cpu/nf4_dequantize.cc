#include "kernels/cpu/nf4_dequantize.h"

#include <algorithm>

#include "kernels/backend_access.h"
#include "kernels/cpu/cast.h"

namespace ferry::cpu {

Status Nf4Dequantize(ThreadPool& pool, const Nf4DequantizeArgs& a) {
  const uint8_t* packed = BackendAccess::Data<const uint8_t>(a.packed);
  const float* code = BackendAccess::Data<const float>(a.code);
  const bool nested = a.nested();
  const float offset = nested ? BackendAccess::Data<const float>(a.nested_offset)[0] : 0.0f;
  // Block b's absmax: stored, or (nested) its 8-bit index dequantized as Nf4Absmax does.
  auto absmax_of = [&](int64_t b) {
    if (!nested) return BackendAccess::Data<const float>(a.absmax)[b];
    const uint8_t q = BackendAccess::Data<const uint8_t>(a.absmax)[b];
    return Nf4NestedAbsmax(BackendAccess::Data<const float>(a.nested_code)[q],
                           BackendAccess::Data<const float>(a.nested_absmax)[b / a.nested_block],
                           offset);
  };
  ParallelPieces(pool, a.out.numel(), [&](int64_t i0, int64_t len) {
    float stage[kStageElems];
    float* y = OutputFloats(a.out, i0, stage);
    // Block by block (one absmax each); within a block, whole bytes (two elements) where the
    // run starts on an even element, the odd ends one by one.
    const int64_t end = i0 + len;
    for (int64_t i = i0; i < end;) {
      const int64_t b = i / a.block;
      const int64_t stop = std::min(end, (b + 1) * a.block);
      const float absmax = absmax_of(b);
      if ((i & 1) != 0) {
        y[i - i0] = Nf4Value(code[Nf4Nibble(packed, i)], absmax);
        ++i;
      }
      for (; i + 1 < stop; i += 2) {
        const uint8_t byte = packed[i >> 1];
        y[i - i0] = Nf4Value(code[byte >> 4], absmax);
        y[i + 1 - i0] = Nf4Value(code[byte & 0x0f], absmax);
      }
      if (i < stop) {
        y[i - i0] = Nf4Value(code[Nf4Nibble(packed, i)], absmax);
        ++i;
      }
    }
    StoreFloats(y, a.out, i0, len);
  });
  return Status::Ok();
}

}  // namespace ferry::cpu
