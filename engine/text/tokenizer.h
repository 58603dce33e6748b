// Tokenizer: text <-> token ids, the interface the data pipeline, `ferry tokenize`, `ferry
// generate` and `ferry eval` program against. Implementations: the built-in byte-level tokenizer
// (MakeByteTokenizer, for the tiny preset) and a model folder's tokenizer.json (LoadTokenizer).
//
// Semantics follow Hugging Face `tokenizers`, the reference they are tested against:
//  - Encode recognizes added tokens written in the text (e.g. "<|im_start|>") as
//    tokenizer.encode does, so chat templates can be rendered as text and encoded;
//  - add_special_tokens applies the post-processor's BOS/EOS rules (HF's default for encode);
//  - Decode with skip_special_tokens drops tokens flagged special.
//
// Implementations are immutable after loading; every method is const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/status.h"

namespace ferry {

// Token ids with the byte range [begin, end) of the input text each one covers. A token the
// post-processor adds (BOS/EOS) covers the empty range at its position.
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<std::pair<uint32_t, uint32_t>> offsets;  // one per id
};

struct SpecialTokenIds {
  std::optional<int32_t> bos;  // beginning of sequence, when the model has one
  std::optional<int32_t> eos;  // end of sequence / end of turn that stops generation
  std::optional<int32_t> pad;  // padding, when defined
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual Encoding EncodeWithOffsets(std::string_view text, bool add_special_tokens) const = 0;
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const {
    return EncodeWithOffsets(text, add_special_tokens).ids;
  }
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // Ids are in [0, vocab_size()), added tokens included.
  virtual int64_t vocab_size() const = 0;
  // The id of a token written as in the vocabulary or as an added token ("<|im_end|>");
  // nullopt when there is none.
  virtual std::optional<int32_t> TokenId(std::string_view token) const = 0;
  virtual SpecialTokenIds special_ids() const = 0;
  // A short description for logs: "byte-level BPE, 50257 tokens".
  virtual std::string Describe() const = 0;
};

// The built-in model's tokenizer (byte_tokenizer.h): one id per byte, <bos> <eos> <pad>.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

// The tokenizer of a Hugging Face model folder: `dir`/tokenizer.json (with tokenizer_config.json
// and config.json for the BOS/EOS/PAD ids when present). Errors name the file and the problem.
Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir);

}  // namespace ferry
