// The built-in chat templates against the strings the Hugging Face templates render
// (apply_chat_template(messages, tokenize=False)) for one multi-turn conversation with a system
// message. The expected strings are written out from the templates' definitions:
//  - ChatML (Qwen2.5's tokenizer_config.json): "<|im_start|>" + role + "\n" + content +
//    "<|im_end|>\n" per message; a default system message when none is given.
//  - Llama 3 (Meta-Llama-3-8B-Instruct): bos_token, then "<|start_header_id|>" + role +
//    "<|end_header_id|>\n\n" + content | trim + "<|eot_id|>" per message.
//  - Mistral (Mistral-7B-Instruct-v0.2 / Mixtral-8x7B-Instruct-v0.1): bos_token; user turns
//    " [INST] " + [system + "\n\n" on the first] + content + " [/INST]"; assistant turns
//    " " + content + eos_token.
#include "engine/train/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/testing/golden_files.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "2+2?"},
    {"assistant", " 4 \n"},  // whitespace that llama3's `trim` removes
};

// The trained substrings, in order.
std::vector<std::string> TrainedParts(const RenderedText& r) {
  std::vector<std::string> out;
  for (auto [b, e] : r.trained) out.push_back(r.text.substr(b, e - b));
  return out;
}

TEST(ChatTemplateTest, ChatMl) {
  Result<RenderedText> r = RenderChat({.format = ChatFormat::kChatMl}, kConversation);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text,
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n 4 \n<|im_end|>\n");
  EXPECT_EQ(TrainedParts(*r), (std::vector<std::string>{"Hello.<|im_end|>", " 4 \n<|im_end|>"}));
}

TEST(ChatTemplateTest, ChatMlDefaultSystemFromQwenTemplate) {
  const ChatTemplate t = ChatTemplateFromText(
      "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
      "helpful assistant.<|im_end|>\\n' }}");
  ASSERT_EQ(t.format, ChatFormat::kChatMl);
  const std::vector<ChatMessage> m = {{"user", "Hi"}, {"assistant", "Yo"}};
  Result<RenderedText> r = RenderChat(t, m);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nYo<|im_end|>\n");
}

TEST(ChatTemplateTest, Llama3) {
  Result<RenderedText> r = RenderChat({.format = ChatFormat::kLlama3}, kConversation);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text,
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>");
  EXPECT_EQ(TrainedParts(*r), (std::vector<std::string>{"Hello.<|eot_id|>", "4<|eot_id|>"}));
}

// Llama 3.1's template: the system turn always comes first, with the knowledge-date preamble and
// the trimmed system message (empty without one).
TEST(ChatTemplateTest, Llama31KnowledgeDatePreamble) {
  const ChatTemplate t = ChatTemplateFromText(
      "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
      "{{- \"Cutting Knowledge Date: December 2023\\n\" }}");
  ASSERT_EQ(t.format, ChatFormat::kLlama3);
  ASSERT_TRUE(t.knowledge_date);
  Result<RenderedText> r = RenderChat(t, kConversation);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text,
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>");
  const std::vector<ChatMessage> no_system = {{"user", "Hi"}, {"assistant", "Yo"}};
  r = RenderChat(t, no_system);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text,
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>");
  EXPECT_EQ(TrainedParts(*r), (std::vector<std::string>{"Yo<|eot_id|>"}));
}

// Jinja's `trim` is Python's str.strip(): Unicode whitespace (U+3000, U+00A0, U+2028) and the
// separators U+001C..U+001F go too; other characters, invalid UTF-8 included, stay.
TEST(ChatTemplateTest, Llama3TrimIsPythonsStrip) {
  const std::vector<ChatMessage> m = {{"user", "\u3000\u00a0 x\u2028\x1f"},
                                      {"assistant", "\xff y \xe2\x80"}};
  Result<RenderedText> r = RenderChat({.format = ChatFormat::kLlama3}, m);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n\xff y \xe2\x80<|eot_id|>");
}

// Templates ferry cannot render exactly are detected and refused with a pointer to
// --chat-template; Mistral v0.2's renders.
TEST(ChatTemplateTest, RefusesTemplatesItCannotRenderExactly) {
  const char* refused[] = {
      "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% set content = '<<SYS>>\\n' %}",
      "{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}",  // Mistral v0.3
      "{{ '[INST] ' + message['content'] + ' [/INST]' }}",        // Mistral v0.1
  };
  for (const char* text : refused) {
    const ChatTemplate t = ChatTemplateFromText(text);
    EXPECT_FALSE(t.unsupported.empty()) << text;
    Result<RenderedText> r = RenderChat(t, kConversation);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("--chat-template"), std::string::npos);
  }
  const ChatTemplate v02 =
      ChatTemplateFromText("{{- ' [INST] ' + message['content'] + ' [/INST]' }}");
  EXPECT_EQ(v02.format, ChatFormat::kMistral);
  EXPECT_TRUE(v02.unsupported.empty());
}

// Qwen3's release template (tests/chat_templates/qwen3.jinja) is detected as qwen3; a <think>
// template that differs from it in what it renders is detected but refused. Rendered: reasoning
// split from the content at "</think>" (or given as reasoning_content), a <think> block on the
// turns after the last user query that are last or have reasoning (trained when it holds some),
// earlier turns' reasoning dropped, a tool's response not a query.
TEST(ChatTemplateTest, Qwen3) {
  Result<std::string> source =
      ReadWholeFile(testing::SourceDir() + "/tests/chat_templates/qwen3.jinja");
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const ChatTemplate t = ChatTemplateFromText(*source);
  EXPECT_EQ(t.format, ChatFormat::kQwen3);
  EXPECT_TRUE(t.unsupported.empty()) << t.unsupported;
  std::string altered = *source;
  const std::string clause = "loop.last or (not loop.last and reasoning_content)";
  ASSERT_NE(altered.find(clause), std::string::npos);
  altered.replace(altered.find(clause), clause.size(), "reasoning_content");
  EXPECT_FALSE(ChatTemplateFromText(altered).unsupported.empty());
  EXPECT_EQ(*ParseChatFormat("qwen3"), ChatFormat::kQwen3);

  const std::vector<ChatMessage> chat = {
      {"system", "Be brief."},
      {"user", "Hi!"},
      {"assistant", "<think>\nold\n</think>\n\nHello."},  // before the last query: no block
      {"user", "2+2?"},
      {"assistant", "\n4"},  // last and no reasoning: an empty block, context
  };
  Result<RenderedText> r = RenderChat(t, chat);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n");
  EXPECT_EQ(TrainedParts(*r), (std::vector<std::string>{"Hello.<|im_end|>", "4<|im_end|>"}));

  const std::vector<ChatMessage> tool = {
      {"user", "Sum 2 and 2."},
      {"assistant", "", "\nCall the tool.\n"},  // after the query, with reasoning: its block
      {"user", "<tool_response>4</tool_response>"},
      {"assistant", "It is 4."},
  };
  r = RenderChat(t, tool);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text,
            "<|im_start|>user\nSum 2 and 2.<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nCall the tool.\n</think>\n\n<|im_end|>\n"
            "<|im_start|>user\n<tool_response>4</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nIt is 4.<|im_end|>\n");
  EXPECT_EQ(TrainedParts(*r),
            (std::vector<std::string>{"<think>\nCall the tool.\n</think>\n\n<|im_end|>",
                                      "It is 4.<|im_end|>"}));
  Result<std::string> prompt = RenderChatPrompt(t, std::span(chat).first(4));
  ASSERT_TRUE(prompt.ok());
  EXPECT_TRUE(prompt->ends_with("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"));
  ChatTemplate no_thinking = t;
  no_thinking.enable_thinking = false;  // enable_thinking=False
  Result<std::string> quick = RenderChatPrompt(no_thinking, std::span(chat).first(4));
  ASSERT_TRUE(quick.ok());
  EXPECT_EQ(*quick, *prompt + "<think>\n\n</think>\n\n");
  EXPECT_EQ(EndOfTurn(ChatFormat::kQwen3), "<|im_end|>");
  r = RenderChat(t, std::vector<ChatMessage>{{"function", "4"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'function'"), std::string::npos) << r.status().message();
}

TEST(ChatTemplateTest, Mistral) {
  Result<RenderedText> r = RenderChat({.format = ChatFormat::kMistral}, kConversation);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text,
            "<s> [INST] You are terse.\n\nHi! [/INST] Hello.</s> [INST] 2+2? [/INST]  4 \n</s>");
  EXPECT_EQ(TrainedParts(*r), (std::vector<std::string>{"Hello.</s>", " 4 \n</s>"}));
}

TEST(ChatTemplateTest, MistralNeedsAlternatingTurns) {
  const std::vector<ChatMessage> m = {{"user", "a"}, {"user", "b"}};
  Result<RenderedText> r = RenderChat({.format = ChatFormat::kMistral}, m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("alternate"), std::string::npos);
  const std::vector<ChatMessage> late_system = {{"user", "a"}, {"system", "b"}};
  EXPECT_FALSE(RenderChat({.format = ChatFormat::kMistral}, late_system).ok());
}

TEST(ChatTemplateTest, NoTemplateIsAnErrorNamingTheOption) {
  Result<RenderedText> r = RenderChat({}, kConversation);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--chat-template"), std::string::npos);
  EXPECT_FALSE(ParseChatFormat("jinja").ok());
  EXPECT_EQ(*ParseChatFormat("llama3"), ChatFormat::kLlama3);
}

// A generation prompt (add_generation_prompt=True): the conversation, then the assistant's header
// (the templates' own `if add_generation_prompt` branches; Mistral v0.2's has none), and the
// marker that ends the answer.
TEST(ChatTemplateTest, GenerationPromptAddsTheAssistantsHeader) {
  const std::vector<ChatMessage> ask = {{"system", "You are terse."}, {"user", "2+2?"}};
  Result<std::string> chatml = RenderChatPrompt({.format = ChatFormat::kChatMl}, ask);
  ASSERT_TRUE(chatml.ok()) << chatml.status().ToString();
  EXPECT_EQ(*chatml,
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  Result<std::string> llama3 = RenderChatPrompt({.format = ChatFormat::kLlama3}, ask);
  ASSERT_TRUE(llama3.ok()) << llama3.status().ToString();
  EXPECT_EQ(*llama3,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are "
            "terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  Result<std::string> mistral = RenderChatPrompt({.format = ChatFormat::kMistral}, ask);
  ASSERT_TRUE(mistral.ok()) << mistral.status().ToString();
  EXPECT_EQ(*mistral, "<s> [INST] You are terse.\n\n2+2? [/INST]");
  EXPECT_FALSE(RenderChatPrompt({}, ask).ok());  // no template
  EXPECT_EQ(EndOfTurn(ChatFormat::kChatMl), "<|im_end|>");
  EXPECT_EQ(EndOfTurn(ChatFormat::kLlama3), "<|eot_id|>");
  EXPECT_EQ(EndOfTurn(ChatFormat::kMistral), "</s>");
  EXPECT_EQ(EndOfTurn(ChatFormat::kNone), "");
}

// Tool use: Qwen2.5's and Qwen3's release templates are kQwen (rendered: see QwenToolUse), Llama
// 3.1's kLlama31 (Llama31ToolUse); a Qwen or Llama 3.1 template whose tool clauses differ writes
// tool use in a way ferry does not render: a tool result and a role the template does not write
// are refused there, and a tool call under every template but those (one without tool use would
// train the turn without its calls). The templates without tool use, and chatml by name, write the
// roles as they are (a generic ChatML template writes "<|im_start|>tool").
TEST(ChatTemplateTest, ToolUseIsRefusedWhereFerryDoesNotRenderIt) {
  Result<std::string> qwen25 =
      ReadWholeFile(testing::SourceDir() + "/tests/chat_templates/qwen2.5.jinja");
  ASSERT_TRUE(qwen25.ok());
  std::string altered = *qwen25;  // another way to pick a call's fields
  altered.replace(altered.find("tool_call.function is defined"), 29, "tool_call.function");
  Result<std::string> llama31 =
      ReadWholeFile(testing::SourceDir() + "/tests/chat_templates/llama3.1.jinja");
  ASSERT_TRUE(llama31.ok());
  std::string altered_llama = *llama31;  // the tools indented otherwise
  for (size_t at; (at = altered_llama.find("tojson(indent=4)")) != std::string::npos;) {
    altered_llama.replace(at, 16, "tojson(indent=2)");
  }
  const std::pair<const char*, ToolUse> kTemplates[] = {{"qwen2.5", ToolUse::kQwen},
                                                        {"qwen3", ToolUse::kQwen},
                                                        {"altered", ToolUse::kIfTruthy},
                                                        {"llama3.1", ToolUse::kLlama31},
                                                        {"altered llama", ToolUse::kIfPresent},
                                                        {"llama3", ToolUse::kNone},
                                                        {"mistral-v0.2", ToolUse::kNone}};
  for (auto [name, tool_use] : kTemplates) {
    const std::string n = name;
    Result<std::string> text =
        n == "altered" ? Result<std::string>(altered)
        : n == "altered llama"
            ? Result<std::string>(altered_llama)
            : ReadWholeFile(testing::SourceDir() + "/tests/chat_templates/" + n + ".jinja");
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    const ChatTemplate t = ChatTemplateFromText(*text);
    EXPECT_EQ(t.tool_use, tool_use) << name;
    EXPECT_TRUE(RenderChat(t, kConversation).ok()) << name;
    const bool refuses = tool_use == ToolUse::kIfTruthy || tool_use == ToolUse::kIfPresent;
    EXPECT_EQ(RefusedToolUse(t, kConversation, /*tools_listed=*/true).empty(), !refuses) << name;
    std::vector<ChatMessage> chat = {{"user", "2+2?"}, {"assistant", ""}, {"tool", "4"}};
    chat[1].tool_calls_key = chat[1].tool_calls = true;
    chat[1].calls = {{.name = "add", .arguments_json = "{}"}};
    const std::string why = RefusedToolUse(t, chat, false);
    const bool renders = tool_use == ToolUse::kQwen || tool_use == ToolUse::kLlama31;
    if (renders) {
      EXPECT_EQ(why, "") << name;
      chat[0].tool_calls = true;  // a user's
      EXPECT_EQ(RefusedToolUse(t, chat, false),
                "message 0 has 'tool_calls' but is not the "
                "assistant's");
      chat[0].tool_calls = false;
    } else {
      EXPECT_EQ(why,
                "message 1 has 'tool_calls': ferry renders tool calls in Qwen2.5's, Qwen3's and "
                "Llama 3.1's templates only (one without tool use would train the turn without "
                "them); leave "
                "tool conversations out")
          << name;
    }
    chat[1].tool_calls = false;  // "tool_calls": [] or null: Llama 3.1's takes the key as a call
    EXPECT_EQ(RefusedToolUse(t, std::span(chat).first(2), false).empty(),
              tool_use != ToolUse::kIfPresent && tool_use != ToolUse::kLlama31)
        << name;
    chat[1].tool_calls_key = false;
    if (tool_use == ToolUse::kNone) continue;
    for (const char* role : {"tool", "ipython", "function"}) {
      chat[2].role = role;
      const std::string got = RefusedToolUse(t, chat, false);
      const bool result = std::string(role) == "tool" ||
                          (std::string(role) == "ipython" && tool_use == ToolUse::kIfPresent);
      if ((tool_use == ToolUse::kIfPresent && !result) || tool_use == ToolUse::kLlama31 ||
          (tool_use == ToolUse::kQwen && std::string(role) == "tool")) {
        EXPECT_EQ(got, "") << name << " " << role;  // written: Llama 3.1's any header, Qwen's
        continue;
      }
      const std::string want = !result ? "message 2 has role '" + std::string(role) +
                                             "', which the model's chat template does not write"
                                       : "message 2 is a tool result (role '" + std::string(role) +
                                             "'): the model's chat template writes tool use in "
                                             "its own format";
      EXPECT_EQ(got.substr(0, want.size()), want) << name << " " << role;
    }
  }
  const std::vector<ChatMessage> chat = {{"user", "2+2?"}, {"tool", "4"}};
  Result<RenderedText> r = RenderChat({.format = ChatFormat::kChatMl}, chat);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>tool\n4<|im_end|>\n");
}

// Qwen2.5's and Qwen3's tool use, written out from their templates: the tools listed in the
// system turn, an assistant's calls in <tool_call> tags after its content (Qwen2.5: each on a new
// line, arguments `tojson`; Qwen3: a new line only between content and a call, a string's
// arguments as they are), a run of results one user turn of <tool_response>s. The calls are
// trained with the turn; the results are context.
TEST(ChatTemplateTest, QwenToolUse) {
  const std::string kTools =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
      "provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"name\": "
      "\"add\"}\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
  std::vector<ChatMessage> chat = {{"system", "S"}, {"user", "2+2?"}, {"assistant", ""},
                                   {"tool", "4"},   {"tool", "5"},    {"assistant", "It is 4."}};
  chat[2].tool_calls_key = chat[2].tool_calls = true;
  chat[2].calls = {{.name = "add", .arguments_json = "{\"b\": 2, \"a\": 2}"},
                   {.name = "add", .arguments_json = "\"{}\"", .arguments_text = "{}"}};
  const std::vector<std::string> tools = {"{\"name\": \"add\"}"};
  const std::string calls25 =
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"b\": 2, \"a\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"add\", \"arguments\": \"{}\"}\n</tool_call>";
  const std::string results =
      "<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n5\n"
      "</tool_response><|im_end|>\n";
  ChatTemplate qwen25{.format = ChatFormat::kChatMl,
                      .default_system =
                          "You are Qwen, created by Alibaba Cloud. You are a "
                          "helpful assistant.",
                      .tool_use = ToolUse::kQwen};
  Result<RenderedText> r = RenderChat(qwen25, chat, tools);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, "<|im_start|>system\nS\n\n" + kTools + "<|im_start|>user\n2+2?<|im_end|>\n" +
                         "<|im_start|>assistant\n" + calls25 + "<|im_end|>\n" + results +
                         "<|im_start|>assistant\nIt is 4.<|im_end|>\n");
  EXPECT_EQ(TrainedParts(*r),
            (std::vector<std::string>{calls25 + "<|im_end|>", "It is 4.<|im_end|>"}));
  chat[2].content = "Let me add.";
  r = RenderChat(qwen25, std::span(chat).subspan(1), tools);  // no system: Qwen's default
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(
      r->text.starts_with("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
                          "You are a helpful assistant.\n\n# Tools"))
      << r->text;
  EXPECT_NE(r->text.find("<|im_start|>assistant\nLet me add.\n<tool_call>"), std::string::npos);

  const ChatTemplate qwen3{.format = ChatFormat::kQwen3, .tool_use = ToolUse::kQwen};
  r = RenderChat(qwen3, chat, tools);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string calls3 =
      "\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"b\": 2, \"a\": 2}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>";
  EXPECT_EQ(r->text, "<|im_start|>system\nS\n\n" + kTools + "<|im_start|>user\n2+2?<|im_end|>\n" +
                         "<|im_start|>assistant\nLet me add." + calls3 + "<|im_end|>\n" + results +
                         "<|im_start|>assistant\n<think>\n\n</think>\n\nIt is 4.<|im_end|>\n");
  EXPECT_EQ(TrainedParts(*r), (std::vector<std::string>{"Let me add." + calls3 + "<|im_end|>",
                                                        "It is 4.<|im_end|>"}));
  chat[2].content = "";  // no content: the first call right after the header (the chat's last
                         // turn here, so with its empty <think> block)
  r = RenderChat(qwen3, std::span(chat).subspan(1, 2));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text,
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
            "</think>\n\n" +
                calls3.substr(1) + "<|im_end|>\n");
}

// Llama 3.1's tool use, written out from its template: with `tools` the system turn opens with
// "Environment: ipython", the first user message carries the tools (`tojson(indent=4)` each) after
// the template's instructions, an assistant's one call is its whole turn ({"name", "parameters"}:
// its content dropped) and trained, a "tool" or "ipython" result is an ipython turn of the
// content's JSON (context). Without `tools` the calls and results render the same, and the
// preamble is left out; `tools: []` writes the preamble with no tool.
TEST(ChatTemplateTest, Llama31ToolUse) {
  Result<std::string> source =
      ReadWholeFile(testing::SourceDir() + "/tests/chat_templates/llama3.1.jinja");
  ASSERT_TRUE(source.ok());
  const ChatTemplate t = ChatTemplateFromText(*source);
  ASSERT_EQ(t.tool_use, ToolUse::kLlama31);
  std::vector<ChatMessage> chat = {{"system", " S "},        {"user", " 2+2? "},
                                   {"assistant", "ignored"}, {"tool", "4 \"x\"\n"},
                                   {"ipython", "5"},         {"assistant", " It is 4. "}};
  chat[2].tool_calls_key = chat[2].tool_calls = true;
  chat[2].calls = {{.name = "add", .arguments_json = "{\"b\": 2, \"a\": 2}"}};
  const std::vector<std::string> tools = {"{\n    \"name\": \"add\"\n}", "{}"};
  const std::string head = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n";
  const std::string date = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
  const std::string preamble =
      "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
      "respond with a JSON for a function call with its proper arguments that best answers the "
      "given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
      "dictionary of argument name and its value}.Do not use variables.\n\n";
  const std::string call = "{\"name\": \"add\", \"parameters\": {\"b\": 2, \"a\": 2}}<|eot_id|>";
  const std::string rest =
      "<|start_header_id|>assistant<|end_header_id|>\n\n" + call +
      "<|start_header_id|>ipython<|end_header_id|>\n\n\"4 \\\"x\\\"\\n\"<|eot_id|>"
      "<|start_header_id|>ipython<|end_header_id|>\n\n\"5\"<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nIt is 4.<|eot_id|>";
  Result<RenderedText> r = RenderChat(t, chat, tools, /*tools_listed=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, head + "Environment: ipython\n" + date + "S<|eot_id|>" + preamble +
                         "{\n    \"name\": \"add\"\n}\n\n{}\n\n2+2?<|eot_id|>" + rest);
  EXPECT_EQ(TrainedParts(*r), (std::vector<std::string>{call, "It is 4.<|eot_id|>"}));
  r = RenderChat(t, chat, {}, /*tools_listed=*/true);  // `tools: []`
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, head + "Environment: ipython\n" + date + "S<|eot_id|>" + preamble +
                         "2+2?<|eot_id|>" + rest);
  r = RenderChat(t, chat);  // no `tools`
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, head + date + "S<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n" +
                         "2+2?<|eot_id|>" + rest);

  // What the template raises on, or writes otherwise: refused, naming the message.
  chat[2].calls.push_back(chat[2].calls[0]);
  r = RenderChat(t, chat);
  EXPECT_EQ(r.status().message(),
            "message 2 has 2 tool calls: the model's chat template (Llama 3.1's) takes one call a "
            "message");
  chat[2].calls.pop_back();
  EXPECT_EQ(RefusedToolUse(t, std::span(chat).subspan(2), /*tools_listed=*/true),
            "the line lists 'tools', which the model's chat template (Llama 3.1's) puts in the "
            "first user message, and message 0 is not the user's");
  EXPECT_EQ(RefusedToolUse(t, std::span(chat).first(1), /*tools_listed=*/true),
            "the line lists 'tools', which the model's chat template (Llama 3.1's) puts in the "
            "first user message, and message 1 is not the user's");
  chat[2].tool_calls = false;  // "tool_calls": null or []
  EXPECT_EQ(RefusedToolUse(t, chat, false),
            "message 2 has 'tool_calls' that list no call: the model's chat template (Llama "
            "3.1's) takes one call a message");
}

TEST(ChatTemplateTest, DetectsFromModelFolder) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "ferry_chat_template_test";
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name, std::ios::trunc) << text;
  };
  write("config.json", R"({"model_type": "mistral"})");
  EXPECT_EQ(DetectChatTemplate(dir.string()).format, ChatFormat::kMistral);
  write("config.json", R"({"model_type": "qwen3"})");
  EXPECT_EQ(DetectChatTemplate(dir.string()).format, ChatFormat::kQwen3);
  write("tokenizer_config.json",
        R"({"chat_template": "{{ '<|start_header_id|>' + message['role'] }}"})");
  EXPECT_EQ(DetectChatTemplate(dir.string()).format, ChatFormat::kLlama3);
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "[INST]"},
                              {"name": "default", "template": "<|im_start|>"}]})");
  EXPECT_EQ(DetectChatTemplate(dir.string()).format, ChatFormat::kChatMl);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(DetectChatTemplate(dir.string()).format, ChatFormat::kNone);
}

}  // namespace
}  // namespace ferry
