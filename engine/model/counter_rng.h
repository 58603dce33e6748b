// Counter-based random numbers: a value is a pure function of its coordinates (seed, step,
// element, ...), never of hidden generator state, so weight initialization and data order are the
// same whatever order things are visited in, on any device, after recomputation or a resume.
//
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

namespace ferry {

// SplitMix64's finalizer: a bijective, well-mixed 64-bit hash. Chain it to combine coordinates:
// Mix64(Mix64(seed) ^ step).
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a of a string (to key a stream by a parameter's name).
inline uint64_t HashString(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ uint64_t(static_cast<unsigned char>(c))) * 0x100000001b3ull;
  return h;
}

// A double uniform in the open interval (0, 1) from the top 53 bits of `bits`.
inline double UniformOpen01(uint64_t bits) {
  return (double(bits >> 11) + 0.5) / 9007199254740992.0;
}

}  // namespace ferry
