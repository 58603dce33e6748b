#include "engine/text/utf8_text.h"

namespace ferry {

size_t Utf8CharAt(std::string_view text, size_t i, char32_t* cp) {
  auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  uint8_t b0 = byte(i);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  char32_t c = b0 & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    c = (c << 6) | (byte(i + k) & 0x3F);
  }
  *cp = c;
  return len;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsUnicodeWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    char32_t cp;
    size_t n = Utf8CharAt(bytes, i, &cp);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    // The maximal prefix of a valid sequence counts as one error; otherwise one byte does.
    uint8_t b0 = static_cast<uint8_t>(bytes[i]);
    size_t len = b0 >= 0xC2 && b0 <= 0xDF   ? 2
                 : b0 >= 0xE0 && b0 <= 0xEF ? 3
                 : b0 >= 0xF0 && b0 <= 0xF4 ? 4
                                            : 1;
    size_t k = 1;
    if (len > 1 && i + 1 < bytes.size()) {
      uint8_t b1 = static_cast<uint8_t>(bytes[i + 1]);
      uint8_t lo = b0 == 0xE0 ? 0xA0 : b0 == 0xF0 ? 0x90 : 0x80;
      uint8_t hi = b0 == 0xED ? 0x9F : b0 == 0xF4 ? 0x8F : 0xBF;
      if (b1 >= lo && b1 <= hi) {
        k = 2;
        while (k < len && i + k < bytes.size() &&
               (static_cast<uint8_t>(bytes[i + k]) & 0xC0) == 0x80) {
          ++k;
        }
      }
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  bytes_.fill(-1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    char32_t cp = printable ? char32_t(b) : char32_t(next++);
    chars_[b].clear();
    AppendUtf8(cp, &chars_[b]);
    bytes_[cp] = static_cast<int16_t>(b);
  }
}

}  // namespace ferry
