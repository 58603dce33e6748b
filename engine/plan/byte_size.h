// Byte sizes as people write them ("24GiB", "500GB", "1.5TiB", "4096") and as ferry prints them.
//
// Units: B; KB/MB/GB/TB = 10^3..10^12 (SI, as drive makers count); KiB/MiB/GiB/TiB = 2^10..2^40;
// the single letters K/M/G/T mean the binary units (as `free -g` and most tools do). Unit letters
// are case-insensitive ("gib" = "GiB"); a space between number and unit is allowed. Fractions are
// allowed ("1.5TiB") and rounded to the nearest byte.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/status.h"

namespace ferry::plan {

// Parses `text` into bytes. InvalidArgument names the text and the accepted forms when it is
// empty, negative, not a number, has an unknown unit, or exceeds 2^64 - 1 bytes.
[[nodiscard]] Result<uint64_t> ParseByteSize(std::string_view text);

// "0 B", "512 B", "1.50 KiB", "23.99 GiB", "1.00 TiB": binary units, two decimals above 1 KiB.
std::string FormatByteSize(uint64_t bytes);

}  // namespace ferry::plan
