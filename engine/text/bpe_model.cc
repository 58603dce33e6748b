#include "engine/text/bpe_model.h"

#include <cstdio>
#include <queue>

#include "engine/text/utf8_text.h"

namespace ferry {

Result<BpeModel> BpeModel::Create(BpeModelSpec spec) {
  BpeModel m;
  int32_t max_id = -1;
  for (auto& [tok, id] : spec.vocab) {
    if (id < 0 || id >= kMaxTokenId) {
      return Status::InvalidArgument("model.vocab: token '" + tok + "' has id " +
                                     std::to_string(id) + ", outside [0, 2^24)");
    }
    max_id = std::max(max_id, id);
  }
  m.id_to_token_.resize(size_t(max_id + 1));
  m.has_id_.assign(size_t(max_id + 1), false);
  for (auto& [tok, id] : spec.vocab) {
    m.id_to_token_[size_t(id)] = tok;
    m.has_id_[size_t(id)] = true;
    m.vocab_.emplace(std::move(tok), id);
  }
  m.merges_.reserve(spec.merges.size());
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [a, b] = spec.merges[r];
    auto ia = m.TokenToId(a), ib = m.TokenToId(b), ic = m.TokenToId(a + b);
    if (!ia || !ib || !ic) {
      return Status::InvalidArgument("model.merges[" + std::to_string(r) + "] '" + a + " " + b +
                                     "' uses a token missing from the vocab");
    }
    // The first (lowest-ranked) occurrence of a pair wins, as in Hugging Face tokenizers.
    m.merges_.try_emplace(PairKey(*ia, *ib), Merge{int32_t(r), *ic});
  }
  if (spec.unk_token) {
    m.unk_id_ = m.TokenToId(*spec.unk_token);
    if (!m.unk_id_) {
      return Status::InvalidArgument("model.unk_token '" + *spec.unk_token +
                                     "' is not in the vocab");
    }
  }
  m.fuse_unk_ = spec.fuse_unk;
  m.ignore_merges_ = spec.ignore_merges;
  if (spec.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto id = m.TokenToId(name);
      // A vocabulary without all 256 byte tokens falls back per character only when all of a
      // character's bytes exist (as Hugging Face does); -1 marks a missing one.
      m.byte_ids_.push_back(id ? *id : -1);
    }
  }
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size() || !has_id_[size_t(id)]) return nullptr;
  return &id_to_token_[size_t(id)];
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids,
                        std::vector<std::pair<uint32_t, uint32_t>>* ranges) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = TokenToId(word)) {
      ids->push_back(*id);
      ranges->emplace_back(0, uint32_t(word.size()));
      return;
    }
  }
  // Symbols: a doubly linked list over the word's initial pieces.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t begin, end;  // bytes of `word`
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  auto add = [&](int32_t id, uint32_t b, uint32_t e) {
    int32_t n = int32_t(sym.size());
    sym.push_back({id, n - 1, n + 1, b, e});
  };
  std::optional<std::pair<uint32_t, uint32_t>> pending_unk;  // [begin, end) of fused unknowns
  auto flush_unk = [&] {
    if (pending_unk) add(*unk_id_, pending_unk->first, pending_unk->second);
    pending_unk.reset();
  };
  for (size_t i = 0; i < word.size();) {
    char32_t cp;
    size_t n = Utf8CharAt(word, i, &cp);
    if (n == 0) n = 1;  // invalid byte: looked up as itself (never in a vocab), then fallback
    auto b = uint32_t(i), e = uint32_t(i + n);
    i += n;
    if (auto id = TokenToId(word.substr(b, n))) {
      flush_unk();
      add(*id, b, e);
      continue;
    }
    if (!byte_ids_.empty()) {
      bool all = true;
      for (uint32_t k = b; k < e; ++k) all = all && byte_ids_[static_cast<uint8_t>(word[k])] >= 0;
      if (all) {
        flush_unk();
        for (uint32_t k = b; k < e; ++k) add(byte_ids_[static_cast<uint8_t>(word[k])], k, k + 1);
        continue;
      }
    }
    if (!unk_id_) continue;  // no unknown token: the character is dropped, as HF does
    if (pending_unk && fuse_unk_) {
      pending_unk->second = e;
    } else {
      flush_unk();
      pending_unk = std::make_pair(b, e);
    }
  }
  flush_unk();
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;          // left symbol
    int32_t result;       // merged id
    int32_t left, right;  // the pair's ids when queued (a change makes the candidate stale)
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = sym[size_t(left)].next;
    if (right < 0) return;
    auto it = merges_.find(PairKey(sym[size_t(left)].id, sym[size_t(right)].id));
    if (it != merges_.end()) {
      heap.push(
          {it->second.rank, left, it->second.result, sym[size_t(left)].id, sym[size_t(right)].id});
    }
  };
  for (int32_t i = 0; i + 1 < int32_t(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[size_t(c.pos)];
    if (l.id < 0 || l.next < 0) continue;  // merged away
    Symbol& r = sym[size_t(l.next)];
    if (l.id != c.left || r.id != c.right) continue;  // stale
    l.id = c.result;
    l.end = r.end;
    r.id = -1;  // removed
    l.next = r.next;
    if (r.next >= 0) sym[size_t(r.next)].prev = c.pos;
    consider(l.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) {
    ids->push_back(sym[size_t(i)].id);
    ranges->emplace_back(sym[size_t(i)].begin, sym[size_t(i)].end);
  }
}

}  // namespace ferry
