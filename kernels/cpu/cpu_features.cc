#include "kernels/cpu/cpu_features.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace ferry::cpu {

#if defined(__x86_64__) || defined(__i386__)
namespace {

struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Regs Cpuid(uint32_t leaf, uint32_t subleaf) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) return Regs{};
  return r;
}

// XCR0: which register states the OS saves on a context switch (0 when XGETBV is not enabled).
uint64_t Xcr0(bool osxsave) {
  if (!osxsave) return 0;
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

bool Bit(uint32_t reg, int bit) { return (reg >> bit) & 1u; }

}  // namespace

CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
  const Regs r0 = Cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor + 0, &r0.b, 4);
  std::memcpy(vendor + 4, &r0.d, 4);
  std::memcpy(vendor + 8, &r0.c, 4);
  f.vendor = vendor;
  const uint32_t max_leaf = r0.a;
  const Regs r1 = Cpuid(1, 0);
  f.sse3 = Bit(r1.c, 0);
  f.ssse3 = Bit(r1.c, 9);
  f.sse41 = Bit(r1.c, 19);
  f.sse42 = Bit(r1.c, 20);
  const uint64_t xcr0 = Xcr0(Bit(r1.c, 27));
  const bool ymm = (xcr0 & 0x6) == 0x6;            // SSE + AVX state
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;   // opmask + ZMM_Hi256 + Hi16_ZMM
  const bool tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  f.avx = ymm && Bit(r1.c, 28);
  f.fma = f.avx && Bit(r1.c, 12);
  f.f16c = f.avx && Bit(r1.c, 29);
  if (max_leaf >= 7) {
    const Regs r7 = Cpuid(7, 0);
    f.avx2 = f.avx && Bit(r7.b, 5);
    f.avx512f = zmm && Bit(r7.b, 16);
    f.avx512dq = zmm && Bit(r7.b, 17);
    f.avx512cd = zmm && Bit(r7.b, 28);
    f.avx512bw = zmm && Bit(r7.b, 30);
    f.avx512vl = zmm && Bit(r7.b, 31);
    f.amx_bf16 = tiles && Bit(r7.d, 22);
    f.amx_tile = tiles && Bit(r7.d, 24);
    if (r7.a >= 1) f.avx512_bf16 = zmm && Bit(Cpuid(7, 1).a, 5);
  }
  return f;
}
#else
CpuFeatures DetectCpuFeatures() { return CpuFeatures{}; }
#endif

std::string CpuIsaName(const CpuFeatures& f) {
  if (f.avx512_core() && f.amx_tile && f.amx_bf16) return "amx_bf16";
  if (f.avx512_core() && f.avx512_bf16) return "avx512_bf16";
  if (f.avx512_core()) return "avx512";
  if (f.avx2 && f.fma) return "avx2";
  if (f.avx) return "avx";
  if (f.sse42) return "sse4_2";
  if (f.ssse3) return "ssse3";
  if (f.sse3) return "sse3";
  return "x86-64";
}

}  // namespace ferry::cpu
