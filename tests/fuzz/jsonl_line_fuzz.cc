// Fuzzes ParseJsonlLine (one dataset .jsonl line: text, prompt/completion or chat messages) with
// the byte tokenizer; the first input byte picks the chat template (and its options). An accepted
// line must give one mask entry per token and ids inside the vocabulary.
#include <memory>

#include "engine/train/examples.h"
#include "tests/fuzz/fuzz_target.h"

FERRY_FUZZ_TARGET(text) {
  if (text.empty()) return;
  static const std::unique_ptr<ferry::Tokenizer> tok = ferry::MakeByteTokenizer();
  const uint8_t pick = uint8_t(text[0]);
  ferry::ExampleOptions o;
  o.tokenizer = tok.get();
  constexpr ferry::ChatFormat kFormats[] = {ferry::ChatFormat::kNone, ferry::ChatFormat::kChatMl,
                                            ferry::ChatFormat::kLlama3, ferry::ChatFormat::kMistral,
                                            ferry::ChatFormat::kQwen3};
  o.chat_template.format = kFormats[pick % 5];
  o.chat_template.knowledge_date = (pick & 8) != 0;
  if (pick & 16) o.chat_template.default_system = "You are a helpful assistant.";
  constexpr ferry::ToolUse kToolUse[] = {ferry::ToolUse::kNone, ferry::ToolUse::kQwen,
                                         ferry::ToolUse::kIfTruthy, ferry::ToolUse::kIfPresent};
  o.chat_template.tool_use = kToolUse[(pick >> 5) % 4];
  std::string rendered;
  ferry::Result<ferry::Example> e = ferry::ParseJsonlLine(text.substr(1), o, &rendered);
  if (!e.ok()) return;
  FERRY_FUZZ_CHECK(e->tokens.size() == e->trained.size());
  for (int32_t id : e->tokens) FERRY_FUZZ_CHECK(id >= 0 && id < tok->vocab_size());
}
