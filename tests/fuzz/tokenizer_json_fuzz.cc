// Fuzzes ParseTokenizerJson with tokenizer.json text, optionally followed by a NUL byte and text
// to encode. An accepted tokenizer must encode that text (or a fixed sample) into ids inside its
// vocabulary with one byte range per id inside the text, and decode them without failing.
#include <string>
#include <vector>

#include "engine/text/bpe_tokenizer.h"
#include "tests/fuzz/fuzz_target.h"

FERRY_FUZZ_TARGET(text) {
  const size_t nul = text.find('\0');
  const std::string_view json = text.substr(0, nul);
  const std::string_view input = nul == std::string_view::npos
                                     ? std::string_view("Hello, world! naïve 中文 <s>  12345\n")
                                     : text.substr(nul + 1);
  ferry::Result<std::unique_ptr<ferry::Tokenizer>> tok = ferry::ParseTokenizerJson(json, "fuzz");
  if (!tok.ok()) return;
  const int64_t vocab = (*tok)->vocab_size();
  for (bool special : {true, false}) {
    const ferry::Encoding e = (*tok)->EncodeWithOffsets(input, special);
    FERRY_FUZZ_CHECK(e.ids.size() == e.offsets.size());
    for (size_t i = 0; i < e.ids.size(); ++i) {
      FERRY_FUZZ_CHECK(e.ids[i] >= 0 && e.ids[i] < vocab);
      FERRY_FUZZ_CHECK(e.offsets[i].first <= e.offsets[i].second);
      FERRY_FUZZ_CHECK(e.offsets[i].second <= input.size());
    }
    (void)(*tok)->Decode(e.ids, /*skip_special_tokens=*/false);
    (void)(*tok)->Decode(e.ids, /*skip_special_tokens=*/true);
  }
  (void)(*tok)->special_ids();
  (void)(*tok)->Describe();
}
