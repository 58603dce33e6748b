// ByteTokenizer: the built-in model's tokenizer. Every byte of UTF-8 text is one token (id = the
// byte value, 0..255), followed by the special tokens <bos> = 256, <eos> = 257, <pad> = 258; the
// vocabulary is 260 ids, one spare (the built-in model's kTinyVocabSize). Lossless:
// Decode(Encode(s)) == s for any bytes.
//
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// Ids 0..255 are the bytes; the special tokens come after them.
inline constexpr int64_t kByteVocabBytes = 256;

class ByteTokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kPad = 258;
  static constexpr int64_t kVocabSize = 260;  // 256 bytes + <bos> <eos> <pad> + one spare

  // The bytes of `text` as ids (no special tokens added).
  static std::vector<int32_t> Encode(std::string_view text);
  // Ids back to bytes; special tokens are skipped, ids outside the vocabulary become U+FFFD.
  static std::string Decode(const std::vector<int32_t>& ids);
};

static_assert(ByteTokenizer::kPad < ByteTokenizer::kVocabSize);

}  // namespace ferry
