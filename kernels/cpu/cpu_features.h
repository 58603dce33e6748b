// CpuFeatures: what the host's x86-64 CPU and operating system let ferry's CPU kernels use, read
// from CPUID (and XGETBV for the register state the OS saves), never from the model name: VMs mask
// model names, and a new generation is unknown to every table of names.
//
// The CPU GEMM's library is loaded with a kernel set chosen from these flags (kernels/cpu/blas.h),
// and ferry's reports name the ISA level they allow (CpuIsaName).
// Thread-safety: DetectCpuFeatures is a pure function of the host; call it from any thread.
#pragma once

#include <string>

namespace ferry::cpu {

struct CpuFeatures {
  std::string vendor;  // CPUID leaf 0: "GenuineIntel", "AuthenticAMD", ...
  bool sse3 = false, ssse3 = false, sse41 = false, sse42 = false;
  bool avx = false, avx2 = false, fma = false, f16c = false;  // AVX: with the OS's YMM state
  bool avx512f = false, avx512cd = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_bf16 = false;                 // AVX-512: with the OS's ZMM/opmask state
  bool amx_tile = false, amx_bf16 = false;  // AMX: with the OS's tile state (XCR0 bits 17-18)

  // AVX-512 F + CD + BW + DQ + VL, the Skylake-SP baseline that AVX-512 GEMM kernels assume.
  bool avx512_core() const { return avx512f && avx512cd && avx512bw && avx512dq && avx512vl; }
};

// Reads the host's CPUID. On a CPU that is not x86-64, every flag is false.
CpuFeatures DetectCpuFeatures();

// The highest ISA level the flags allow, in /proc/cpuinfo's words: "amx_bf16", "avx512_bf16",
// "avx512" (avx512_core), "avx2" (with fma), "avx", "sse4_2", "ssse3", "sse3" or "x86-64".
std::string CpuIsaName(const CpuFeatures& f);

}  // namespace ferry::cpu
