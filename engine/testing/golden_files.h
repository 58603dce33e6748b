// Test helper: where the PyTorch goldens live (tests/goldens/, written by scripts/make_goldens.py;
// the layout is described at the top of that script).
//
// The source tree is found through $FERRY_SOURCE_DIR (ctest sets it) or, when a test binary is
// run by hand, through the path compiled into engine_tests.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "engine/json.h"
#include "offload/file_io.h"

namespace ferry::testing {

inline std::string SourceDir() {
  if (const char* env = std::getenv("FERRY_SOURCE_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
#ifdef FERRY_SOURCE_DIR_DEFAULT
  return FERRY_SOURCE_DIR_DEFAULT;
#else
  return ".";
#endif
}

// "<source>/tests/goldens/<model>/<file>", e.g. GoldenPath("llama", "grads.safetensors").
inline std::string GoldenPath(std::string_view model, std::string_view file) {
  return SourceDir() + "/tests/goldens/" + std::string(model) + "/" + std::string(file);
}

// The whole text of a file ("" when it cannot be read: the caller's parse then fails loudly).
inline std::string ReadTextFile(const std::string& path) {
  Result<std::string> text = ReadWholeFile(path);
  return text.ok() ? std::move(*text) : std::string();
}

// The golden.json sidecar of a model (discarded JSON when missing or malformed).
inline nlohmann::json GoldenJson(std::string_view model) {
  return nlohmann::json::parse(ReadTextFile(GoldenPath(model, "golden.json")), nullptr, false);
}

}  // namespace ferry::testing
