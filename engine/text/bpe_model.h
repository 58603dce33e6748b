// BpeModel: the "BPE" model of a tokenizer.json — a vocabulary, ranked merges, and what to do
// with characters the vocabulary lacks (byte fallback to <0xXX> tokens, or an unknown token).
// Turns one pre-tokenized word into ids: starting from its characters, it repeatedly applies the
// lowest-ranked merge present (leftmost first), with a linked list of symbols and a heap of
// candidate merges, O(n log n) in the word's length.
//
// Immutable after construction; Tokenize is const and thread-safe (no cache).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/status.h"

namespace ferry {

// Ids must be below this (real vocabularies: a few hundred thousand); keeps tables bounded.
constexpr int32_t kMaxTokenId = 1 << 24;

struct BpeModelSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // Errors: a merge whose parts or result are not in the vocabulary, an unknown token missing
  // from it (messages name the token; the caller adds the file).
  static Result<BpeModel> Create(BpeModelSpec spec);

  // Appends the ids of `word` and the byte range in `word` each covers.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids,
                std::vector<std::pair<uint32_t, uint32_t>>* ranges) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's string, or nullptr when the id is not in the vocabulary.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id.
  int64_t id_limit() const { return int64_t(id_to_token_.size()); }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::vector<int32_t> byte_ids_;  // <0xXX> ids when byte fallback is on (all 256 present)
};

}  // namespace ferry
