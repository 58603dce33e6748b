#include "engine/text/text_pipeline.h"

#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/utypes.h>

#include "engine/text/utf8_text.h"

namespace ferry {

using json = nlohmann::json;

namespace {

// GPT-2's pattern, used by the ByteLevel pre-tokenizer with use_regex.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A literal string or a regex, as tokenizer.json writes patterns ({"String": ..} / {"Regex": ..}).
struct Pattern {
  std::string literal;
  std::optional<PcreRegex> regex;

  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const {
    if (regex) return regex->FindAll(text);
    std::vector<std::pair<size_t, size_t>> out;
    if (literal.empty()) return out;
    for (size_t p = text.find(literal); p != std::string_view::npos;
         p = text.find(literal, p + literal.size())) {
      out.emplace_back(p, p + literal.size());
    }
    return out;
  }
};

Result<Pattern> ParsePattern(const json& j, const std::string& where) {
  Pattern p;
  if (j.is_object() && j.contains("String")) {
    p.literal = j.at("String").get<std::string>();
  } else if (j.is_object() && j.contains("Regex")) {
    Result<PcreRegex> r = PcreRegex::Compile(j.at("Regex").get<std::string>());
    if (!r.ok()) return r.status().WithContext(where);
    p.regex.emplace(std::move(r).value());
  } else {
    return Status::InvalidArgument(where + ": expected {\"String\": ...} or {\"Regex\": ...}");
  }
  return p;
}

// Sequences inside Sequences: real files nest one level; a bound keeps recursion shallow.
constexpr int kMaxNesting = 8;

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

struct NormStep {
  enum Kind { kNfc, kPrepend, kReplace } kind;
  std::string text;  // Prepend's prefix, Replace's content
  std::shared_ptr<Pattern> pattern;
};

struct PreStep {
  enum Kind { kByteLevel, kSplit, kMetaspace } kind;
  bool add_prefix_space = false;     // ByteLevel
  std::shared_ptr<Pattern> pattern;  // ByteLevel with use_regex, Split
  SplitBehavior behavior = SplitBehavior::kIsolated;
  std::string replacement;  // Metaspace
  PrependScheme scheme = PrependScheme::kAlways;
  bool split = true;
};

struct DecStep {
  enum Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string text;  // Metaspace's replacement, Replace's content, Strip's character
  std::shared_ptr<Pattern> pattern;
  bool prepend = true;
  int start = 0, stop = 0;
};

}  // namespace

class TextStages {
 public:
  std::vector<NormStep> norm;
  std::vector<PreStep> pre;
  std::vector<DecStep> dec;
  bool has_decoder = false;
  ByteLevelAlphabet alphabet;
  const icu::Normalizer2* nfc = nullptr;  // ICU's singleton: immutable, thread-safe
};

// ---- Piece ------------------------------------------------------------------------------------

Piece Piece::FromInput(std::string_view input, uint32_t begin, uint32_t end) {
  Piece p;
  p.text.reserve(end - begin);
  p.src.reserve(end - begin);
  for (uint32_t i = begin; i < end;) {
    char32_t cp;
    size_t n = Utf8CharAt(input.substr(0, end), i, &cp);
    if (n == 0) {
      p.Append("\xEF\xBF\xBD", {i, i + 1});
      ++i;
      continue;
    }
    for (size_t k = 0; k < n; ++k) {
      p.text.push_back(input[i + k]);
      p.src.emplace_back(i, uint32_t(i + n));
    }
    i += uint32_t(n);
  }
  return p;
}

Piece Piece::Sub(size_t b, size_t e) const {
  Piece p;
  p.text = text.substr(b, e - b);
  p.src.assign(src.begin() + ptrdiff_t(b), src.begin() + ptrdiff_t(e));
  return p;
}

std::pair<uint32_t, uint32_t> Piece::Span(size_t b, size_t e) const {
  uint32_t lo = src[b].first, hi = src[b].second;
  for (size_t i = b; i < e; ++i) {
    lo = std::min(lo, src[i].first);
    hi = std::max(hi, src[i].second);
  }
  return {lo, hi};
}

void Piece::Append(std::string_view s, std::pair<uint32_t, uint32_t> from) {
  text.append(s);
  src.insert(src.end(), s.size(), from);
}

namespace {

// `p` with `prefix` in front, standing for p's first character (Hugging Face's
// NormalizedString::prepend aligns what it adds with the first character: a lone "▁" token then
// covers it, and a completion's first word includes its prefix space in the loss mask).
Piece Prepended(const Piece& p, std::string_view prefix) {
  Piece out;
  out.Append(prefix, p.src.empty() ? std::pair<uint32_t, uint32_t>{0, 0} : p.src[0]);
  out.text += p.text;
  out.src.insert(out.src.end(), p.src.begin(), p.src.end());
  return out;
}

Piece ReplaceAll(const Piece& p, const Pattern& pat, std::string_view content) {
  auto matches = pat.FindAll(p.text);
  if (matches.empty()) return p;
  Piece out;
  size_t last = 0;
  for (auto [b, e] : matches) {
    out.text.append(p.text, last, b - last);
    out.src.insert(out.src.end(), p.src.begin() + ptrdiff_t(last), p.src.begin() + ptrdiff_t(b));
    out.Append(content, p.Span(b, e));
    last = e;
  }
  out.text.append(p.text, last);
  out.src.insert(out.src.end(), p.src.begin() + ptrdiff_t(last), p.src.end());
  return out;
}

// NFC, chunk by chunk between normalization boundaries, so each output byte maps to its chunk.
Piece Nfc(const icu::Normalizer2& nfc, const Piece& p) {
  UErrorCode err = U_ZERO_ERROR;
  if (nfc.isNormalizedUTF8(icu::StringPiece(p.text.data(), int32_t(p.text.size())), err) &&
      U_SUCCESS(err)) {
    return p;
  }
  Piece out;
  size_t chunk = 0;
  auto flush = [&](size_t end) {
    if (end == chunk) return;
    std::string norm;
    icu::StringByteSink<std::string> sink(&norm);
    UErrorCode e = U_ZERO_ERROR;
    nfc.normalizeUTF8(0, icu::StringPiece(p.text.data() + chunk, int32_t(end - chunk)), sink,
                      nullptr, e);
    if (U_FAILURE(e)) norm = p.text.substr(chunk, end - chunk);
    out.Append(norm, p.Span(chunk, end));
    chunk = end;
  };
  for (size_t i = 0; i < p.text.size();) {
    char32_t cp;
    size_t n = Utf8CharAt(p.text, i, &cp);
    if (n == 0) n = 1;
    if (i > 0 && nfc.hasBoundaryBefore(UChar32(cp))) flush(i);
    i += n;
  }
  flush(p.text.size());
  return out;
}

// Splits `p` around the matches of `pat` as tokenizers' SplitDelimiterBehavior does.
void SplitPiece(const Piece& p, const Pattern& pat, SplitBehavior how, std::vector<Piece>* out) {
  auto matches = pat.FindAll(p.text);
  // (begin, end, is_match) runs covering the text.
  std::vector<std::tuple<size_t, size_t, bool>> runs;
  size_t last = 0;
  for (auto [b, e] : matches) {
    if (b > last) runs.emplace_back(last, b, false);
    runs.emplace_back(b, e, true);
    last = e;
  }
  if (last < p.text.size()) runs.emplace_back(last, p.text.size(), false);
  std::vector<std::pair<size_t, size_t>> parts;
  for (size_t i = 0; i < runs.size(); ++i) {
    auto [b, e, m] = runs[i];
    switch (how) {
      case SplitBehavior::kIsolated:
        parts.emplace_back(b, e);
        break;
      case SplitBehavior::kRemoved:
        if (!m) parts.emplace_back(b, e);
        break;
      case SplitBehavior::kMergedWithPrevious:
        if (m && !parts.empty() && parts.back().second == b && !std::get<2>(runs[i - 1])) {
          parts.back().second = e;
        } else {
          parts.emplace_back(b, e);
        }
        break;
      case SplitBehavior::kMergedWithNext:
        if (!m && i > 0 && std::get<2>(runs[i - 1])) {
          parts.back().second = e;
        } else {
          parts.emplace_back(b, e);
        }
        break;
      case SplitBehavior::kContiguous:
        if (m && i > 0 && std::get<2>(runs[i - 1])) {
          parts.back().second = e;
        } else {
          parts.emplace_back(b, e);
        }
        break;
    }
  }
  for (auto [b, e] : parts) {
    if (e > b) out->push_back(p.Sub(b, e));
  }
}

Piece ToByteLevel(const ByteLevelAlphabet& alpha, const Piece& p) {
  Piece out;
  out.text.reserve(p.text.size() * 2);
  out.src.reserve(p.text.size() * 2);
  for (size_t i = 0; i < p.text.size(); ++i) {
    out.Append(alpha.Encode(static_cast<uint8_t>(p.text[i])), p.src[i]);
  }
  return out;
}

void ApplyPreStep(const TextStages& st, const PreStep& s, const Piece& p, std::vector<Piece>* out) {
  switch (s.kind) {
    case PreStep::kByteLevel: {
      Piece q = s.add_prefix_space && p.text.rfind(' ', 0) != 0 ? Prepended(p, " ") : p;
      if (!s.pattern) {
        out->push_back(ToByteLevel(st.alphabet, q));
        return;
      }
      std::vector<Piece> words;
      SplitPiece(q, *s.pattern, SplitBehavior::kIsolated, &words);
      for (const Piece& w : words) out->push_back(ToByteLevel(st.alphabet, w));
      return;
    }
    case PreStep::kSplit:
      SplitPiece(p, *s.pattern, s.behavior, out);
      return;
    case PreStep::kMetaspace: {
      Pattern space{" ", std::nullopt};
      Piece q = ReplaceAll(p, space, s.replacement);
      bool starts = q.text.rfind(s.replacement, 0) == 0;
      bool first = !q.src.empty() && q.src[0].first == 0;
      if (!starts &&
          (s.scheme == PrependScheme::kAlways || (s.scheme == PrependScheme::kFirst && first))) {
        q = Prepended(q, s.replacement);
      }
      if (!s.split) {
        out->push_back(std::move(q));
        return;
      }
      Pattern rep{s.replacement, std::nullopt};
      SplitPiece(q, rep, SplitBehavior::kMergedWithNext, out);
      return;
    }
  }
}

bool GetBool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? def : it->get<bool>();
}

// The "type" member of a component ("" when missing: reported as unsupported type '').
std::string TypeOf(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j.at("type").is_string()) return "";
  return j.at("type").get<std::string>();
}

Status Unsupported(const std::string& what, const std::string& type) {
  return Status::InvalidArgument(what + " type '" + type + "' is not supported");
}

Status ParseNormalizer(const json& j, TextStages* st, int depth = 0) {
  std::string type = TypeOf(j);
  if (type == "Sequence") {
    if (depth >= kMaxNesting)
      return Status::InvalidArgument("normalizer Sequences nest too deeply");
    for (const json& k : j.at("normalizers"))
      FERRY_RETURN_IF_ERROR(ParseNormalizer(k, st, depth + 1));
  } else if (type == "NFC") {
    UErrorCode err = U_ZERO_ERROR;
    st->nfc = icu::Normalizer2::getNFCInstance(err);
    if (U_FAILURE(err) || st->nfc == nullptr) {
      return Status::Unavailable("normalizer NFC: ICU has no NFC data");
    }
    st->norm.push_back({NormStep::kNfc, "", nullptr});
  } else if (type == "Prepend") {
    st->norm.push_back({NormStep::kPrepend, j.at("prepend").get<std::string>(), nullptr});
  } else if (type == "Replace") {
    FERRY_ASSIGN_OR_RETURN(Pattern p, ParsePattern(j.at("pattern"), "normalizer Replace pattern"));
    st->norm.push_back({NormStep::kReplace, j.at("content").get<std::string>(),
                        std::make_shared<Pattern>(std::move(p))});
  } else {
    return Unsupported("normalizer", type);
  }
  return Status::Ok();
}

// Metaspace's prepend_scheme, or the older add_prefix_space flag.
Result<PrependScheme> ParsePrependScheme(const json& j, const char* where) {
  std::string scheme = j.contains("prepend_scheme") ? j.at("prepend_scheme").get<std::string>()
                       : GetBool(j, "add_prefix_space", true) ? "always"
                                                              : "never";
  if (scheme == "always") return PrependScheme::kAlways;
  if (scheme == "first") return PrependScheme::kFirst;
  if (scheme == "never") return PrependScheme::kNever;
  return Status::InvalidArgument(std::string(where) + " Metaspace prepend_scheme '" + scheme +
                                 "' is not supported");
}

Status ParsePreTokenizer(const json& j, TextStages* st, int depth = 0) {
  std::string type = TypeOf(j);
  PreStep s{};
  if (type == "Sequence") {
    if (depth >= kMaxNesting)
      return Status::InvalidArgument("pre_tokenizer Sequences nest too deeply");
    for (const json& k : j.at("pretokenizers"))
      FERRY_RETURN_IF_ERROR(ParsePreTokenizer(k, st, depth + 1));
    return Status::Ok();
  } else if (type == "ByteLevel") {
    s.kind = PreStep::kByteLevel;
    s.add_prefix_space = GetBool(j, "add_prefix_space", true);
    if (GetBool(j, "use_regex", true)) {
      FERRY_ASSIGN_OR_RETURN(Pattern p, ParsePattern(json{{"Regex", kGpt2Pattern}}, "ByteLevel"));
      s.pattern = std::make_shared<Pattern>(std::move(p));
    }
  } else if (type == "Split") {
    s.kind = PreStep::kSplit;
    FERRY_ASSIGN_OR_RETURN(Pattern p, ParsePattern(j.at("pattern"), "pre_tokenizer Split pattern"));
    s.pattern = std::make_shared<Pattern>(std::move(p));
    if (GetBool(j, "invert", false)) {
      return Status::InvalidArgument("pre_tokenizer Split with invert=true is not supported");
    }
    std::string b = j.at("behavior").get<std::string>();
    if (b == "Isolated")
      s.behavior = SplitBehavior::kIsolated;
    else if (b == "Removed")
      s.behavior = SplitBehavior::kRemoved;
    else if (b == "MergedWithPrevious")
      s.behavior = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext")
      s.behavior = SplitBehavior::kMergedWithNext;
    else if (b == "Contiguous")
      s.behavior = SplitBehavior::kContiguous;
    else
      return Status::InvalidArgument("pre_tokenizer Split behavior '" + b + "' is not supported");
  } else if (type == "Metaspace") {
    s.kind = PreStep::kMetaspace;
    s.replacement = j.at("replacement").get<std::string>();
    s.split = GetBool(j, "split", true);
    FERRY_ASSIGN_OR_RETURN(s.scheme, ParsePrependScheme(j, "pre_tokenizer"));
  } else {
    return Unsupported("pre_tokenizer", type);
  }
  st->pre.push_back(std::move(s));
  return Status::Ok();
}

Status ParseDecoder(const json& j, TextStages* st, int depth = 0) {
  std::string type = TypeOf(j);
  DecStep s{};
  if (type == "Sequence") {
    if (depth >= kMaxNesting) return Status::InvalidArgument("decoder Sequences nest too deeply");
    for (const json& k : j.at("decoders")) FERRY_RETURN_IF_ERROR(ParseDecoder(k, st, depth + 1));
    return Status::Ok();
  } else if (type == "ByteLevel") {
    s.kind = DecStep::kByteLevel;
  } else if (type == "Metaspace") {
    s.kind = DecStep::kMetaspace;
    s.text = j.at("replacement").get<std::string>();
    FERRY_ASSIGN_OR_RETURN(PrependScheme scheme, ParsePrependScheme(j, "decoder"));
    s.prepend = scheme != PrependScheme::kNever;
  } else if (type == "Replace") {
    s.kind = DecStep::kReplace;
    FERRY_ASSIGN_OR_RETURN(Pattern p, ParsePattern(j.at("pattern"), "decoder Replace pattern"));
    s.pattern = std::make_shared<Pattern>(std::move(p));
    s.text = j.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    s.kind = DecStep::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = DecStep::kFuse;
  } else if (type == "Strip") {
    s.kind = DecStep::kStrip;
    s.text = j.at("content").get<std::string>();
    s.start = JsonInt32(j.at("start"));
    s.stop = JsonInt32(j.at("stop"));
  } else {
    return Unsupported("decoder", type);
  }
  st->dec.push_back(std::move(s));
  return Status::Ok();
}

std::vector<std::string> ApplyDecStep(const TextStages& st, const DecStep& s,
                                      std::vector<std::string> tokens) {
  switch (s.kind) {
    case DecStep::kByteLevel: {
      std::string bytes;
      for (const std::string& t : tokens) {
        std::string mine;
        bool all = true;
        for (size_t i = 0; i < t.size() && all;) {
          char32_t cp;
          size_t n = Utf8CharAt(t, i, &cp);
          int b = n == 0 ? -1 : st.alphabet.Decode(cp);
          if (b < 0)
            all = false;
          else
            mine.push_back(static_cast<char>(b));
          i += n == 0 ? 1 : n;
        }
        bytes += all ? mine : t;
      }
      return {Utf8Lossy(bytes)};
    }
    case DecStep::kMetaspace: {
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string out;
        std::string_view t = tokens[i];
        for (size_t p = 0; p < t.size();) {
          if (t.substr(p).starts_with(s.text)) {
            if (!(i == 0 && s.prepend)) out.push_back(' ');
            p += s.text.size();
          } else {
            out.push_back(t[p++]);
          }
        }
        tokens[i] = std::move(out);
      }
      return tokens;
    }
    case DecStep::kReplace:
      for (std::string& t : tokens)
        t = ReplaceAll(Piece::FromInput(t, 0, uint32_t(t.size())), *s.pattern, s.text).text;
      return tokens;
    case DecStep::kByteFallback: {
      std::vector<std::string> out;
      std::string pending;
      auto flush = [&] {
        if (pending.empty()) return;
        char32_t cp;
        bool valid = true;
        for (size_t i = 0; i < pending.size() && valid;) {
          size_t n = Utf8CharAt(pending, i, &cp);
          valid = n > 0;
          i += n;
        }
        if (valid) {
          out.push_back(pending);
        } else {
          for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");
        }
        pending.clear();
      };
      for (std::string& t : tokens) {
        auto hex = [](char c) {
          return c >= '0' && c <= '9'   ? c - '0'
                 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                 : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : -1;
        };
        if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex(t[3]) >= 0 &&
            hex(t[4]) >= 0) {
          pending.push_back(static_cast<char>(hex(t[3]) * 16 + hex(t[4])));
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      return out;
    }
    case DecStep::kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      return {all};
    }
    case DecStep::kStrip:
      for (std::string& t : tokens) {
        std::string_view v = t;
        for (int k = 0; k < s.start && v.starts_with(s.text); ++k) v.remove_prefix(s.text.size());
        for (int k = 0; k < s.stop && v.ends_with(s.text); ++k) v.remove_suffix(s.text.size());
        t = std::string(v);
      }
      return tokens;
  }
  return tokens;
}

}  // namespace

int32_t JsonInt32(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() <= uint64_t(INT32_MAX)) return int32_t(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x >= INT32_MIN && x <= INT32_MAX) return int32_t(x);
  }
  throw nlohmann::json::type_error::create(302, "expected a 32-bit integer, not " + v.dump(), &v);
}

Result<std::shared_ptr<const TextStages>> ParseTextStages(const json& normalizer,
                                                          const json& pre_tokenizer,
                                                          const json& decoder) {
  auto st = std::make_shared<TextStages>();
  if (!normalizer.is_null()) FERRY_RETURN_IF_ERROR(ParseNormalizer(normalizer, st.get()));
  if (!pre_tokenizer.is_null()) FERRY_RETURN_IF_ERROR(ParsePreTokenizer(pre_tokenizer, st.get()));
  if (!decoder.is_null()) {
    FERRY_RETURN_IF_ERROR(ParseDecoder(decoder, st.get()));
    st->has_decoder = true;
  }
  return std::shared_ptr<const TextStages>(std::move(st));
}

Piece Normalize(const TextStages& st, Piece p) {
  for (const NormStep& s : st.norm) {
    switch (s.kind) {
      case NormStep::kNfc:
        p = Nfc(*st.nfc, p);
        break;
      case NormStep::kPrepend:
        if (!p.text.empty()) p = Prepended(p, s.text);
        break;
      case NormStep::kReplace:
        p = ReplaceAll(p, *s.pattern, s.text);
        break;
    }
  }
  return p;
}

std::vector<Piece> PreTokenize(const TextStages& st, Piece piece) {
  std::vector<Piece> cur;
  if (piece.text.empty()) return cur;
  cur.push_back(std::move(piece));
  for (const PreStep& s : st.pre) {
    std::vector<Piece> next;
    for (const Piece& p : cur) ApplyPreStep(st, s, p, &next);
    cur = std::move(next);
  }
  return cur;
}

std::string DecodeTokens(const TextStages& st, std::vector<std::string> tokens) {
  if (!st.has_decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const DecStep& s : st.dec) tokens = ApplyDecStep(st, s, std::move(tokens));
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace ferry
