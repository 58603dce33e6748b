// The text stages of a tokenizer.json around its BPE model, as Hugging Face `tokenizers` runs
// them: normalizers (NFC, Prepend, Replace, Sequence), pre-tokenizers (ByteLevel, Split, Metaspace,
// Sequence) and decoders (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence).
// Text travels as Pieces that remember, byte by byte, which bytes of the original input they came
// from, so every token gets its byte range in the input.
//
// Stages are immutable after parsing; applying them is const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/json.h"
#include "engine/text/pcre_regex.h"
#include "engine/text/utf8_text.h"
#include "kernels/status.h"

namespace ferry {

// Text plus, for each of its bytes, the [begin, end) range of input bytes it stands for.
struct Piece {
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> src;  // one per byte of text

  // `input[begin, end)` as valid UTF-8 (an invalid byte becomes U+FFFD, mapped to that byte).
  static Piece FromInput(std::string_view input, uint32_t begin, uint32_t end);
  Piece Sub(size_t b, size_t e) const;
  // The input range covered by text bytes [b, e) (e > b).
  std::pair<uint32_t, uint32_t> Span(size_t b, size_t e) const;
  void Append(std::string_view s, std::pair<uint32_t, uint32_t> from);
};

class TextStages;  // opaque holder of the parsed stages

// A tokenizer.json integer (a token id, a Strip count) as int32_t. nlohmann's get<int32_t>()
// converts a float such as 1e75 with undefined behaviour; anything but an integer in int32_t's
// range throws nlohmann's type_error, which ParseTokenizerJson reports as the file's error.
int32_t JsonInt32(const nlohmann::json& v);

// Parses the "normalizer", "pre_tokenizer" and "decoder" members (each null or an object).
// Errors name the member path and the unsupported type.
Result<std::shared_ptr<const TextStages>> ParseTextStages(const nlohmann::json& normalizer,
                                                          const nlohmann::json& pre_tokenizer,
                                                          const nlohmann::json& decoder);

Piece Normalize(const TextStages& stages, Piece piece);
// Splits one normalized piece into words for the model (empty words dropped).
std::vector<Piece> PreTokenize(const TextStages& stages, Piece piece);
// Joins token strings into text (the decoder chain; without a decoder, joined with spaces).
std::string DecodeTokens(const TextStages& stages, std::vector<std::string> tokens);

}  // namespace ferry
