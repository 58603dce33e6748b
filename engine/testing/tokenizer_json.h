// A small byte-level BPE tokenizer.json for tests (no files needed): byte b has id b, four merges
// ("he", "ll", "hell", "Ġw": ids 256-259), the special added token <|eot|> (260) and "Ġworld"
// (261), which no merge reaches (only ignore_merges does). Header-only; pure.
#pragma once

#include "engine/json.h"
#include "engine/text/utf8_text.h"

namespace ferry::testing {

inline nlohmann::json ByteLevelTokenizerJson() {
  using json = nlohmann::json;
  ByteLevelAlphabet alpha;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[alpha.Encode(uint8_t(b))] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["Ġw"] = 259;
  vocab["Ġworld"] = 261;  // no merge leads here: only ignore_merges reaches it
  return {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 260},
                                     {"content", "<|eot|>"},
                                     {"special", true},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"single_word", false},
                                     {"normalized", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({"h e", json::array({"l", "l"}), "he ll", "Ġ w"})}}}};
}

}  // namespace ferry::testing
