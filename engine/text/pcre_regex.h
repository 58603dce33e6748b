// PcreRegex: a compiled PCRE2 pattern in UTF + UCP mode (Unicode properties such as \p{L}), JIT
// compiled when the library offers it, for the tokenizers' pre-tokenization patterns.
//
// Owns its pcre2_code. Immutable after Compile; FindAll is const and thread-safe (each call makes
// its own match data).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/status.h"

namespace ferry {

class PcreRegex {
 public:
  // An error names the pattern and PCRE2's reason.
  static Result<PcreRegex> Compile(std::string_view pattern);

  PcreRegex(PcreRegex&&) noexcept;
  PcreRegex& operator=(PcreRegex&&) noexcept;
  ~PcreRegex();

  // The byte ranges [begin, end) of the successive non-overlapping matches, left to right, as
  // Rust's find_iter gives them (an empty match advances by one character).
  // REQUIRES: `text` is valid UTF-8.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

 private:
  struct Code;
  explicit PcreRegex(std::unique_ptr<Code> code);
  std::unique_ptr<Code> code_;
};

}  // namespace ferry
