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
    return Crc32cSse42(reinterpret_cast<const unsigned char*>(data.data()), data.size(), crc);
  }
#endif
  return Crc32cPortable(data, crc);
}

}  // namespace ferry
