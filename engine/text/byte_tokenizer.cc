#include "engine/text/byte_tokenizer.h"

namespace ferry {

std::vector<int32_t> ByteTokenizer::Encode(std::string_view text) {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char ch : text) ids.push_back(int32_t(static_cast<unsigned char>(ch)));
  return ids;
}

std::string ByteTokenizer::Decode(const std::vector<int32_t>& ids) {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < kByteVocabBytes) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (id < 0 || id >= kVocabSize) {
      out += "\xEF\xBF\xBD";  // U+FFFD replacement character
    }                         // special tokens: skipped
  }
  return out;
}

}  // namespace ferry
