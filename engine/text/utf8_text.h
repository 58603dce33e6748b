// UTF-8 helpers for the tokenizers: decoding one character, Unicode White_Space, Rust's
// from_utf8_lossy (what Hugging Face `tokenizers` does to decoded bytes) and GPT-2's byte <->
// printable-character table. Pure functions; thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry {

// Length in bytes of the valid UTF-8 character at text[i] and its code point in *cp; 0 when the
// bytes there are not a valid character. REQUIRES: i < text.size().
size_t Utf8CharAt(std::string_view text, size_t i, char32_t* cp);
void AppendUtf8(char32_t cp, std::string* out);
// Unicode White_Space (Rust's char::is_whitespace).
bool IsUnicodeWhitespace(char32_t cp);
// `bytes` with every maximal invalid subsequence replaced by U+FFFD, as Rust's from_utf8_lossy.
std::string Utf8Lossy(std::string_view bytes);

// GPT-2's byte-level alphabet: every byte value as a printable character ("Ġ" for a space).
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();
  // The UTF-8 of the character that stands for byte `b`.
  const std::string& Encode(uint8_t b) const { return chars_[b]; }
  // The byte a code point stands for, or -1 when it is not in the alphabet.
  int Decode(char32_t cp) const { return cp < 324 ? bytes_[cp] : -1; }

 private:
  std::array<std::string, 256> chars_;
  std::array<int16_t, 324> bytes_;
};

}  // namespace ferry
