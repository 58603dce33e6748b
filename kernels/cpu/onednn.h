// OneDnn: the CPU's bf16 GEMM — bf16 inputs, fp32 accumulation, C in f32 or bf16, the GPU's
// numerics class — through Debian's oneDNN (libdnnl.so.2), opened with dlopen on CPUs whose flags
// (kernels/cpu/cpu_features.h) include AVX512-BF16 or AMX-BF16. There oneDNN runs its own
// bf16 kernels (`brg:avx512_core_amx_bf16` on AMX, `brg:avx512_core_bf16` on AVX512-BF16),
// several times the fp32 rate; elsewhere bf16 operands are converted to fp32 panels for OpenBLAS
// (kernels/cpu/gemm.h), which is exact for the stored values.
//
// Numerics: the products of bf16 values are exact in fp32; they are summed in fp32 in oneDNN's
// order (not the fp32 path's), and C is rounded to its dtype once (round to nearest even). AMX
// (and oneDNN's bf16 kernels generally) flush bf16 denormals to zero, as GPUs' tensor cores do:
// an input below 2^-126 in magnitude counts as 0.
//
// Threads: Debian's oneDNN is built on OpenMP. Every call first sets the calling thread's
// OpenMP team size to one (omp_set_num_threads(1): a per-thread setting), so oneDNN runs inline on
// that thread, one call per worker of the device's own ThreadPool, and never starts a second,
// process-wide pool. A user's DNNL_MAX_CPU_ISA (oneDNN's own variable) caps its kernels and is
// honoured; a cap below bf16 kernels, or a library that offers only its reference implementation,
// turns the path off (Describe says why).
//
// Scratch: the caller's. Primitives are made in oneDNN's user scratchpad mode and get the call's
// `scratch` (a worker's slice of the GEMM's planned scratch), so the scratchpad is the plan's
// memory (the library-managed one was malloc'd at every call and kept megabytes in the worker
// threads' heaps; oneDNN still allocates its descriptors and handles per call, and with a
// transposed B a working buffer of 0.2-0.4 MB, freed after it). A product whose scratchpad (with
// a bf16 C, an fp32 buffer of C) is larger runs in blocks of C that fit: the longer side halved,
// to multiples of 32 (K is never split). oneDNN's K blocking follows the block's shape, so a
// block's sums may be taken in another order than the whole product's (C differs by rounding; the
// split is a function of the shape and the scratch, so the same call gives the same bits). Where no
// block fits (neither side can be halved to 32 or more: a tiny product whose padded operand copies
// exceed its tiny scratch, or copies that grow with K), the product runs on oneDNN's own
// scratchpad.
//
// Ownership and thread-safety: loaded once per process, like the library itself (OneDnn::Load,
// thread-safe, idempotent); immutable afterwards, every member callable from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/dtype.h"
#include "kernels/status.h"

namespace ferry::cpu {

// One row-major product C = alpha op(A) op(B) (+ bias) + beta C for oneDNN: A and B bf16 (A is
// (m, k), or (k, m) when trans_a; B is (k, n), or (n, k) when trans_b), C f32 or bf16, bias (n)
// f32 or bf16 or absent. Pointers are to the block's first element; ld* are leading dimensions.
struct Bf16GemmCall {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  DType c_dtype = DType::kF32;
  const void* bias = nullptr;  // null: none
  DType bias_dtype = DType::kF32;
  void* scratch = nullptr;  // oneDNN's scratchpad: this thread's alone while the call runs
  size_t scratch_bytes = 0;
};

struct OneDnnApi;  // the C API's entry points (onednn.cc)

class OneDnn {
 public:
  // Loads the library once; later calls return the same instance or the same error.
  // Errors: Unavailable naming why the bf16 path is off (no AVX512-BF16/AMX-BF16 in the CPU's
  // flags, the library missing, or oneDNN capped below its bf16 kernels).
  static const Result<const OneDnn*>& Load();

  // Whether Run takes a product with these dtypes and scalars: C f32 or bf16, bias f32, bf16 or
  // absent, k > 0, and alpha == 1 whenever there is a bias (oneDNN scales the bias with alpha).
  static bool Takes(DType c, bool has_bias, DType bias, float alpha, int64_t k);

  // REQUIRES: Takes(...) for the call's dtypes; m, n, k > 0. Runs on the calling thread, in
  // blocks when oneDNN's scratchpad for the whole product exceeds call.scratch_bytes.
  // Errors: Internal naming the oneDNN call and its status.
  Status Run(const Bf16GemmCall& call) const;

  // The library's own words: "oneDNN 2.6.3, brg:avx512_core_amx_bf16 (max ISA avx512_core_amx)".
  const std::string& Describe() const { return describe_; }

 private:
  OneDnn() = default;
  friend struct OneDnnLoader;
  const OneDnnApi* api_ = nullptr;
  void* engine_ = nullptr;  // dnnl_engine_t, lives as long as the process
  std::string describe_;
};

// "bf16 GEMM: oneDNN ..." when the bf16 path is on, else "bf16 GEMM: fp32 OpenBLAS on converted
// panels (<why the oneDNN path is off>)". One line for ferry's reports.
std::string Bf16GemmPathDescription();

}  // namespace ferry::cpu
