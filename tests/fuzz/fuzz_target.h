// What every fuzz target in tests/fuzz/ is built from: one macro that defines libFuzzer's entry
// point and hands the input to the target's body as text, and a check that stops the run (a
// crash libFuzzer saves) when a parser broke one of its own promises.
//
// A target is one file, <name>_fuzz.cc:
//
//   #include "engine/model/model_config.h"
//   #include "tests/fuzz/fuzz_target.h"
//
//   FERRY_FUZZ_TARGET(text) {
//     (void)ferry::ParseHfConfig(text);  // an error is fine; a crash, leak, UB or hang is not
//   }
//
// Adding one: write that file; add the parser's .cc files (and any .cc they call) to
// FERRY_FUZZ_PARSER_SOURCES in tests/fuzz/CMakeLists.txt (a link error names what is missing); put
// a few small valid and invalid inputs in tests/fuzz/corpus/<name>/ and, for a text format, its
// tokens in tests/fuzz/dicts/<name>.dict. scripts/fuzz.sh finds the target by itself.
//
// Fuzz targets are test code: they run only in the fuzz build (FERRY_FUZZ=ON, scripts/fuzz.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>

namespace ferry::fuzz {

// The input as bytes (for binary formats) — the same memory as the text.
inline std::span<const std::byte> Bytes(std::string_view text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

[[noreturn]] inline void CheckFailed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", file, line, cond);
  std::abort();
}

}  // namespace ferry::fuzz

// A property the parser promises on every input it accepts; abort()s (libFuzzer saves the input)
// when it does not hold. Active whatever NDEBUG says.
#define FERRY_FUZZ_CHECK(cond) \
  ((cond) ? (void)0 : ::ferry::fuzz::CheckFailed(#cond, __FILE__, __LINE__))

// Defines LLVMFuzzerTestOneInput; the body that follows sees the input as std::string_view `text`.
#define FERRY_FUZZ_TARGET(text)                                                \
  static void FerryFuzzOne(std::string_view text);                             \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {    \
    FerryFuzzOne(std::string_view(reinterpret_cast<const char*>(data), size)); \
    return 0;                                                                  \
  }                                                                            \
  static void FerryFuzzOne(std::string_view text)
