// CpuBlas: the BLAS that CPU kernels call — Debian's pthread OpenBLAS (DYNAMIC_ARCH), loaded
// with dlopen so that its kernel set is chosen before it initializes, from the CPU's feature
// flags (kernels/cpu/cpu_features.h), never from its table of model names. OpenBLAS 0.3.21 does
// not recognise some CPUs (an Intel Xeon with AVX-512 and AMX reports "Prescott" and runs SSE3
// kernels at a sixth of the speed), so ferry sets OPENBLAS_CORETYPE for the load itself:
//
//   avx512_core + avx512_bf16 -> Cooperlake    avx512_core -> SkylakeX
//   avx2 + fma -> Zen (AMD) or Haswell         avx -> Sandybridge
//   sse4_2 -> Nehalem    ssse3 -> Core2        otherwise Prescott
//
// A user's own OPENBLAS_CORETYPE is honoured as it is. OPENBLAS_NUM_THREADS is 1 for the load (no
// library thread pool is started) and openblas_set_num_threads(1) holds it there: every call runs
// on the calling thread only, one call per pool worker (the pthread build is safe to call
// concurrently; Debian's serial build is not: CpuGemm.ConcurrentBlasCallsAreSafe). The
// environment is restored after the load, so child processes see the user's.
//
// Ownership and thread-safety: the library is process-wide state of its own, so CpuBlas is loaded
// once per process (CpuBlas::Load, thread-safe, idempotent) and is immutable afterwards; every
// member may be called from any thread. CpuDevice::Create loads it before its threads start.
#pragma once

#include <string>

#include "kernels/status.h"

namespace ferry::cpu {

class CpuBlas {
 public:
  // Loads the library once; later calls return the same instance or the same error. Errors:
  // Unavailable naming the library path and dlopen's reason, or a missing symbol.
  static const Result<const CpuBlas*>& Load();

  // Row-major C = alpha op(A) op(B) + beta C through the library's cblas_sgemm (A is (m, k), or
  // (k, m) when trans_a; B is (k, n), or (n, k) when trans_b).
  void Sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
             const float* b, int ldb, float beta, float* c, int ldc) const {
    sgemm_(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k, alpha, a,
           lda, b, ldb, beta, c, ldc);
  }

  const std::string& library_path() const { return path_; }
  // The library's own words: openblas_get_corename() ("Zen", "Cooperlake", ...) and
  // openblas_get_config() ("OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64").
  const std::string& core_name() const { return core_; }
  const std::string& config() const { return config_; }
  // How the core was chosen: "chosen from CPU flags (avx2)" or "OPENBLAS_CORETYPE=X from the
  // environment".
  const std::string& core_source() const { return source_; }
  // One line for reports: "OpenBLAS 0.3.21, core Zen (chosen from CPU flags: avx2); host ISA
  // avx2".
  std::string Describe() const;

 private:
  // cblas_sgemm's C ABI; its enums are ints (CblasRowMajor 101, CblasNoTrans 111, CblasTrans 112).
  using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                           int, float, float*, int);
  static constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
  CpuBlas() = default;
  friend struct CpuBlasLoader;
  std::string path_, core_, config_, source_, host_isa_;
  SgemmFn sgemm_ = nullptr;
};

// The loaded library. REQUIRES: nothing, but a process whose library cannot load stops here with
// CpuBlas::Load's message; code that must return that error calls CpuBlas::Load first
// (CpuDevice::Create does).
const CpuBlas& Blas();

// The OPENBLAS_CORETYPE ferry chooses for a CPU with these flags (the table above).
struct CpuFeatures;
std::string OpenBlasCoreFor(const CpuFeatures& f);

}  // namespace ferry::cpu
