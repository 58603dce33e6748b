// Fuzzes SplitJsonArray (a dataset .json file's top-level array, split into its elements without
// parsing the whole document) against nlohmann::json: whenever nlohmann parses the input (with no
// NUL byte) as an array, the split gives exactly its elements, each parsing to the same value and
// starting on the line nlohmann's text puts it. Any accepted split's elements are non-empty, in
// order, inside the input.
#include "engine/json.h"
#include "engine/train/examples.h"
#include "tests/fuzz/fuzz_target.h"

FERRY_FUZZ_TARGET(text) {
  const ferry::Result<std::vector<ferry::JsonRecord>> split =
      ferry::SplitJsonArray(text, "fuzz.json");
  const nlohmann::json whole = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  // nlohmann ends its input at a NUL byte (what follows one is not read); the split reads it all.
  const bool has_nul = text.find('\0') != std::string_view::npos;
  if (!has_nul && !whole.is_discarded() && whole.is_array()) {
    FERRY_FUZZ_CHECK(split.ok());
    FERRY_FUZZ_CHECK(split->size() == whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      const nlohmann::json element =
          nlohmann::json::parse((*split)[i].text, nullptr, /*allow_exceptions=*/false);
      FERRY_FUZZ_CHECK(element == whole[i]);
    }
  }
  if (!split.ok()) return;
  const char* after = text.data();
  for (const ferry::JsonRecord& e : *split) {
    FERRY_FUZZ_CHECK(!e.text.empty());
    FERRY_FUZZ_CHECK(e.text.data() >= after &&
                     e.text.data() + e.text.size() <= text.data() + text.size());
    int64_t line = 1;
    for (const char* p = text.data(); p < e.text.data(); ++p) line += *p == '\n';
    FERRY_FUZZ_CHECK(e.line == line);
    after = e.text.data() + e.text.size();
  }
}
