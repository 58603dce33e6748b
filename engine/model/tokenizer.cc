#include "engine/model/tokenizer.h"

#include "engine/model/byte_tokenizer.h"

namespace ferry {
namespace {

class ByteLevelTokenizer final : public Tokenizer {
 public:
  Encoding EncodeWithOffsets(std::string_view text, bool add_special_tokens) const override {
    Encoding e;
    if (add_special_tokens) {
      e.ids.push_back(ByteTokenizer::kBos);
      e.offsets.emplace_back(0, 0);
    }
    for (uint32_t i = 0; i < text.size(); ++i) {
      e.ids.push_back(int32_t(static_cast<unsigned char>(text[i])));
      e.offsets.emplace_back(i, i + 1);
    }
    return e;
  }
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id >= 0 && id < kByteVocabBytes) {
        out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
      } else if (!skip_special_tokens && id == ByteTokenizer::kBos) {
        out += "<bos>";
      } else if (!skip_special_tokens && id == ByteTokenizer::kEos) {
        out += "<eos>";
      } else if (!skip_special_tokens && id == ByteTokenizer::kPad) {
        out += "<pad>";
      } else if (id < 0 || id >= ByteTokenizer::kVocabSize) {
        out += "\xEF\xBF\xBD";  // U+FFFD
      }
    }
    return out;
  }
  int64_t vocab_size() const override { return ByteTokenizer::kVocabSize; }
  std::optional<int32_t> TokenId(std::string_view token) const override {
    if (token == "<bos>") return ByteTokenizer::kBos;
    if (token == "<eos>") return ByteTokenizer::kEos;
    if (token == "<pad>") return ByteTokenizer::kPad;
    if (token.size() == 1) return int32_t(static_cast<unsigned char>(token[0]));
    return std::nullopt;
  }
  SpecialTokenIds special_ids() const override {
    return {.bos = ByteTokenizer::kBos, .eos = ByteTokenizer::kEos, .pad = ByteTokenizer::kPad};
  }
  std::string Describe() const override { return "byte-level, 260 tokens"; }
};

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteLevelTokenizer>(); }

// Placeholder until tokenizer.json support lands (the tokenizer work replaces this definition).
Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir) {
  return Status::Unavailable("reading " + dir + "/tokenizer.json is not supported yet");
}

}  // namespace ferry
