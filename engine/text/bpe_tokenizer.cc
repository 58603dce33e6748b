#include "engine/text/bpe_tokenizer.h"

#include <algorithm>
#include <unordered_map>

#include "engine/json.h"
#include "engine/text/bpe_model.h"
#include "engine/text/pcre_regex.h"
#include "engine/text/text_pipeline.h"
#include "engine/text/utf8_text.h"

namespace ferry {
namespace {

using json = nlohmann::json;

struct AddedToken {
  std::string content;
  std::string as_vocab;  // the token as the vocabulary holds it: normalized if flagged so
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Finds added tokens in text the way tokenizers' AddedVocabulary does: leftmost-longest matches,
// then single_word / lstrip / rstrip applied to each.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // Each token is looked for as `pattern` (its content, normalized for normalized tokens).
  AddedTokenMatcher(std::vector<std::pair<std::string, const AddedToken*>> tokens,
                    const PcreRegex* word_char)
      : word_char_(word_char) {
    std::stable_sort(tokens.begin(), tokens.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    for (auto& [pattern, t] : tokens) {
      if (!pattern.empty()) by_first_[static_cast<uint8_t>(pattern[0])].emplace_back(pattern, t);
    }
    empty_ = tokens.empty();
  }

  struct Split {
    size_t begin, end;
    const AddedToken* token;  // nullptr: plain text
  };

  // Splits text[0, size) into plain runs and added tokens (empty runs omitted).
  std::vector<Split> Find(std::string_view text) const {
    std::vector<Split> out;
    size_t start_offset = 0;
    for (size_t i = 0; !empty_ && i < text.size();) {
      const AddedToken* hit = nullptr;
      size_t len = 0;
      for (const auto& [pattern, t] : by_first_[static_cast<uint8_t>(text[i])]) {
        if (text.substr(i).starts_with(pattern)) {
          hit = t;
          len = pattern.size();
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + len;
      i = stop;
      if (hit->single_word &&
          (EndsWithWord(text.substr(0, start)) || StartsWithWord(text.substr(stop)))) {
        continue;
      }
      // Matching goes on after the token itself, not after its stripped whitespace: a token may
      // start inside the previous one's rstrip (then its range starts where that one ended).
      start = std::max(start, start_offset);
      if (hit->lstrip) {
        size_t s = start;
        while (s > start_offset) {
          size_t b = s - 1;
          while (b > start_offset && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
          char32_t cp;
          if (Utf8CharAt(text, b, &cp) == 0 || !IsUnicodeWhitespace(cp)) break;
          s = b;
        }
        start = s;
      }
      if (hit->rstrip) {
        while (stop < text.size()) {
          char32_t cp;
          size_t n = Utf8CharAt(text, stop, &cp);
          if (n == 0 || !IsUnicodeWhitespace(cp)) break;
          stop += n;
        }
      }
      if (start > start_offset) out.push_back({start_offset, start, nullptr});
      out.push_back({start, stop, hit});
      start_offset = stop;
    }
    if (start_offset < text.size()) out.push_back({start_offset, text.size(), nullptr});
    return out;
  }

 private:
  bool IsWordChar(std::string_view ch) const { return !word_char_->FindAll(ch).empty(); }
  bool EndsWithWord(std::string_view s) const {
    if (s.empty()) return false;
    size_t b = s.size() - 1;
    while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
    return IsWordChar(s.substr(b));
  }
  bool StartsWithWord(std::string_view s) const {
    if (s.empty()) return false;
    char32_t cp;
    size_t n = Utf8CharAt(s, 0, &cp);
    return IsWordChar(s.substr(0, n == 0 ? 1 : n));
  }

  std::vector<std::pair<std::string, const AddedToken*>> by_first_[256];
  const PcreRegex* word_char_ = nullptr;
  bool empty_ = true;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(BpeModel model, std::shared_ptr<const TextStages> stages,
               std::vector<AddedToken> added, std::optional<PcreRegex> word_char)
      : model_(std::move(model)),
        stages_(std::move(stages)),
        added_(std::move(added)),
        word_char_(std::move(word_char)) {
    for (AddedToken& t : added_) {
      t.as_vocab =
          t.normalized
              ? Normalize(*stages_, Piece::FromInput(t.content, 0, uint32_t(t.content.size()))).text
              : t.content;
    }
    std::vector<std::pair<std::string, const AddedToken*>> raw, normalized;
    for (const AddedToken& t : added_) {
      // Tokens flagged normalized are looked for, normalized, in normalized text; the others in
      // the input (as tokenizers' AddedVocabulary does).
      if (t.normalized) {
        normalized.emplace_back(t.as_vocab, &t);
      } else {
        raw.emplace_back(t.content, &t);
      }
      added_by_content_.emplace(t.content, &t);
      added_by_id_.emplace(t.id, &t);
      vocab_size_ = std::max<int64_t>(vocab_size_, int64_t(t.id) + 1);
    }
    vocab_size_ = std::max(vocab_size_, model_.id_limit());
    const PcreRegex* wc = word_char_ ? &*word_char_ : nullptr;
    raw_matcher_ = AddedTokenMatcher(raw, wc);
    normalized_matcher_ = AddedTokenMatcher(normalized, wc);
  }

  std::vector<int32_t> prefix_ids, suffix_ids;  // the post-processor's, set once after creation
  SpecialTokenIds special;
  std::string description;

  Encoding EncodeWithOffsets(std::string_view text, bool add_special_tokens) const override {
    Encoding e;
    if (add_special_tokens) {
      for (int32_t id : prefix_ids) {
        e.ids.push_back(id);
        e.offsets.emplace_back(0, 0);
      }
    }
    for (const auto& s : raw_matcher_.Find(text)) {
      if (s.token != nullptr) {
        e.ids.push_back(s.token->id);
        e.offsets.emplace_back(uint32_t(s.begin), uint32_t(s.end));
        continue;
      }
      Piece p = Normalize(*stages_, Piece::FromInput(text, uint32_t(s.begin), uint32_t(s.end)));
      for (const auto& n : normalized_matcher_.Find(p.text)) {
        if (n.token != nullptr) {
          e.ids.push_back(n.token->id);
          e.offsets.push_back(p.Span(n.begin, n.end));
          continue;
        }
        for (const Piece& w : PreTokenize(*stages_, p.Sub(n.begin, n.end))) {
          std::vector<std::pair<uint32_t, uint32_t>> ranges;
          model_.Tokenize(w.text, &e.ids, &ranges);
          for (size_t k = 0; k < ranges.size(); ++k) {
            e.offsets.push_back(w.Span(ranges[k].first, ranges[k].second));
          }
        }
      }
    }
    if (add_special_tokens) {
      auto end = uint32_t(text.size());
      for (int32_t id : suffix_ids) {
        e.ids.push_back(id);
        e.offsets.emplace_back(end, end);
      }
    }
    return e;
  }

  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
        // As tokenizers does, a normalized added token decodes as its normalized form.
        if (!(skip_special_tokens && it->second->special)) tokens.push_back(it->second->as_vocab);
      } else if (const std::string* t = model_.IdToToken(id)) {
        tokens.push_back(*t);
      }  // ids outside the vocabulary are dropped, as tokenizers does
    }
    return DecodeTokens(*stages_, std::move(tokens));
  }

  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenId(std::string_view token) const override {
    if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) {
      return it->second->id;
    }
    return model_.TokenToId(token);
  }
  SpecialTokenIds special_ids() const override { return special; }
  std::string Describe() const override { return description; }

 private:
  BpeModel model_;
  std::shared_ptr<const TextStages> stages_;
  std::vector<AddedToken> added_;  // never resized after construction (matchers point into it)
  std::optional<PcreRegex> word_char_;
  std::unordered_map<std::string, const AddedToken*> added_by_content_;
  std::unordered_map<int32_t, const AddedToken*> added_by_id_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  int64_t vocab_size_ = 0;
};

bool FlagOr(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? def : it->get<bool>();
}

Result<BpeModelSpec> ParseModel(const json& m) {
  std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") return Status::InvalidArgument("model type '" + type + "' is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m.at(key).is_null() && !m.at(key).get<std::string>().empty()) {
      return Status::InvalidArgument(std::string("model.") + key + " is not supported");
    }
  }
  if (m.contains("dropout") && !m.at("dropout").is_null() && m.at("dropout").get<double>() != 0) {
    return Status::InvalidArgument("model.dropout is not supported (it makes encoding random)");
  }
  BpeModelSpec spec;
  for (const auto& [tok, id] : m.at("vocab").items()) spec.vocab.emplace_back(tok, JsonInt32(id));
  const json& merges = m.at("merges");
  spec.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& mr = merges[r];
    if (mr.is_string()) {
      std::string s = mr.get<std::string>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Status::InvalidArgument("model.merges[" + std::to_string(r) + "] '" + s +
                                       "' is not two tokens separated by one space");
      }
      spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (mr.is_array() && mr.size() == 2) {
      spec.merges.emplace_back(mr[0].get<std::string>(), mr[1].get<std::string>());
    } else {
      return Status::InvalidArgument("model.merges[" + std::to_string(r) +
                                     "] is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  if (m.contains("unk_token") && !m.at("unk_token").is_null()) {
    spec.unk_token = m.at("unk_token").get<std::string>();
  }
  spec.fuse_unk = FlagOr(m, "fuse_unk", false);
  spec.byte_fallback = FlagOr(m, "byte_fallback", false);
  spec.ignore_merges = FlagOr(m, "ignore_merges", false);
  return spec;
}

// The ids the post-processor puts before and after the text of a single sequence.
Status ParsePostProcessor(const json& p, std::vector<int32_t>* prefix, std::vector<int32_t>* suffix,
                          int depth = 0) {
  if (p.is_null()) return Status::Ok();
  std::string type = p.value("type", std::string());
  if (type == "Sequence") {
    if (depth >= 8) return Status::InvalidArgument("post_processor Sequences nest too deeply");
    for (const json& k : p.at("processors")) {
      FERRY_RETURN_IF_ERROR(ParsePostProcessor(k, prefix, suffix, depth + 1));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") return Status::Ok();  // offsets trimming only; ids unchanged
  if (type != "TemplateProcessing") {
    return Status::InvalidArgument("post_processor type '" + type + "' is not supported");
  }
  bool seen_sequence = false;
  for (const json& item : p.at("single")) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    std::string name = item.at("SpecialToken").at("id").get<std::string>();
    const json& st = p.at("special_tokens");
    if (!st.contains(name)) {
      return Status::InvalidArgument("post_processor: special token '" + name +
                                     "' is missing from special_tokens");
    }
    for (const json& id : st.at(name).at("ids")) {
      (seen_sequence ? suffix : prefix)->push_back(JsonInt32(id));
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<Tokenizer>> Parse(std::string_view text, const SpecialTokenChoice& choice) {
  json j = json::parse(text);
  if (!j.is_object()) return Status::InvalidArgument("not a JSON object");
  if (j.contains("truncation") && !j.at("truncation").is_null()) {
    return Status::InvalidArgument("truncation is not supported (set it to null)");
  }
  FERRY_ASSIGN_OR_RETURN(BpeModelSpec spec, ParseModel(j.at("model")));
  bool byte_fallback = spec.byte_fallback;
  FERRY_ASSIGN_OR_RETURN(BpeModel model, BpeModel::Create(std::move(spec)));
  auto member = [&](const char* key) { return j.contains(key) ? j.at(key) : json(); };
  FERRY_ASSIGN_OR_RETURN(
      std::shared_ptr<const TextStages> stages,
      ParseTextStages(member("normalizer"), member("pre_tokenizer"), member("decoder")));
  std::vector<AddedToken> added;
  bool single_word = false;
  if (j.contains("added_tokens") && !j.at("added_tokens").is_null()) {
    for (const json& a : j.at("added_tokens")) {
      AddedToken t;
      t.content = a.at("content").get<std::string>();
      t.id = JsonInt32(a.at("id"));
      if (t.id < 0 || t.id >= kMaxTokenId) {
        return Status::InvalidArgument("added token '" + t.content + "' has id " +
                                       std::to_string(t.id) + ", outside [0, 2^24)");
      }
      t.special = FlagOr(a, "special", false);
      t.lstrip = FlagOr(a, "lstrip", false);
      t.rstrip = FlagOr(a, "rstrip", false);
      t.single_word = FlagOr(a, "single_word", false);
      t.normalized = FlagOr(a, "normalized", !t.special);
      single_word = single_word || t.single_word;
      added.push_back(std::move(t));
    }
  }
  std::optional<PcreRegex> word_char;
  if (single_word) {
    // Rust regex's Unicode \w (what tokenizers tests next to a single_word token): Alphabetic,
    // marks, decimal digits, connector punctuation, joiners.
    FERRY_ASSIGN_OR_RETURN(
        PcreRegex r, PcreRegex::Compile(R"(^[\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])"));
    word_char.emplace(std::move(r));
  }
  std::vector<int32_t> prefix, suffix;
  FERRY_RETURN_IF_ERROR(ParsePostProcessor(member("post_processor"), &prefix, &suffix));
  auto tok = std::make_unique<BpeTokenizer>(std::move(model), std::move(stages), std::move(added),
                                            std::move(word_char));
  std::vector<int32_t> template_ids = prefix;
  template_ids.insert(template_ids.end(), suffix.begin(), suffix.end());
  for (int32_t id : template_ids) {
    if (id < 0 || id >= tok->vocab_size()) {
      return Status::InvalidArgument("post_processor: id " + std::to_string(id) +
                                     " is not in the vocabulary");
    }
  }
  tok->prefix_ids = prefix;
  tok->suffix_ids = suffix;
  SpecialTokenIds ids = choice.ids;
  auto pick = [&](const std::optional<std::string>& name, std::optional<int32_t>* out,
                  const char* what) -> Status {
    if (!name) return Status::Ok();
    *out = tok->TokenId(*name);
    if (!*out) {
      return Status::InvalidArgument("tokenizer_config.json names " + std::string(what) + " '" +
                                     *name + "', which is not in this tokenizer's vocabulary");
    }
    return Status::Ok();
  };
  FERRY_RETURN_IF_ERROR(pick(choice.bos, &ids.bos, "bos_token"));
  FERRY_RETURN_IF_ERROR(pick(choice.eos, &ids.eos, "eos_token"));
  FERRY_RETURN_IF_ERROR(pick(choice.pad, &ids.pad, "pad_token"));
  if (!ids.bos && !prefix.empty()) ids.bos = prefix.front();
  if (!ids.eos && !suffix.empty()) ids.eos = suffix.back();
  tok->special = ids;
  tok->description = std::string(byte_fallback ? "BPE with byte fallback" : "byte-level BPE") +
                     ", " + std::to_string(tok->vocab_size()) + " tokens";
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> ParseTokenizerJson(std::string_view json_text,
                                                      std::string_view what,
                                                      const SpecialTokenChoice& special) {
  try {
    Result<std::unique_ptr<Tokenizer>> r = Parse(json_text, special);
    if (!r.ok()) return r.status().WithContext(what);
    return r;
  } catch (const nlohmann::json::exception& e) {
    // Malformed JSON or a member of the wrong type: nlohmann names the member's problem.
    return Status::InvalidArgument(std::string(what) + ": " + e.what());
  }
}

}  // namespace ferry
