// CRC-32C (Castagnoli), the checksum the NVMe store keeps per block.
//
// Uses the SSE4.2 crc32 instruction when the CPU has it (about 8 bytes per cycle-latency chain,
// several GB/s) and a byte-wise table otherwise; both give identical results. The standard check
// value holds: Crc32c("123456789") == 0xE3069283.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry {

// Extends `crc` (0 for a fresh checksum) over `data`.
uint32_t Crc32c(std::span<const std::byte> data, uint32_t crc = 0);

// The portable table implementation, exposed so tests can compare it with the hardware path.
uint32_t Crc32cPortable(std::span<const std::byte> data, uint32_t crc = 0);

}  // namespace ferry
