// AdamW rate on a large tensor, next to the machine's own memory bandwidth measured in the same
// run with the same thread count, by two vectorized streams (this file is compiled at -O3 so both
// are; at -O2 GCC 12 leaves such loops scalar, and a scalar triad read half the bandwidth):
//  - a STREAM triad (a[i] = b[i] + s * c[i]), 12 bytes per element;
//  - AdamW's own stream: the same four reads and three writes over arrays of the same size (p, g,
//    m, v -> p, m, v) with one add or multiply each, 28 bytes per element: the ceiling the
//    update is judged against (on machines where more streams in flight draw more bandwidth, the
//    triad is no ceiling for a seven-stream kernel: it read below AdamW here).
//
// Bytes counted per parameter, STREAM's way (no write-allocate traffic): AdamW reads p, g, m, v
// and writes p, m, v (28 bytes), + 2 with the bf16 copy; the global-norm sum of squares reads 4.
// Each figure is the best of --reps passes, and the passes are interleaved (triad, stream, AdamW,
// AdamW + bf16 copy, sum of squares, then again).
//
// Usage: adamw_bench [--n PARAMS] [--threads T] [--reps R] [--level generic|avx2|avx512]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

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

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t(64) << 20;
  int threads = 2;
  int reps = 5;
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
  std::printf("adamw_bench: %lld params, %d threads, best of %d, level %s\n", (long long)n, threads,
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
  double t_stream = 1e30, t_triad = 1e30, t_adamw = 1e30, t_adamw_bf16 = 1e30, t_norm = 1e30, sum = 0;
  auto time = [](double& best, auto&& f) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  };
  for (int r = 0; r < reps; ++r) {
    time(t_triad, [&] {  // the memory ceiling: STREAM triad
      pool.ParallelFor(n, 1 << 16, [&](int64_t lo, int64_t hi, int) {
        float* __restrict ar = a;  // no aliasing: lets the compiler vectorize
        const float* __restrict br = b;
        const float* __restrict cr = c;
        const float s = 3.0f;
        for (int64_t i = lo; i < hi; ++i) ar[i] = br[i] + s * cr[i];
      });
    });
    time(t_stream, [&] {  // AdamW's stream: 4 reads, 3 writes, no arithmetic to speak of
      pool.ParallelFor(n, 1 << 16, [&](int64_t lo, int64_t hi, int) {
        float* __restrict pr = p;
        const float* __restrict gr = g;
        float* __restrict mr = m;
        float* __restrict vr = v;
        for (int64_t i = lo; i < hi; ++i) {
          const float gi = gr[i];
          pr[i] = pr[i] - 1e-7f * gi;
          mr[i] = mr[i] + gi;
          vr[i] = vr[i] * gi;
        }
      });
    });
    for (int with_bf16 = 0; with_bf16 < 2; ++with_bf16) {
      const ferry::cpu::AdamWHostTensor ht{p, g, ferry::DType::kF32, m, v, with_bf16 ? pb : nullptr,
                                           n};
      time(with_bf16 ? t_adamw_bf16 : t_adamw, [&] {
        if (!kernel.Update(h, ht, &pool).ok()) {
          std::fprintf(stderr, "adamw_bench: AdamW update failed\n");
          std::exit(1);
        }
      });
      ++h.step;
    }
    time(t_norm, [&] { sum = kernel.SumOfSquares(g, ferry::DType::kF32, n, &pool); });
  }
  const double N = double(n), triad = 12.0 * N / t_triad, stream = 28.0 * N / t_stream;
  std::printf("triad           %8.2f GB/s  (a = b + s*c, 12 B/element)\n", triad / gb);
  std::printf("adamw stream    %8.2f GB/s  (4 reads + 3 writes, 28 B/element: the ceiling)\n",
              stream / gb);
  for (int with_bf16 = 0; with_bf16 < 2; ++with_bf16) {
    const double bytes = (with_bf16 ? 30.0 : 28.0) * N, t = with_bf16 ? t_adamw_bf16 : t_adamw;
    std::printf(
        "adamw%-10s %8.2f GB/s  (%2.0f B/param, %.3f Gparam/s)  %3.0f%% of the stream, %3.0f%% "
        "of triad\n",
        with_bf16 ? "+bf16 copy" : "", bytes / t / gb, bytes / N, N / t / gb,
        100.0 * bytes / t / stream, 100.0 * bytes / t / triad);
  }
  std::printf("sum of squares  %8.2f GB/s  (4 B/element, %.3f Gelem/s)  %3.0f%% of triad\n",
              4.0 * N / t_norm / gb, N / t_norm / gb, 100.0 * 4.0 * N / t_norm / triad);
  std::printf("checks: a[7]=%g p[7]=%g p_bf16[7]=%g sum=%g\n", a[7], p[7],
              ferry::BF16ToFloat(pb[7]), sum);
  for (void* x : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c),
                  static_cast<void*>(p), static_cast<void*>(g), static_cast<void*>(m),
                  static_cast<void*>(v), static_cast<void*>(pb)}) {
    std::free(x);
  }
  return 0;
}
