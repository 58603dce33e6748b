#include "engine/text/tokenizer.h"

#include <optional>
#include <utility>

#include "engine/json.h"
#include "engine/text/bpe_tokenizer.h"
#include "engine/text/byte_tokenizer.h"
#include "offload/file_io.h"

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

namespace {

// The text of a file the folder may lack: nullopt when it cannot be read.
std::optional<std::string> ReadOptional(const std::string& path) {
  Result<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return std::nullopt;
  return std::move(*text);
}

// tokenizer_config.json's bos_token / eos_token / pad_token: a string or {"content": ...}.
Status ReadTokenNames(const std::string& path, SpecialTokenChoice* c) {
  std::optional<std::string> text = ReadOptional(path);
  if (!text) return Status::Ok();  // optional file
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object()) return Status::InvalidArgument(path + ": not a JSON object");
  auto name = [&](const char* key, std::optional<std::string>* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::Ok();
    if (it->is_string()) {
      *out = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      *out = (*it)["content"].get<std::string>();
    } else {
      return Status::InvalidArgument(path + ": " + key +
                                     " must be a string or an object with \"content\"");
    }
    return Status::Ok();
  };
  FERRY_RETURN_IF_ERROR(name("bos_token", &c->bos));
  FERRY_RETURN_IF_ERROR(name("eos_token", &c->eos));
  FERRY_RETURN_IF_ERROR(name("pad_token", &c->pad));
  return Status::Ok();
}

// config.json's bos_token_id / eos_token_id (a number or a list: the first) / pad_token_id.
void ReadTokenIds(const std::string& path, SpecialTokenChoice* c) {
  std::optional<std::string> text = ReadOptional(path);
  if (!text) return;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object()) return;  // config.json's own reader reports a broken file
  auto id = [&](const char* key, std::optional<int32_t>* out) {
    auto it = j.find(key);
    if (it == j.end()) return;
    if (it->is_number_integer()) *out = it->get<int32_t>();
    if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
      *out = (*it)[0].get<int32_t>();
    }
  };
  id("bos_token_id", &c->ids.bos);
  id("eos_token_id", &c->ids.eos);
  id("pad_token_id", &c->ids.pad);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  Result<std::string> text = ReadWholeFile(path);
  if (text.status().code() == StatusCode::kNotFound) {
    return Status::NotFound(text.status().message() +
                            " (ferry reads Hugging Face tokenizer.json files only)");
  }
  if (!text.ok()) return text.status();
  SpecialTokenChoice choice;
  ReadTokenIds(dir + "/config.json", &choice);
  FERRY_RETURN_IF_ERROR(ReadTokenNames(dir + "/tokenizer_config.json", &choice));
  return ParseTokenizerJson(*text, path, choice);
}

}  // namespace ferry
