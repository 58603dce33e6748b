// Built with -ffp-contract=off (kernels/CMakeLists.txt): the compiler must not fuse the multiply
// and add that torch rounds separately; the one fma of the formula is explicit.
#include "kernels/cpu/adamw.h"

#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/backend_access.h"
#include "kernels/ref/adamw.h"

namespace ferry::cpu {

// ---- generic baseline: one float per "vector" --------------------------------------------------
namespace generic {
using Vf = float;
constexpr int64_t kLanes = 1;
inline Vf Set1(float x) { return x; }
inline Vf LoadF(const float* p) { return *p; }
inline void StoreF(float* p, Vf x) { *p = x; }
inline Vf LoadBF16(const bf16* p) { return BF16ToFloat(*p); }
inline void StoreBF16(bf16* p, Vf x) { *p = FloatToBF16(x); }
inline Vf Add(Vf a, Vf b) { return a + b; }
inline Vf Sub(Vf a, Vf b) { return a - b; }
inline Vf Mul(Vf a, Vf b) { return a * b; }
inline Vf Div(Vf a, Vf b) { return a / b; }
inline Vf Sqrt(Vf a) { return std::sqrt(a); }
inline Vf Fma(Vf a, Vf b, Vf c) { return std::fma(a, b, c); }
using Vd = double;
inline Vd ZeroD() { return 0.0; }
inline void AccumulateSquares(Vf x, Vd& lo, Vd& /*hi*/) { lo += double(x) * double(x); }
inline double SumD(Vd a) { return a; }
#include "kernels/cpu/adamw_simd.inc"
}  // namespace generic

#if defined(__x86_64__)
// ---- AVX2 + FMA -------------------------------------------------------------------------------
// Each ISA block is compiled for its target by a pragma: clang's attribute push (it ignores GCC's
// target pragmas) or GCC's push_options.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace avx2 {
using Vf = __m256;
constexpr int64_t kLanes = 8;
inline Vf Set1(float x) { return _mm256_set1_ps(x); }
inline Vf LoadF(const float* p) { return _mm256_loadu_ps(p); }
inline void StoreF(float* p, Vf x) { _mm256_storeu_ps(p, x); }
inline Vf LoadBF16(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline void StoreBF16(bf16* p, Vf x) {  // FloatToBF16, lane-wise
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Pack 8 x u32 (< 2^16) to 8 x u16: packus works per 128-bit lane, then gather qwords 0 and 2.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
inline Vf Add(Vf a, Vf b) { return _mm256_add_ps(a, b); }
inline Vf Sub(Vf a, Vf b) { return _mm256_sub_ps(a, b); }
inline Vf Mul(Vf a, Vf b) { return _mm256_mul_ps(a, b); }
inline Vf Div(Vf a, Vf b) { return _mm256_div_ps(a, b); }
inline Vf Sqrt(Vf a) { return _mm256_sqrt_ps(a); }
inline Vf Fma(Vf a, Vf b, Vf c) { return _mm256_fmadd_ps(a, b, c); }
using Vd = __m256d;
inline Vd ZeroD() { return _mm256_setzero_pd(); }
inline void AccumulateSquares(Vf x, Vd& lo, Vd& hi) {
  const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  lo = _mm256_fmadd_pd(a, a, lo);
  hi = _mm256_fmadd_pd(b, b, hi);
}
inline double SumD(Vd a) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
#include "kernels/cpu/adamw_simd.inc"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// ---- AVX-512F ---------------------------------------------------------------------------------
// GCC 12's AVX-512 headers seed results with _mm512_undefined_*(), which its own flow analysis
// then reports as uninitialized (GCC bug 105593, fixed in 13); the warning is off for this block.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif
namespace avx512 {
using Vf = __m512;
constexpr int64_t kLanes = 16;
inline Vf Set1(float x) { return _mm512_set1_ps(x); }
inline Vf LoadF(const float* p) { return _mm512_loadu_ps(p); }
inline void StoreF(float* p, Vf x) { _mm512_storeu_ps(p, x); }
inline Vf LoadBF16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void StoreBF16(bf16* p, Vf x) {  // FloatToBF16, lane-wise
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __m512i r = _mm512_mask_blend_epi32(nan, rounded, quiet);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline Vf Add(Vf a, Vf b) { return _mm512_add_ps(a, b); }
inline Vf Sub(Vf a, Vf b) { return _mm512_sub_ps(a, b); }
inline Vf Mul(Vf a, Vf b) { return _mm512_mul_ps(a, b); }
inline Vf Div(Vf a, Vf b) { return _mm512_div_ps(a, b); }
inline Vf Sqrt(Vf a) { return _mm512_sqrt_ps(a); }
inline Vf Fma(Vf a, Vf b, Vf c) { return _mm512_fmadd_ps(a, b, c); }
using Vd = __m512d;
inline Vd ZeroD() { return _mm512_setzero_pd(); }
inline void AccumulateSquares(Vf x, Vd& lo, Vd& hi) {
  const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  // Upper half without _mm512_extract* (GCC 12 warns on their undefined-vector operand).
  const __m512d b = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_shuffle_f32x4(x, x, 0xee)));
  lo = _mm512_fmadd_pd(a, a, lo);
  hi = _mm512_fmadd_pd(b, b, hi);
}
inline double SumD(Vd a) {
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, a);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}
#include "kernels/cpu/adamw_simd.inc"
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#pragma GCC diagnostic pop
#endif
#endif  // __x86_64__

// ---- dispatch -----------------------------------------------------------------------------------

using UpdateFn = void (*)(const ref::AdamWScalars<float>&, float*, const void*, float*, float*,
                          bf16*, int64_t);
using SumOfSquaresFn = double (*)(const void*, int64_t);

struct AdamWIsa {
  UpdateFn update_f32;
  UpdateFn update_bf16;
  SumOfSquaresFn sum_sq_f32;
  SumOfSquaresFn sum_sq_bf16;
};

namespace {

constexpr AdamWIsa kGenericIsa{generic::AdamWUpdateF32, generic::AdamWUpdateBF16,
                               generic::SumOfSquaresF32, generic::SumOfSquaresBF16};
#if defined(__x86_64__)
constexpr AdamWIsa kAvx2Isa{avx2::AdamWUpdateF32, avx2::AdamWUpdateBF16, avx2::SumOfSquaresF32,
                            avx2::SumOfSquaresBF16};
constexpr AdamWIsa kAvx512Isa{avx512::AdamWUpdateF32, avx512::AdamWUpdateBF16,
                              avx512::SumOfSquaresF32, avx512::SumOfSquaresBF16};
#endif

const AdamWIsa* IsaFor(SimdLevel level) {
  switch (level) {
    case SimdLevel::kGeneric:
      return &kGenericIsa;
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return &kAvx2Isa;
    case SimdLevel::kAvx512:
      return &kAvx512Isa;
#else
    default:
      break;
#endif
  }
  return &kGenericIsa;
}

// Elements per parallel chunk: 32K floats = 128 KiB per array, large enough that scheduling is
// noise, small enough that 2-16 threads get balanced work on tensors of a few MiB.
constexpr int64_t kUpdateGrain = int64_t(1) << 15;
// Fixed summation blocks of SumOfSquares (the result must not depend on the pool).
constexpr int64_t kSumBlock = int64_t(1) << 15;

void RunOver(ThreadPool* pool, int64_t n, int64_t grain,
             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (pool == nullptr) {
    if (n > 0) fn(0, n, 0);
    return;
  }
  pool->ParallelFor(n, grain, fn);
}

}  // namespace

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kGeneric:
      return "generic";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

bool SimdLevelSupported(SimdLevel level) {
  switch (level) {
    case SimdLevel::kGeneric:
      return true;
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SimdLevel::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma");
#else
    default:
      return false;
#endif
  }
  return false;
}

SimdLevel BestSimdLevel() {
  if (SimdLevelSupported(SimdLevel::kAvx512)) return SimdLevel::kAvx512;
  if (SimdLevelSupported(SimdLevel::kAvx2)) return SimdLevel::kAvx2;
  return SimdLevel::kGeneric;
}

AdamWKernel::AdamWKernel(SimdLevel level) : level_(level), isa_(IsaFor(level)) {
  assert(SimdLevelSupported(level));
}

Status AdamWKernel::Update(const AdamWHyperparameters& h, const AdamWHostTensor& t,
                           ThreadPool* pool) const {
  FERRY_RETURN_IF_ERROR(ValidateAdamWHyperparameters(h));
  if (t.n < 0) return Status::InvalidArgument("AdamW: negative element count");
  if (t.n > 0 && (t.p == nullptr || t.g == nullptr || t.m == nullptr || t.v == nullptr)) {
    return Status::InvalidArgument("AdamW: p, g, m and v must all be given");
  }
  UpdateFn fn;
  switch (t.g_dtype) {
    case DType::kF32:
      fn = isa_->update_f32;
      break;
    case DType::kBF16:
      fn = isa_->update_bf16;
      break;
    default:
      return Status::InvalidArgument("AdamW: gradient dtype " + std::string(DTypeName(t.g_dtype)) +
                                     " is not supported; use f32 or bf16");
  }
  const ref::AdamWScalars<float> s = ref::MakeAdamWScalars<float>(h);
  const size_t gsize = DTypeSize(t.g_dtype);
  RunOver(pool, t.n, kUpdateGrain, [&](int64_t b, int64_t e, int) {
    fn(s, t.p + b, static_cast<const std::byte*>(t.g) + size_t(b) * gsize, t.m + b, t.v + b,
       t.p_bf16 == nullptr ? nullptr : t.p_bf16 + b, e - b);
  });
  return Status::Ok();
}

double AdamWKernel::SumOfSquares(const void* g, DType g_dtype, int64_t n, ThreadPool* pool) const {
  assert(g_dtype == DType::kF32 || g_dtype == DType::kBF16);
  const SumOfSquaresFn fn = g_dtype == DType::kF32 ? isa_->sum_sq_f32 : isa_->sum_sq_bf16;
  const size_t gsize = DTypeSize(g_dtype);
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> partial(size_t(std::max<int64_t>(blocks, 0)), 0.0);
  RunOver(pool, blocks, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t begin = k * kSumBlock;
      partial[size_t(k)] = fn(static_cast<const std::byte*>(g) + size_t(begin) * gsize,
                              std::min(n - begin, kSumBlock));
    }
  });
  double sum = 0;
  for (double x : partial) sum += x;
  return sum;
}

Status AdamWStep(ThreadPool& pool, const AdamWArgs& a) {
  AdamWHostTensor t;
  t.p = BackendAccess::Data<float>(a.p);
  t.g = a.g.data.is_null() ? nullptr : BackendAccess::Raw(a.g.data);
  t.g_dtype = a.g.dtype;
  t.m = BackendAccess::Data<float>(a.m);
  t.v = BackendAccess::Data<float>(a.v);
  t.p_bf16 = a.p_bf16.data.is_null() ? nullptr : BackendAccess::Data<bf16>(a.p_bf16);
  t.n = a.p.numel();
  return AdamWKernel(BestSimdLevel()).Update(a.hyper, t, &pool);
}

}  // namespace ferry::cpu
