#include "kernels/cpu/cast.h"

#include <cassert>
#include <cstring>

#include "kernels/backend_access.h"

namespace ferry::cpu {

void ConvertRowToFloat(DType t, const void* src, float* dst, int64_t n) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
  } else if (t == DType::kBF16) {
    const bf16* s = static_cast<const bf16*>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) dst[i + j] = BF16ToFloat(s[i + j]);
    }
    for (; i < n; ++i) dst[i] = BF16ToFloat(s[i]);
  } else {
    const f16* s = static_cast<const f16*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(s[i]);
  }
}

void ConvertRowFromFloat(const float* src, DType t, void* dst, int64_t n) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
  } else if (t == DType::kBF16) {
    bf16* d = static_cast<bf16*>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) d[i + j] = FloatToBF16(src[i + j]);
    }
    for (; i < n; ++i) d[i] = FloatToBF16(src[i]);
  } else {
    f16* d = static_cast<f16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToF16(src[i]);
  }
}

std::byte* ElementAddress(const Tensor& t, int64_t offset) {
  return BackendAccess::Raw(t.data) + offset * int64_t(DTypeSize(t.dtype));
}

const float* LoadFloats(const Tensor& t, int64_t offset, int64_t n, float* stage) {
  const std::byte* p = ElementAddress(t, offset);
  if (t.dtype == DType::kF32) return reinterpret_cast<const float*>(p);
  ConvertRowToFloat(t.dtype, p, stage, n);
  return stage;
}

float* OutputFloats(const Tensor& t, int64_t offset, float* stage) {
  if (t.dtype == DType::kF32) return reinterpret_cast<float*>(ElementAddress(t, offset));
  return stage;
}

void StoreFloats(const float* results, const Tensor& t, int64_t offset, int64_t n) {
  if (t.dtype == DType::kF32) return;  // results already are the tensor's memory
  ConvertRowFromFloat(results, t.dtype, ElementAddress(t, offset), n);
}

void AccumulateFloats(const float* add, const Tensor& t, int64_t offset, int64_t n) {
  assert(n <= kStageElems);
  float stage[kStageElems];
  const float* old = LoadFloats(t, offset, n, stage);
  float* out = OutputFloats(t, offset, stage);
  for (int64_t j = 0; j < n; ++j) out[j] = old[j] + add[j];
  StoreFloats(out, t, offset, n);
}

float RowMoment(const Tensor& x, int64_t row, int64_t c, float shift, int power) {
  float stage[kStageElems];
  float acc[8] = {};
  float tail = 0;
  for (int64_t j0 = 0; j0 < c; j0 += kStageElems) {
    const int64_t len = std::min(kStageElems, c - j0);
    const float* v = LoadFloats(x, row * c + j0, len, stage);
    int64_t j = 0;
    if (power == 1) {
      for (; j + 8 <= len; j += 8) {
        for (int k = 0; k < 8; ++k) acc[k] += v[j + k] - shift;
      }
      for (; j < len; ++j) tail += v[j] - shift;
    } else {
      for (; j + 8 <= len; j += 8) {
        for (int k = 0; k < 8; ++k) acc[k] += (v[j + k] - shift) * (v[j + k] - shift);
      }
      for (; j < len; ++j) tail += (v[j] - shift) * (v[j] - shift);
    }
  }
  for (float a : acc) tail += a;
  return tail;
}

Status Cast(ThreadPool& pool, const CastArgs& a) {
  const int64_t n = a.src.numel();
  if (a.src.dtype == a.dst.dtype) {
    if (a.src.data == a.dst.data) return Status::Ok();
    const int64_t size = int64_t(DTypeSize(a.src.dtype));
    pool.ParallelFor(n, 1 << 16, [&](int64_t begin, int64_t end, int) {
      std::memcpy(ElementAddress(a.dst, begin), ElementAddress(a.src, begin),
                  size_t((end - begin) * size));
    });
    return Status::Ok();
  }
  ParallelPieces(pool, n, [&](int64_t i, int64_t len) {
    float stage[kStageElems];
    const float* x = LoadFloats(a.src, i, len, stage);
    ConvertRowFromFloat(x, a.dst.dtype, ElementAddress(a.dst, i), len);
  });
  return Status::Ok();
}

}  // namespace ferry::cpu
