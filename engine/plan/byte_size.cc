#include "engine/plan/byte_size.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

namespace ferry::plan {
namespace {

struct Unit {
  std::string_view name;  // lower case
  long double scale;
};

constexpr std::array<Unit, 14> kUnits = {{
    {"", 1.0L},
    {"b", 1.0L},
    {"k", 1024.0L},
    {"kb", 1e3L},
    {"kib", 1024.0L},
    {"m", 1048576.0L},
    {"mb", 1e6L},
    {"mib", 1048576.0L},
    {"g", 1073741824.0L},
    {"gb", 1e9L},
    {"gib", 1073741824.0L},
    {"t", 1099511627776.0L},
    {"tb", 1e12L},
    {"tib", 1099511627776.0L},
}};

Status BadSize(std::string_view text, std::string_view why) {
  return Status::InvalidArgument("byte size '" + std::string(text) + "': " + std::string(why) +
                                 "; write a number with an optional unit, e.g. 4096, 500GB, "
                                 "24GiB, 1.5TiB (KB/MB/GB/TB = powers of 1000, KiB/MiB/GiB/TiB "
                                 "and K/M/G/T = powers of 1024)");
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t number_begin = i;
  bool seen_digit = false;
  bool seen_dot = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
  }
  if (!seen_digit) {
    if (i < text.size() && text[i] == '-') return BadSize(text, "a size cannot be negative");
    return BadSize(text, "no number found");
  }
  const std::string number(text.substr(number_begin, i - number_begin));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])); ++i) {
    unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(text[i]))));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return BadSize(text, "unexpected text after the unit");
  long double scale = 0;
  for (const Unit& u : kUnits) {
    if (u.name == unit) scale = u.scale;
  }
  if (scale == 0) return BadSize(text, "unknown unit");
  const long double value = std::strtold(number.c_str(), nullptr) * scale;
  const long double rounded = std::nearbyint(value);
  if (!(rounded < 18446744073709551616.0L)) return BadSize(text, "larger than 2^64 - 1 bytes");
  return static_cast<uint64_t>(rounded);
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr std::array<const char*, 7> kNames = {"B",   "KiB", "MiB", "GiB",
                                                        "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  long double v = static_cast<long double>(bytes);
  size_t unit = 0;
  while (v >= 1024.0L && unit + 1 < kNames.size()) {
    v /= 1024.0L;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2Lf %s", v, kNames[unit]);
  return buf;
}

}  // namespace ferry::plan
