#include "engine/train/examples.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <span>

#include "engine/json.h"

namespace ferry {
namespace {

// A tokenizer whose tokens cross the prompt/completion boundary: each token is a run of non-space
// bytes with the spaces before it (" A:xyz"), as GPT-2-style pre-tokenizers make. Ids are handed
// out per distinct piece; <bos> = 0, <eos> = 1.
class WordTokenizer final : public Tokenizer {
 public:
  Encoding EncodeWithOffsets(std::string_view text, bool add_special_tokens) const override {
    Encoding e;
    if (add_special_tokens) {
      e.ids.push_back(0);
      e.offsets.emplace_back(0, 0);
    }
    size_t i = 0;
    while (i < text.size()) {
      size_t j = i;
      while (j < text.size() && text[j] == ' ') ++j;
      while (j < text.size() && text[j] != ' ') ++j;
      e.ids.push_back(Id(text.substr(i, j - i)));
      e.offsets.emplace_back(uint32_t(i), uint32_t(j));
      i = j;
    }
    return e;
  }
  std::string Decode(std::span<const int32_t>, bool) const override { return ""; }
  int64_t vocab_size() const override { return 1000; }
  std::optional<int32_t> TokenId(std::string_view) const override { return std::nullopt; }
  SpecialTokenIds special_ids() const override { return {.bos = 0, .eos = 1, .pad = {}}; }
  std::string Describe() const override { return "words"; }

 private:
  int32_t Id(std::string_view piece) const {
    auto [it, added] = ids_.emplace(std::string(piece), int32_t(ids_.size()) + 2);
    return it->second;
  }
  mutable std::map<std::string, int32_t> ids_;  // test-only; one thread
};

std::vector<uint8_t> Mask(const Example& e) { return e.trained; }

TEST(ExamplesTest, PromptCompletionMasksExactlyTheCompletionTokens) {
  WordTokenizer tok;
  const ExampleOptions o{.tokenizer = &tok, .chat_template = {}, .vocab_size = 0};
  // The boundary falls inside " A:xyz": that token is trained (it produces "xyz").
  Result<Example> e = ParseJsonlLine(R"({"prompt": "Q: hi A:", "completion": "xyz end"})", o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  // Tokens are those of the concatenated text, plus the appended EOS.
  std::vector<int32_t> want = tok.Encode("Q: hi A:xyz end", true);
  want.push_back(1);
  EXPECT_EQ(e->tokens, want);
  //                                  <bos> Q:  " hi" " A:xyz" " end" <eos>
  EXPECT_EQ(Mask(*e), (std::vector<uint8_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(e->valid_targets(), 3);

  // A boundary between tokens: the prompt's tokens are all context.
  e = ParseJsonlLine(R"({"prompt": "Q: hi A:", "completion": " xyz"})", o);
  ASSERT_TRUE(e.ok());
  //                                  <bos> Q:  " hi" " A:" " xyz" <eos>
  EXPECT_EQ(Mask(*e), (std::vector<uint8_t>{0, 0, 0, 0, 1, 1}));
}

TEST(ExamplesTest, ByteTokenizerMasksCompletionBytes) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  const ExampleOptions o{.tokenizer = tok.get(), .chat_template = {}, .vocab_size = 0};
  Result<Example> e = ParseJsonlLine(R"({"prompt": "ab", "completion": "cd"})", o);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->tokens, (std::vector<int32_t>{256, 'a', 'b', 'c', 'd', 257}));
  EXPECT_EQ(Mask(*e), (std::vector<uint8_t>{0, 0, 0, 1, 1, 1}));
  e = ParseJsonlLine(R"({"text": "hi"})", o);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->tokens, (std::vector<int32_t>{256, 'h', 'i', 257}));
  EXPECT_EQ(Mask(*e), (std::vector<uint8_t>{0, 1, 1, 1}));
}

TEST(ExamplesTest, MessagesTrainOnlyAssistantTurns) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  const ExampleOptions o{
      .tokenizer = tok.get(), .chat_template = {.format = ChatFormat::kChatMl}, .vocab_size = 0};
  std::string text;  // what was tokenized (ferry tokenize --data shows it)
  Result<Example> e = ParseJsonlLine(
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})",
      o, &text);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n");
  std::string trained;
  for (size_t i = 0; i < e->tokens.size(); ++i) {
    if (e->trained[i]) trained.push_back(char(e->tokens[i]));
  }
  EXPECT_EQ(trained, "yo<|im_end|>");
  EXPECT_EQ(e->tokens.size(), std::string("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
                                          "yo<|im_end|>\n")
                                  .size());
}

// A line with tool use: a `tools` list is refused where the template writes it (Qwen's `if
// tools`: not a falsy value; Llama 3.1's `tools is not none`: any), ignored where it does not; a
// `tool_calls` message (its content null, as OpenAI's form writes it) is refused under any
// template, a falsy one only where the key alone means a call (Llama 3.1's).
TEST(ExamplesTest, ToolUseIsRefusedWhereTheTemplateRendersIt) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  ExampleOptions o{
      .tokenizer = tok.get(),
      .chat_template = {.format = ChatFormat::kChatMl, .tool_use = ToolUse::kIfTruthy}};
  const std::string chat = R"("messages": [{"role": "user", "content": "hi"},)"
                           R"( {"role": "assistant", "content": "yo"}])";
  auto line = [&](const std::string& tools) { return "{\"tools\": " + tools + ", " + chat + "}"; };
  const std::string call =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null,)"
      R"( "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})";
  Result<Example> r = ParseJsonlLine(line(R"([{"type": "function"}])"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().substr(0, 53),
            "the line lists 'tools': the model's chat template wri");
  for (const char* falsy : {"[]", "null", "\"\"", "false", "0", "{}"}) {
    EXPECT_TRUE(ParseJsonlLine(line(falsy), o).ok()) << falsy;
  }
  EXPECT_FALSE(ParseJsonlLine(line("\"x\""), o).ok());  // `for tool in tools` over its letters
  o.chat_template = {.format = ChatFormat::kLlama3, .tool_use = ToolUse::kIfPresent};
  EXPECT_FALSE(ParseJsonlLine(line("[]"), o).ok());  // the tool preamble, with no tools
  EXPECT_TRUE(ParseJsonlLine(line("null"), o).ok());
  const std::string empty_calls = R"({"messages": [{"role": "user", "content": "hi"},)"
                                  R"( {"role": "assistant", "content": "yo", "tool_calls": []}]})";
  EXPECT_FALSE(ParseJsonlLine(empty_calls, o).ok());
  o.chat_template = {.format = ChatFormat::kChatMl};  // --chat-template chatml: no tool use
  EXPECT_TRUE(ParseJsonlLine(line(R"([{"type": "function"}])"), o).ok());
  EXPECT_TRUE(ParseJsonlLine(empty_calls, o).ok());
  for (ToolUse u : {ToolUse::kNone, ToolUse::kIfTruthy, ToolUse::kIfPresent}) {
    o.chat_template.tool_use = u;
    r = ParseJsonlLine(call, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message().substr(0, 34), "message 1 has 'tool_calls': ferry ");
  }
  // A null content is only a tool call's.
  r = ParseJsonlLine(R"({"messages": [{"role": "user", "content": null}]})", o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs a string 'content'"), std::string::npos)
      << r.status().message();
}

// A line asking a question answered by `calls` (the assistant's tool_calls) and a tool's result
// "r", listing `tools`.
std::string ToolLine(const std::string& calls, const std::string& tools) {
  return R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", )"
         R"("content": null, "tool_calls": )" +
         calls + R"(}, {"role": "tool", "content": "r"}], "tools": )" + tools + "}";
}

// A tool call's message may leave 'content' out (some exports do): under Qwen's and Llama 3.1's
// templates it reads as a null (empty) one, the same text; any other message without a string
// content is still refused.
TEST(ExamplesTest, ToolCallWithoutContentReadsAsAnEmptyOne) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  const std::string calls =
      R"([{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}])";
  const std::string tools = R"([{"type": "function", "function": {"name": "f"}}])";
  const std::string with_null = ToolLine(calls, tools);
  std::string without = with_null;
  without.erase(without.find(R"("content": null, )"),
                std::string_view(R"("content": null, )").size());
  for (const ChatTemplate& t :
       {ChatTemplate{.format = ChatFormat::kQwen3, .tool_use = ToolUse::kQwen},
        ChatTemplate{.format = ChatFormat::kChatMl, .tool_use = ToolUse::kQwen},
        ChatTemplate{.format = ChatFormat::kLlama3,
        .knowledge_date = true,
        .tool_use = ToolUse::kLlama31}}) {
    const ExampleOptions o{.tokenizer = tok.get(), .chat_template = t};
    std::string want, got;
    Result<Example> a = ParseJsonlLine(with_null, o, &want);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    Result<Example> b = ParseJsonlLine(without, o, &got);
    ASSERT_TRUE(b.ok()) << b.status().ToString() << "\n" << without;
    EXPECT_EQ(got, want);
    EXPECT_EQ(b->tokens, a->tokens);
    EXPECT_EQ(b->trained, a->trained);
    // Without a call (`tool_calls` empty) the message needs its content like any other.
    Result<Example> r = ParseJsonlLine(
        R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": []}]})",
        o);
    ASSERT_FALSE(r.ok());
    r = ParseJsonlLine(R"({"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]})",
                       o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("needs a string 'content'"), std::string::npos)
        << r.status().message();
  }
}

// A tool's result may be a JSON object or array: Llama 3.1's template writes it with `tojson`
// (ferry: Python's json.dumps, keys in the line's order), with a call in the line or not; the
// other templates would write Python's text of it ({'a': None}), and ferry refuses the line
// naming the message. Other roles keep needing a string.
TEST(ExamplesTest, JsonToolResultsAreLlama31s) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  const std::string calls =
      R"([{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}])";
  std::string line = ToolLine(calls, "null");
  line.replace(line.find(R"("content": "r")"), std::string_view(R"("content": "r")").size(),
               R"("content": {"z": [1.5, "é"], "a": null})");
  ExampleOptions o{
      .tokenizer = tok.get(),
      .chat_template = {
          .format = ChatFormat::kLlama3, .knowledge_date = true, .tool_use = ToolUse::kLlama31}};
  std::string text;
  Result<Example> e = ParseJsonlLine(line, o, &text);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_NE(text.find("<|start_header_id|>ipython<|end_header_id|>\n\n{\"z\": [1.5, \"é\"], "
                      "\"a\": null}<|eot_id|>"),
            std::string::npos)
      << text;
  // No call in the line: the result alone still keeps its key order; an array, as ipython's.
  e = ParseJsonlLine(
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},)"
      R"( {"role": "tool", "content": {"b": 1, "a": 2}}, {"role": "ipython", "content": [{}, 3]}]})",
      o, &text);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_NE(text.find("<|start_header_id|>ipython<|end_header_id|>\n\n{\"b\": 1, \"a\": 2}"
                      "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n[{}, 3]"
                      "<|eot_id|>"),
            std::string::npos)
      << text;
  for (const ChatTemplate& t :
       {ChatTemplate{.format = ChatFormat::kQwen3, .tool_use = ToolUse::kQwen},
        ChatTemplate{.format = ChatFormat::kChatMl, .tool_use = ToolUse::kQwen},
        ChatTemplate{.format = ChatFormat::kChatMl},  // --chat-template chatml
        ChatTemplate{.format = ChatFormat::kLlama3},  // --chat-template llama3
        ChatTemplate{.format = ChatFormat::kLlama3, .tool_use = ToolUse::kIfPresent}}) {
    o.chat_template = t;
    const Result<Example> refused = ParseJsonlLine(line, o);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("message 2 (tool) has a JSON object or array"),
              std::string::npos)
        << refused.status().message();
  }
  o.chat_template = {
      .format = ChatFormat::kLlama3, .knowledge_date = true, .tool_use = ToolUse::kLlama31};
  const Result<Example> r =
      ParseJsonlLine(R"({"messages": [{"role": "user", "content": {"q": 1}}]})", o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs a string 'content'"), std::string::npos)
      << r.status().message();
}

// Each line refused with an error holding its text.
void ExpectRefused(std::span<const std::pair<std::string, std::string>> bad,
                   const ExampleOptions& o) {
  for (const auto& [line, want] : bad) {
    Result<Example> r = ParseJsonlLine(line, o);
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  }
}

// Under Qwen's templates a line's tool use is rendered: its tools and each call's arguments as
// Python's json.dumps writes them (keys in the line's order, floats as Python's repr); a call
// without a string name or arguments, a tool_calls that is not a list, or tools that are not,
// are refused naming them.
TEST(ExamplesTest, QwenToolUseKeepsTheLinesJson) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  const ExampleOptions o{
      .tokenizer = tok.get(),
      .chat_template = {.format = ChatFormat::kQwen3, .tool_use = ToolUse::kQwen}};
  std::string text;
  Result<Example> e = ParseJsonlLine(
      ToolLine(
          R"([{"function": {"name": "f", "arguments": {"z": 1E2, "a": [0.00001, "\u00e9\t"]}}},)"
          R"( {"name": "g", "arguments": "{\"x\":1}"}])",
          R"([{"type": "function", "function": {"name": "f"}}])"),
      o, &text);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_NE(text.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n"
                      "</tools>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("<|im_start|>assistant\n<tool_call>\n{\"name\": "
                      "\"f\", \"arguments\": {\"z\": 100.0, \"a\": [1e-05, \"é\\t\"]}}\n"
                      "</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {\"x\":1}}\n"
                      "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr\n"
                      "</tool_response><|im_end|>\n"),
            std::string::npos)
      << text;
  const std::pair<std::string, std::string> kBad[] = {
      {ToolLine(R"([{"function": {"arguments": {}}}])", "[]"),
       "needs a string 'name' and 'arguments'"},
      {ToolLine(R"([{"function": null, "name": "f", "arguments": {}}])", "[]"),
       "needs a string 'name' and 'arguments'"},
      {ToolLine(R"([{"name": "f"}])", "[]"), "needs a string 'name' and 'arguments'"},
      {ToolLine(R"({"name": "f", "arguments": {}})", "[]"), "'tool_calls' must be an array"},
      {ToolLine(R"([{"name": "f", "arguments": {}}])", R"({"a": 1})"), "'tools' must be an array"},
      {ToolLine(R"([{"name": "f", "arguments": {}}])", R"(["f"])"),
       "each of 'tools' must be an object"},
      {ToolLine(R"([{"name": "f", "arguments": {"n": 18446744073709551616}}])", "[]"),
       "the integer 18446744073709551616 is beyond 64 bits"},
      {ToolLine(R"([{"name": "f", "arguments": {"n": -9223372036854775809}}])", "[]"),
       "the integer -9223372036854775809 is beyond 64 bits"},
      {ToolLine(
           R"([{"name": "f", "arguments": )" + std::string(600, '[') + std::string(600, ']') + "}]",
           "[]"),
       "JSON nested more than 500 deep"}};
  ExpectRefused(kBad, o);
}

// Under Llama 3.1's template a line's tool use is rendered: its tools as json.dumps(indent=4)
// writes them in the first user message, each call's arguments on one line; a call without its
// `function` (the template reads tool_calls[0].function), two calls, and a user's calls are
// refused naming them.
TEST(ExamplesTest, Llama31ToolUseKeepsTheLinesJson) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  const ExampleOptions o{
      .tokenizer = tok.get(),
      .chat_template = {
          .format = ChatFormat::kLlama3, .knowledge_date = true, .tool_use = ToolUse::kLlama31}};
  std::string text;
  Result<Example> e = ParseJsonlLine(
      ToolLine(
          R"([{"function": {"name": "f", "arguments": {"z": 1E2, "a": [0.00001, "\u00e9\t"]}}}])",
          R"([{"type": "function", "function": {"name": "f", "p": []}}])"),
      o, &text);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_NE(text.find("Do not use variables.\n\n{\n    \"type\": \"function\",\n    "
                      "\"function\": {\n        \"name\": \"f\",\n        \"p\": []\n    }\n}\n\n"
                      "q<|eot_id|>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"f\", "
                      "\"parameters\": {\"z\": 100.0, \"a\": [1e-05, \"é\\t\"]}}<|eot_id|>"
                      "<|start_header_id|>ipython<|end_header_id|>\n\n\"r\"<|eot_id|>"),
            std::string::npos)
      << text;
  const std::pair<std::string, std::string> kBad[] = {
      {ToolLine(R"([{"name": "f", "arguments": {}}])", "[]"), "reads a tool call's 'function'"},
      {ToolLine(R"([{"function": {"name": "f", "arguments": {}}}, )"
                R"({"function": {"name": "g", "arguments": {}}}])",
                "[]"),
       "message 1 has 2 tool calls"},
      {R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", )"
       R"("content": "a", "tool_calls": null}]})",
       "message 1 has 'tool_calls' that list no call"},
      {R"({"messages": [{"role": "user", "content": "q", "tool_calls": [{"function": )"
       R"({"name": "f", "arguments": {}}}]}]})",
       "message 0 has 'tool_calls' but is not the assistant's"},
      {R"({"tools": [], "messages": [{"role": "assistant", "content": "a"}]})",
       "puts in the first user message, and message 0 is not the user's"},
      {R"({"tools": [], "messages": []})", "message 0 is not the user's"},
      {R"({"messages": []})", "the chat has no turn"}};
  ExpectRefused(kBad, o);
}

// ShareGPT's conversations are the messages they name: the same text and mask; a speaker it does
// not name, and a line with both forms, are refused naming them.
TEST(ExamplesTest, ShareGptConversationsAreMessages) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  const ExampleOptions o{
      .tokenizer = tok.get(), .chat_template = {.format = ChatFormat::kChatMl}, .vocab_size = 0};
  std::string messages_text, conversations_text;
  Result<Example> m = ParseJsonlLine(
      R"({"messages": [{"role": "system", "content": "be"}, {"role": "user", "content": "hi"},)"
      R"( {"role": "assistant", "content": "yo"}, {"role": "user", "content": "x"},)"
      R"( {"role": "assistant", "content": "z"}]})",
      o, &messages_text);
  Result<Example> c = ParseJsonlLine(
      R"({"conversations": [{"from": "system", "value": "be"}, {"from": "human", "value": "hi"},)"
      R"( {"from": "gpt", "value": "yo"}, {"from": "user", "value": "x"},)"
      R"( {"from": "model", "value": "z"}]})",
      o, &conversations_text);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(conversations_text, messages_text);
  EXPECT_EQ(c->tokens, m->tokens);
  EXPECT_EQ(c->trained, m->trained);
  Result<Example> bad =
      ParseJsonlLine(R"({"conversations": [{"from": "tool", "value": "hi"}]})", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'from' \"tool\""), std::string::npos)
      << bad.status().message();
  bad = ParseJsonlLine(R"({"conversations": [{"from": "human"}]})", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'value'"), std::string::npos) << bad.status().message();
  bad = ParseJsonlLine(R"({"messages": [], "conversations": []})", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("more than one chat"), std::string::npos)
      << bad.status().message();
  // A null key of the other form (as some exports write it) is absent.
  Result<Example> with_null =
      ParseJsonlLine(R"({"messages": null, "conversations": [{"from": "system", "value": "be"}, )"
                     R"({"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}, )"
                     R"({"from": "user", "value": "x"}, {"from": "model", "value": "z"}]})",
                     o);
  ASSERT_TRUE(with_null.ok()) << with_null.status().ToString();
  EXPECT_EQ(with_null->tokens, c->tokens);
}

// Alpaca's instruction/input/output (and system) lines are the chat they name: the instruction
// and its input on the next line the user's turn, the output the assistant's; an empty input or
// system adds nothing. A missing output, or a value that is not a string, is refused naming it.
TEST(ExamplesTest, AlpacaLinesAreUserAndAssistantTurns) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  const ExampleOptions o{
      .tokenizer = tok.get(), .chat_template = {.format = ChatFormat::kChatMl}, .vocab_size = 0};
  auto same = [&](const char* alpaca, const char* messages) {
    std::string a_text, m_text;
    Result<Example> a = ParseJsonlLine(alpaca, o, &a_text);
    Result<Example> m = ParseJsonlLine(messages, o, &m_text);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(a_text, m_text);
    EXPECT_EQ(a->tokens, m->tokens);
    EXPECT_EQ(a->trained, m->trained);
  };
  same(R"({"instruction": "Add", "input": "2 and 3", "output": "5", "system": "Be brief."})",
       R"({"messages": [{"role": "system", "content": "Be brief."},)"
       R"( {"role": "user", "content": "Add\n2 and 3"}, {"role": "assistant", "content": "5"}]})");
  same(R"({"instruction": "Say hi", "input": "", "output": "hi", "system": ""})",
       R"({"messages": [{"role": "user", "content": "Say hi"},)"
       R"( {"role": "assistant", "content": "hi"}]})");
  Result<Example> bad = ParseJsonlLine(R"({"instruction": "Say hi"})", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'output' is missing"), std::string::npos)
      << bad.status().message();
  bad = ParseJsonlLine(R"({"instruction": "Say hi", "input": 3, "output": "x"})", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'input' must be a string"), std::string::npos)
      << bad.status().message();
}

// train_on_prompt: every form gives the same tokens, and every token the text covers trained
// (the chats' whole template, the prompt); without it a subset of those.
TEST(ExamplesTest, TrainOnPromptTrainsTheWholeText) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  const std::string lines[] = {
      R"({"prompt": "p q", "completion": " c"})",
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                      {"role": "assistant", "content": "a"}]})",
      R"({"conversations": [{"from": "human", "value": "u"}, {"from": "gpt", "value": "a"}]})",
      R"({"instruction": "i", "input": "x", "output": "o"})"};
  for (const std::string& line : lines) {
    ExampleOptions o{.tokenizer = tok.get(), .chat_template = {.format = ChatFormat::kChatMl}};
    Result<Example> answers = ParseJsonlLine(line, o);
    o.train_on_prompt = true;
    Result<Example> all = ParseJsonlLine(line, o);
    ASSERT_TRUE(answers.ok() && all.ok()) << line;
    EXPECT_EQ(all->tokens, answers->tokens) << line;
    // The byte tokenizer adds BOS (256) to a prompt+completion: the one token not trained.
    const size_t bos = all->tokens[0] == 256 ? 1 : 0;
    EXPECT_EQ(std::vector<uint8_t>(all->trained.begin() + int64_t(bos), all->trained.end()),
              std::vector<uint8_t>(all->tokens.size() - bos, 1))
        << line;
    for (size_t i = 0; i < all->tokens.size(); ++i) {
      EXPECT_LE(answers->trained[i], all->trained[i]) << line << " token " << i;
    }
    EXPECT_LT(answers->valid_targets(), all->valid_targets()) << line;
  }
}

// Mutated lines (bytes flipped, inserted, cut) are parsed or refused with a message, never a
// crash (the sanitizer builds check the memory side). A bounded stand-in for a fuzz target.
TEST(ExamplesTest, MutatedLinesNeverCrash) {
  std::unique_ptr<Tokenizer> tok = MakeByteTokenizer();
  for (ChatFormat f : {ChatFormat::kChatMl, ChatFormat::kLlama3, ChatFormat::kMistral}) {
    const ExampleOptions o{.tokenizer = tok.get(), .chat_template = {.format = f}, .vocab_size = 0};
    const std::string seeds[] = {
        R"({"text": "abc"})", R"({"prompt": "p\u00e9", "completion": "c"})",
        R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},)"
        R"( {"role": "assistant", "content": "a"}]})"};
    std::mt19937 rng(11);
    constexpr char kAlphabet[] =
        "{}[]\":,\\ \0\xff"
        "aeu0";
    const std::string alphabet(kAlphabet, sizeof(kAlphabet) - 1);  // with a NUL byte
    int refused = 0;
    for (const std::string& seed : seeds) {
      for (int i = 0; i < 300; ++i) {
        std::string line = seed;
        for (int k = 0; k < 3; ++k) {
          const size_t at = rng() % line.size();
          const char c = alphabet[rng() % alphabet.size()];
          switch (rng() % 3) {
            case 0:
              line[at] = c;
              break;
            case 1:
              line.insert(line.begin() + int64_t(at), c);
              break;
            default:
              line.resize(at + 1);
              break;
          }
        }
        Result<Example> e = ParseJsonlLine(line, o);
        if (!e.ok()) {
          ++refused;
          EXPECT_FALSE(e.status().message().empty());
        } else {
          EXPECT_EQ(e->tokens.size(), e->trained.size());
        }
      }
    }
    EXPECT_GT(refused, 0);
  }
}

class ExampleFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("ferry_examples_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const char* name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return path;
  }
  std::filesystem::path dir_;
  std::unique_ptr<Tokenizer> tok_ = MakeByteTokenizer();
};

TEST_F(ExampleFilesTest, BadLineNamesFileAndLine) {
  const std::string path = Write("data.jsonl",
                                 "{\"text\": \"a\"}\n"
                                 "\n"
                                 "{\"messages\": {\"role\": \"user\"}}\n"
                                 "not json\n"
                                 "{\"prompt\": \"p\"}\n"
                                 "{\"text\": \"b\"}");
  ExampleOptions o{.tokenizer = tok_.get(), .chat_template = {}, .vocab_size = 0};
  Result<LoadedExamples> r = LoadExamples(path, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            path + ":3: 'messages' must be an array (--skip-bad-lines skips such lines)");
  o.skip_bad_lines = true;
  r = LoadExamples(path, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->skipped_lines, 3);
  ASSERT_EQ(r->examples.size(), 2u);
  EXPECT_EQ(r->examples[1].tokens, (std::vector<int32_t>{256, 'b', 257}));
}

TEST_F(ExampleFilesTest, TextFileSplitsAtBlankLines) {
  const std::string path = Write("data.txt", "ab\ncd\n\n  \nef\n");
  Result<LoadedExamples> r = LoadExamples(path, {.tokenizer = tok_.get()});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->examples.size(), 2u);
  EXPECT_EQ(r->examples[0].tokens, (std::vector<int32_t>{256, 'a', 'b', '\n', 'c', 'd', 257}));
  EXPECT_EQ(r->examples[1].tokens, (std::vector<int32_t>{256, 'e', 'f', 257}));
}

// --train-on-prompt over a file without prompts (text lines, a text file) changes no mask: a
// note says so; one prompt among the examples (a chat, prompt + completion) and it has work.
TEST_F(ExampleFilesTest, TrainOnPromptWithoutPromptsIsNoted) {
  const ExampleOptions o{.tokenizer = tok_.get(),
                         .chat_template = {.format = ChatFormat::kChatMl},
                         .train_on_prompt = true};
  for (const auto& [name, bytes] :
       {std::pair{"text.txt", "ab\n\ncd\n"},
        std::pair{"text.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n"}}) {
    Result<LoadedExamples> r = LoadExamples(Write(name, bytes), o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->with_prompt, 0) << name;
    EXPECT_NE(UnusedTrainOnPrompt(*r, o).find("--train-on-prompt changes nothing here"),
              std::string::npos)
        << name;
    EXPECT_EQ(UnusedTrainOnPrompt(*r, {.tokenizer = tok_.get()}), "") << name;  // not asked for
  }
  for (const char* line : {"{\"prompt\": \"p\", \"completion\": \"c\"}",
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, "
                           "{\"role\": \"assistant\", \"content\": \"a\"}]}"}) {
    Result<LoadedExamples> r =
        LoadExamples(Write("mixed.jsonl", std::string("{\"text\": \"a\"}\n") + line + "\n"), o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->with_prompt, 1) << line;
    EXPECT_EQ(UnusedTrainOnPrompt(*r, o), "") << line;
  }
}

TEST_F(ExampleFilesTest, TokenFileRoundTrip) {
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {}, {70000, 5}};
  const std::string path = (dir_ / "data.tok").string();
  ASSERT_TRUE(WriteTokenFile(path, docs).ok());
  Result<LoadedExamples> r = LoadExamples(path, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->examples.size(), 3u);
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_EQ(r->examples[d].tokens, docs[d]);
    EXPECT_EQ(r->examples[d].trained, std::vector<uint8_t>(docs[d].size(), 1));
  }
  // Ids outside the model's vocabulary are an error naming the token.
  r = LoadExamples(path, {.vocab_size = 1000});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("token 3 is id 70000"), std::string::npos)
      << r.status().message();
  // A truncated file is an error, never a crash.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (size_t cut : {size_t(9), size_t(30), bytes.size() - 1}) {
    const std::string bad = Write("bad.tok", bytes.substr(0, cut));
    EXPECT_FALSE(LoadExamples(bad, {}).ok()) << "cut at " << cut;
  }
}

TEST_F(ExampleFilesTest, NanoGptRawUint16SplitsAtEos) {
  const uint16_t ids[] = {'a', 'b', 257, 'c', 257, 'd'};
  const std::string path =
      Write("train.bin", std::string(reinterpret_cast<const char*>(ids), sizeof(ids)));
  Result<LoadedExamples> r = LoadExamples(path, {.tokenizer = tok_.get(), .vocab_size = 260});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->examples.size(), 3u);
  EXPECT_EQ(r->examples[0].tokens, (std::vector<int32_t>{'a', 'b', 257}));
  EXPECT_EQ(r->examples[1].tokens, (std::vector<int32_t>{'c', 257}));
  EXPECT_EQ(r->examples[2].tokens, (std::vector<int32_t>{'d'}));
}

// A .json file holding an array of the .jsonl objects reads as the .jsonl file does, however the
// array is laid out (pretty-printed over several lines, a BOM, brackets, commas and escaped
// quotes inside strings); each example's line is the line its element starts on. A .json file
// that does not start with '[' is JSON lines, as Hugging Face's `datasets` reads one.
TEST_F(ExampleFilesTest, JsonArrayReadsAsJsonLines) {
  const std::vector<std::string> objects = {
      R"({"text": "a [b], {c} \"d\" \\"})", R"({"prompt": "p,", "completion": "]c"})",
      R"({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]})",
      R"({"instruction": "i", "input": "", "output": "o"})"};
  std::string jsonl;
  for (const std::string& o : objects) jsonl += o + "\n";
  const ExampleOptions o{
      .tokenizer = tok_.get(), .chat_template = {.format = ChatFormat::kChatMl}, .keep_text = true};
  Result<LoadedExamples> want = LoadExamples(Write("data.jsonl", jsonl), o);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  ASSERT_EQ(want->examples.size(), objects.size());
  std::string pretty = "\xEF\xBB\xBF\n[\n";  // a BOM, then the array from line 2
  std::vector<int64_t> lines;
  int64_t line = 2;
  for (size_t i = 0; i < objects.size(); ++i) {
    const nlohmann::json j = nlohmann::json::parse(objects[i]);
    const std::string text = j.dump(i % 2 == 0 ? 2 : -1);
    lines.push_back(line + 1);
    pretty += "  " + text + (i + 1 < objects.size() ? " ,\r\n" : "\n");
    line += 1 + int64_t(std::count(text.begin(), text.end(), '\n'));
  }
  pretty += "]\n\n";
  for (const std::string& body : {pretty, "[" + jsonl.substr(0, jsonl.size() - 1) + "]"}) {
    std::string array = body;
    for (size_t at = 0; (at = array.find("}\n{", at)) != std::string::npos;) array[at + 1] = ',';
    Result<LoadedExamples> got = LoadExamples(Write("data.json", array), o);
    ASSERT_TRUE(got.ok()) << got.status().ToString() << "\n" << array;
    ASSERT_EQ(got->examples.size(), objects.size());
    for (size_t i = 0; i < objects.size(); ++i) {
      EXPECT_EQ(got->examples[i].tokens, want->examples[i].tokens) << i;
      EXPECT_EQ(got->examples[i].trained, want->examples[i].trained) << i;
      EXPECT_EQ(got->texts[i], want->texts[i]) << i;
    }
    if (body == pretty) {
      EXPECT_EQ(got->lines, lines);
    }
  }
  Result<LoadedExamples> lines_json = LoadExamples(Write("lines.json", jsonl), o);
  ASSERT_TRUE(lines_json.ok()) << lines_json.status().ToString();
  EXPECT_EQ(lines_json->lines, want->lines);
  Result<LoadedExamples> empty = LoadExamples(Write("empty.json", " [ ]\n"), o);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->examples.empty());
}

// A bad element is named by its first line and skipped with skip_bad_lines; an array whose bounds
// are unknown (a bracket that does not match, a missing ']', an empty element, text after it)
// stops the load naming the line, skipping or not.
TEST_F(ExampleFilesTest, JsonArrayErrorsNameTheLine) {
  ExampleOptions o{.tokenizer = tok_.get()};
  const std::string bad = Write("bad.json",
                                "[{\"text\": \"a\"},\n"
                                " {\"messages\":\n"
                                "   {\"role\": \"user\"}},\n"
                                " 7,\n"
                                " {\"text\": \"b\"}]\n");
  Result<LoadedExamples> r = LoadExamples(bad, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            bad + ":2: 'messages' must be an array (--skip-bad-lines skips such elements)");
  o.skip_bad_lines = true;
  r = LoadExamples(bad, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->skipped_lines, 2);
  ASSERT_EQ(r->examples.size(), 2u);
  EXPECT_EQ(r->examples[1].tokens, (std::vector<int32_t>{256, 'b', 257}));
  const std::string deep = "[" + std::string(10001, '[');
  const std::pair<std::string, const char*> broken[] = {
      {"[{\"text\": \"a\"},\n {\"text\": [\"b\"}]", "2: a '}' closes the '[' opened on line 2"},
      {"[{\"text\": \"a\"},\n {\"text\": \"b\"}",
       "2: the file ends before the array's ']' "
       "(a truncated file?); the last element starts "
       "on line 2"},
      {"[{\"text\": \"a\"},\n {\"text\": \"b",
       "2: the file ends inside a string (a "
       "truncated file?); the last element starts on "
       "line 2"},
      {"[{\"text\": \"a\"},\n\n]", "3: an empty element (a ',' before ']')"},
      {"[ , {\"text\": \"a\"}]", "1: an empty element (a ',' with nothing before it)"},
      {"[{\"text\": \"a\"}]\n[]", "2: text after the JSON array's closing ']'"},
      {"[{\"text\": \"a\"}}]", "1: a '}' with no '{' open"},
      {"[{\"text\": \"a\"}\n {\"text\": \"b\"}]", "2: a ',' is missing between two elements"},
      {"[\"a\" \"b\"]", "1: a ',' is missing between two elements"},
      {"[1\n2]", "2: a ',' is missing between two elements"},
      {"[1{\"text\": \"a\"}]", "1: a ',' is missing between two elements"},
      {"[true[]]", "1: a ',' is missing between two elements"},
      {deep, "1: brackets nested more than 10000 deep"},
  };
  for (const auto& [text, message] : broken) {
    const std::string path = Write("broken.json", text);
    r = LoadExamples(path, o);
    ASSERT_FALSE(r.ok()) << text.substr(0, 80);
    EXPECT_EQ(r.status().message(), path + ":" + message) << text.substr(0, 80);
  }
  // One object over several lines is neither an array nor JSON lines: said once, not per line.
  const std::string object = Write("object.json", "{\"data\": [\n  {\"text\": \"a\"}\n]}\n");
  r = LoadExamples(object, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            object +
                ":1: not a whole JSON value; a .json dataset holds one JSON array of "
                "examples ([{...}, {...}]) or one JSON object a line, and one object over "
                "several lines is neither");
  EXPECT_FALSE(SplitJsonArray("{\"text\": \"a\"}", "x.json").ok());
}

// On random arrays, laid out in several ways, SplitJsonArray gives exactly the elements
// nlohmann::json parses, on the lines they start on; on those texts cut or with a byte changed,
// whenever nlohmann still parses an array, the same holds (the fuzz target's property, on seeds
// every build runs).
TEST(JsonArrayTest, SplitMatchesNlohmann) {
  std::mt19937 rng(5);
  std::function<nlohmann::json(int)> value = [&](int depth) -> nlohmann::json {
    switch (rng() % (depth > 2 ? 4 : 6)) {
      case 0:
        return int64_t(rng() % 2000) - 1000;
      case 1: {
        static const char* kStrings[] = {"", "a,b", "]}", "q\"uo\\te", "x\ny", "[{", "\u00e9"};
        return kStrings[rng() % 7];
      }
      case 2:
        return rng() % 2 == 0;
      case 3:
        return nullptr;
      case 4: {
        nlohmann::json a = nlohmann::json::array();
        for (int n = int(rng() % 4); n > 0; --n) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        nlohmann::json o = nlohmann::json::object();
        for (int n = int(rng() % 4); n > 0; --n)
          o["k" + std::to_string(rng() % 5)] = value(depth + 1);
        return o;
      }
    }
  };
  auto check = [](const std::string& text, const nlohmann::json& whole) {
    Result<std::vector<JsonRecord>> split = SplitJsonArray(text, "x.json");
    ASSERT_TRUE(split.ok()) << split.status().ToString() << "\n" << text;
    ASSERT_EQ(split->size(), whole.size()) << text;
    for (size_t i = 0; i < whole.size(); ++i) {
      const JsonRecord& e = (*split)[i];
      EXPECT_EQ(nlohmann::json::parse(e.text), whole[i]) << text;
      const size_t at = size_t(e.text.data() - text.data());
      EXPECT_EQ(e.line, 1 + std::count(text.begin(), text.begin() + int64_t(at), '\n')) << text;
    }
  };
  int arrays = 0;
  for (int round = 0; round < 300; ++round) {
    nlohmann::json whole = nlohmann::json::array();
    for (int n = int(rng() % 5); n > 0; --n) whole.push_back(value(0));
    const std::string text = whole.dump(int(rng() % 4) - 1);
    check(text, whole);
    for (int k = 0; k < 5; ++k) {
      std::string mutated = text;
      const size_t at = rng() % mutated.size();
      if (rng() % 2 == 0) {
        mutated.resize(at);
      } else {
        mutated[at] = "[]{},\"\\ \n"[rng() % 9];
      }
      const nlohmann::json again = nlohmann::json::parse(mutated, nullptr, false);
      if (again.is_discarded() || !again.is_array()) {
        (void)SplitJsonArray(mutated, "x.json");  // an error or a split: never a crash
        continue;
      }
      ++arrays;
      check(mutated, again);
    }
  }
  EXPECT_GT(arrays, 50);
}

TEST_F(ExampleFilesTest, UnknownExtensionAndMissingFile) {
  Result<LoadedExamples> csv = LoadExamples(Write("data.csv", "a,b"), {.tokenizer = tok_.get()});
  ASSERT_FALSE(csv.ok());
  EXPECT_NE(csv.status().message().find("use .jsonl, .json, .txt, or .bin/.tok"), std::string::npos)
      << csv.status().message();
  Result<LoadedExamples> r =
      LoadExamples((dir_ / "none.jsonl").string(), {.tokenizer = tok_.get()});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("none.jsonl"), std::string::npos);
}

}  // namespace
}  // namespace ferry
