#include "offload/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ferry {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

// a * b modulo the polynomial, in the reflected bit order (zlib's multmodp).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 n) modulo the polynomial: the operator that appends n zero bytes to a CRC register.
uint32_t ZeroBytesOperator(size_t n) {
  uint32_t x2k = 1u << 23;  // x^8, then squared: x^(8 * 2^k)
  uint32_t p = 1u << 31;    // x^0
  for (; n != 0; n >>= 1) {
    if (n & 1) p = MultModP(x2k, p);
    x2k = MultModP(x2k, x2k);
  }
  return p;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(const unsigned char* p, size_t n,
                                                        uint32_t crc) {
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = uint32_t(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

// Three interleaved streams hide the crc32 instruction's latency (about three times the rate of
// one chain); the streams' CRCs are then joined with the zero-bytes operator:
// crc(A || B) = crc(A) * x^(8 |B|) ^ crc(B), for CRCs started from 0.
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42x3(const unsigned char* p, size_t n,
                                                          uint32_t crc) {
  const size_t lane = n / 24 * 8;  // bytes per stream, a multiple of 8
  if (lane < 512) return Crc32cSse42(p, n, crc);
  uint64_t a = uint32_t(~crc), b = 0xFFFFFFFFu, c = 0xFFFFFFFFu;
  for (size_t i = 0; i < lane; i += 8) {
    uint64_t va, vb, vc;
    std::memcpy(&va, p + i, 8);
    std::memcpy(&vb, p + lane + i, 8);
    std::memcpy(&vc, p + 2 * lane + i, 8);
    a = _mm_crc32_u64(a, va);
    b = _mm_crc32_u64(b, vb);
    c = _mm_crc32_u64(c, vc);
  }
  const uint32_t shift = ZeroBytesOperator(lane);
  uint32_t joined = MultModP(shift, ~uint32_t(a)) ^ ~uint32_t(b);
  joined = MultModP(shift, joined) ^ ~uint32_t(c);
  return Crc32cSse42(p + 3 * lane, n - 3 * lane, joined);
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");  // immutable after first use
  return has;
}
#endif

}  // namespace

uint32_t Crc32cPortable(std::span<const std::byte> data, uint32_t crc) {
  uint32_t c = ~crc;
  for (std::byte b : data) c = kTable[(c ^ uint32_t(b)) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32c(std::span<const std::byte> data, uint32_t crc) {
#if defined(__x86_64__)
  if (HasSse42()) {
    return Crc32cSse42x3(reinterpret_cast<const unsigned char*>(data.data()), data.size(), crc);
  }
#endif
  return Crc32cPortable(data, crc);
}

}  // namespace ferry
