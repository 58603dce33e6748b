// AdamW rate on a large tensor, next to the machine's own memory bandwidth measured in the same
// run with the same thread count:
//  - a STREAM triad (a[i] = b[i] + s * c[i]), 12 bytes per element, built for the host's best ISA
//    like the AdamW kernel it bounds (see Triad below), and the same with streaming stores;
//  - AdamW's own stream: the same four reads and three in-place writes over arrays of the same
//    size (p, g, m, v -> p, m, v) with one add or multiply each, 28 bytes per element.
// The ceiling is the best median of the three: a triad's store pays write-allocate traffic that an
// in-place update does not, so on some machines a triad alone reads below AdamW (a ceiling below
// the figure it bounds is no ceiling).
//
// Bytes counted per parameter, STREAM's way (no write-allocate traffic): AdamW reads p, g, m, v
// and writes p, m, v (28 bytes), + 2 with the bf16 copy; the global-norm sum of squares reads 4.
// Every figure is a median with its min and max over --reps passes, interleaved (triad, stream,
// AdamW, AdamW + bf16 copy, sum of squares, then again) so that load from other processes hits
// the ceiling and the kernels alike. This file is compiled at -O3 (GCC 12's -O2 leaves the plain
// loops scalar).
//
// Usage: adamw_bench [--n PARAMS] [--threads T] [--reps R] [--level generic|avx2|avx512]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bench/spread.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
using ferry::bench::Spread;
using ferry::bench::SpreadOf;

// Pages are touched by the pool's threads (first touch), as the trainer's would be.
template <typename T>
T* Alloc(ferry::ThreadPool& pool, int64_t n, T value) {
  T* p = static_cast<T*>(std::aligned_alloc(64, (size_t(n) * sizeof(T) + 63) / 64 * 64));
  if (p == nullptr) {
    std::fprintf(stderr, "adamw_bench: out of memory allocating %lld elements\n", (long long)n);
    std::exit(1);
  }
  pool.ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e, int) { std::fill(p + b, p + e, value); });
  return p;
}

// The ceilings' loops, compiled for each x86 ISA and picked at load time for the host's best
// (GCC's target_clones): on CPUs that elide the read-for-ownership of full-line stores (recent
// Intel server cores with 64-byte AVX-512 stores), a triad built for SSE2 reads half the
// bandwidth of one built for AVX-512, and AdamW's own kernel, which is AVX-512, then ran at 243% of
// such a "ceiling". The ceiling must use what the kernel it bounds may use.
#if defined(__x86_64__) && !defined(__clang__)
#define FERRY_BEST_ISA \
  __attribute__((target_clones("arch=sapphirerapids", "avx512f", "avx2", "default")))
#else
#define FERRY_BEST_ISA
#endif

FERRY_BEST_ISA void Triad(float* __restrict a, const float* __restrict b, const float* __restrict c,
                          int64_t lo, int64_t hi) {
  const float s = 3.0f;
  for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
}

#if defined(__x86_64__)
// The triad with streaming stores (no read-for-ownership: the write-combining buffers fill whole
// lines), STREAM's compiled-by-icc form. REQUIRES: a 16-byte aligned, lo a multiple of 4.
void TriadStreaming(float* a, const float* b, const float* c, int64_t lo, int64_t hi) {
  const __m128 s = _mm_set1_ps(3.0f);
  int64_t i = lo;
  for (; i + 4 <= hi; i += 4) {
    _mm_stream_ps(a + i, _mm_add_ps(_mm_loadu_ps(b + i), _mm_mul_ps(s, _mm_loadu_ps(c + i))));
  }
  for (; i < hi; ++i) a[i] = b[i] + 3.0f * c[i];
  _mm_sfence();
}
#else
void TriadStreaming(float* a, const float* b, const float* c, int64_t lo, int64_t hi) {
  Triad(a, b, c, lo, hi);
}
#endif

// AdamW's stream: 4 reads, 3 writes, one add or multiply each.
FERRY_BEST_ISA void SevenStreams(float* __restrict p, const float* __restrict g,
                                 float* __restrict m, float* __restrict v, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const float gi = g[i];
    p[i] = p[i] - 1e-7f * gi;
    m[i] = m[i] + gi;
    v[i] = v[i] * gi;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t(64) << 20;
  int threads = 2;
  int reps = 7;
  ferry::cpu::SimdLevel level = ferry::cpu::BestSimdLevel();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--n") {
      n = std::atoll(v.c_str());
    } else if (k == "--threads") {
      threads = std::atoi(v.c_str());
    } else if (k == "--reps") {
      reps = std::atoi(v.c_str());
    } else if (k == "--level") {
      bool found = false;
      for (auto l : ferry::cpu::kAllSimdLevels) {
        if (ferry::cpu::SimdLevelName(l) == v) level = l, found = true;
      }
      if (!found || !ferry::cpu::SimdLevelSupported(level)) {
        std::fprintf(stderr, "adamw_bench: level '%s' is unknown or not supported here\n",
                     v.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: adamw_bench [--n N] [--threads T] [--reps R] [--level L]\n");
      return 2;
    }
  }
  if (n < 1 || threads < 1 || reps < 1) {
    std::fprintf(stderr, "adamw_bench: --n, --threads and --reps must be >= 1\n");
    return 2;
  }
  ferry::ThreadPool pool(threads);
  const double gb = 1e9;
  std::printf("adamw_bench: %lld params, %d threads, %d passes, level %s\n", (long long)n, threads,
              reps, std::string(ferry::cpu::SimdLevelName(level)).c_str());

  // All arrays up front; the measurements are interleaved rep by rep so that load from other
  // processes hits the ceiling and the kernels alike.
  float* a = Alloc(pool, n, 0.0f);
  float* b = Alloc(pool, n, 1.0f);
  float* c = Alloc(pool, n, 2.0f);
  float* p = Alloc(pool, n, 0.5f);
  float* g = Alloc(pool, n, 0.01f);
  float* m = Alloc(pool, n, 0.0f);
  float* v = Alloc(pool, n, 0.0f);
  ferry::bf16* pb = Alloc(pool, n, ferry::bf16{0});
  const ferry::cpu::AdamWKernel kernel(level);
  ferry::AdamWHyperparameters h;
  h.weight_decay = 0.1;
  // Seconds of each pass, per measurement.
  std::vector<double> t_triad, t_triad_nt, t_stream, t_adamw[2], t_norm;
  double sum = 0;
  auto time = [](std::vector<double>& runs, auto&& f) {
    const auto t0 = Clock::now();
    f();
    runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  };
  for (int r = 0; r < reps; ++r) {
    time(t_triad, [&] {  // the memory ceiling: STREAM triad
      pool.ParallelFor(n, 1 << 16, [&](int64_t lo, int64_t hi, int) { Triad(a, b, c, lo, hi); });
    });
    time(t_triad_nt, [&] {  // the same with streaming stores (chunks are multiples of 2^16)
      pool.ParallelFor(n, 1 << 16,
                       [&](int64_t lo, int64_t hi, int) { TriadStreaming(a, b, c, lo, hi); });
    });
    time(t_stream, [&] {
      pool.ParallelFor(n, 1 << 16,
                       [&](int64_t lo, int64_t hi, int) { SevenStreams(p, g, m, v, lo, hi); });
    });
    for (int with_bf16 = 0; with_bf16 < 2; ++with_bf16) {
      const ferry::cpu::AdamWHostTensor ht{p, g, ferry::DType::kF32, m, v, with_bf16 ? pb : nullptr,
                                           n};
      time(t_adamw[with_bf16], [&] {
        if (!kernel.Update(h, ht, &pool).ok()) {
          std::fprintf(stderr, "adamw_bench: AdamW update failed\n");
          std::exit(1);
        }
      });
      ++h.step;
    }
    time(t_norm, [&] { sum = kernel.SumOfSquares(g, ferry::DType::kF32, n, &pool); });
  }
  const double N = double(n);
  // GB/s of each pass moving `bytes` per element.
  auto rates = [&](const std::vector<double>& t, double bytes) {
    std::vector<double> r;
    for (double x : t) r.push_back(bytes * N / x / gb);
    return SpreadOf(r);
  };
  const Spread triad = rates(t_triad, 12), triad_nt = rates(t_triad_nt, 12),
               stream = rates(t_stream, 28);
  // The ceiling: the best median of the three memory streams. An in-place update (AdamW's
  // stream, and AdamW) pays no write-allocate traffic, which a triad's store does (STREAM
  // counting leaves it out), so on some machines the triads read below AdamW itself.
  const double ceiling = std::max({triad.median, triad_nt.median, stream.median});
  auto mark = [&](const Spread& x) { return x.median == ceiling ? "  <- the ceiling" : ""; };
  std::printf("GB/s, median (min-max) of %d passes:\n", reps);
  std::printf("triad           %7.2f (%.2f-%.2f)  a = b + s*c, 12 B/element%s\n", triad.median,
              triad.min, triad.max, mark(triad));
  std::printf("triad, nt store %7.2f (%.2f-%.2f)  the same with streaming stores%s\n",
              triad_nt.median, triad_nt.min, triad_nt.max, mark(triad_nt));
  std::printf("adamw stream    %7.2f (%.2f-%.2f)  4 reads + 3 in-place writes, 28 B/element%s\n",
              stream.median, stream.min, stream.max, mark(stream));
  for (int with_bf16 = 0; with_bf16 < 2; ++with_bf16) {
    const double bytes = with_bf16 ? 30.0 : 28.0;
    const Spread r = rates(t_adamw[with_bf16], bytes);
    std::printf(
        "adamw%-10s %7.2f (%.2f-%.2f)  %2.0f B/param, %.3f Gparam/s: %3.0f%% of the ceiling "
        "(%3.0f%% of the better triad)\n",
        with_bf16 ? "+bf16 copy" : "", r.median, r.min, r.max, bytes, r.median / bytes,
        100.0 * r.median / ceiling, 100.0 * r.median / std::max(triad.median, triad_nt.median));
  }
  const Spread norm = rates(t_norm, 4);
  std::printf("sum of squares  %7.2f (%.2f-%.2f)  4 B/element: %3.0f%% of the ceiling\n",
              norm.median, norm.min, norm.max, 100.0 * norm.median / ceiling);
  std::printf("checks: a[7]=%g p[7]=%g p_bf16[7]=%g sum=%g\n", a[7], p[7],
              ferry::BF16ToFloat(pb[7]), sum);
  for (void* x : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c),
                  static_cast<void*>(p), static_cast<void*>(g), static_cast<void*>(m),
                  static_cast<void*>(v), static_cast<void*>(pb)}) {
    std::free(x);
  }
  return 0;
}
