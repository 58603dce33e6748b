#include "engine/train/chat_template.h"

#include <iterator>
#include <utility>

#include "engine/json.h"
#include "engine/text/utf8_text.h"
#include "engine/train/python_json.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

constexpr std::string_view kQwen25System =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
constexpr std::string_view kQwen2System = "You are a helpful assistant.";
// Qwen3's release template (Qwen3-0.6B ... 235B-A22B, 2025-04): what RenderQwen3 writes, as the
// template's text says it (each marker is in it; a <think> template without one of them renders
// otherwise).
constexpr std::string_view kQwen3Markers[] = {
    "message.content.split('</think>')[-1].lstrip('\\n')",
    "message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n')",
    "loop.index0 > ns.last_query_index",
    "loop.last or (not loop.last and reasoning_content)",
    "'\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + "
    "content.lstrip('\\n')",
    "message.content.startswith('<tool_response>') and "
    "message.content.endswith('</tool_response>')"};
// The tool clauses of Qwen2.5's and Qwen3's release templates, as their text says them.
constexpr std::string_view kQwenToolMarkers[] = {
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou "
    "are provided with function signatures within <tools></tools> XML tags:\\n<tools>\"",
    "{{- tool | tojson }}",
    "\"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\"",
    "'<|im_start|>user'",
    "'\\n<tool_response>\\n'",
    "'\\n</tool_response>'",
    "messages[loop.index0 + 1].role != \"tool\"",
    "<tool_call>\\n{\"name\": \"'",
    "'\", \"arguments\": '",
    "'}\\n</tool_call>'"};
constexpr std::string_view kQwen25ToolMarkers[] = {
    "message.role == \"assistant\" and not message.tool_calls",
    "{{- '\\n' + message.content }}",
    "{%- if tool_call.function is defined %}",
    "'\\n<tool_call>\\n{\"name\": \"'",
    "{{- tool_call.arguments | tojson }}",
    "(loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\")"};
constexpr std::string_view kQwen3ToolMarkers[] = {
    "{%- if (loop.first and content) or (not loop.first) %}",
    "{%- if tool_call.function %}",
    "{{- '<tool_call>\\n{\"name\": \"' }}",
    "{%- if tool_call.arguments is string %}",
    "loop.first or (messages[loop.index0 - 1].role != \"tool\")",
    "{{- messages[0].content + '\\n\\n' }}"};
// The tool clauses of Llama 3.1's template (Meta's Llama-3.1 and 3.3 Instruct), as its text says
// them: what RenderChat writes for kLlama31.
constexpr std::string_view kLlama31ToolMarkers[] = {
    "set tools_in_user_message = true",
    "\"Environment: ipython\\n\"",
    "first_user_message = messages[0]['content']|trim",
    "'<|start_header_id|>user<|end_header_id|>\\n\\n'",
    "\"Given the following functions, please respond with a JSON for a function call \"",
    "\"with its proper arguments that best answers the given prompt.\\n\\n\"",
    "'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
    "and its value}.'",
    "\"Do not use variables.\\n\\n\"",
    "t | tojson(indent=4)",
    "first_user_message + \"<|eot_id|>\"",
    "not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message)",
    "not message.tool_calls|length == 1",
    "message.tool_calls[0].function",
    "'{\"name\": \"' + tool_call.name + '\", '",
    "'\"parameters\": '",
    "tool_call.arguments | tojson",
    "\"<|start_header_id|>ipython<|end_header_id|>\\n\\n\"",
    "message.content is mapping or message.content is iterable",
    "message.content | tojson"};
constexpr std::string_view kLlama31ToolsPreamble =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
    "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
    "variables.\n\n";
// Llama 3.1+'s system preamble with the templates' default date.
constexpr std::string_view kKnowledgeDate =
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";

// Python's str.isspace, what Jinja's `trim` (str.strip) removes: Unicode White_Space and the
// separators U+001C..U+001F.
bool IsPythonSpace(char32_t c) { return IsUnicodeWhitespace(c) || (c >= 0x1C && c <= 0x1F); }

// Jinja's `trim`: whitespace (IsPythonSpace) removed from both ends; invalid UTF-8 stops it.
std::string_view Trim(std::string_view s) {
  char32_t cp;
  size_t b = 0;
  while (b < s.size()) {
    const size_t n = Utf8CharAt(s, b, &cp);
    if (n == 0 || !IsPythonSpace(cp)) break;
    b += n;
  }
  size_t e = s.size();
  while (e > b) {
    size_t start = e - 1;  // the last character's first byte: back over continuation bytes
    while (start > b && e - start < 4 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
    if (Utf8CharAt(s, start, &cp) != e - start || !IsPythonSpace(cp)) break;
    e = start;
  }
  return s.substr(b, e - b);
}

// Appends to a RenderedText, marking what `Trained` appends as carrying the loss.
struct Writer {
  RenderedText out;
  void Context(std::string_view s) { out.text += s; }
  void Trained(std::string_view s) {
    const size_t b = out.text.size();
    out.text += s;
    if (s.empty()) return;
    if (!out.trained.empty() && out.trained.back().second == b) {
      out.trained.back().second = out.text.size();  // contiguous: one range
    } else {
      out.trained.emplace_back(b, out.text.size());
    }
  }
};

// Whether `path` could be read whole into `out` (the folder may lack it).
bool ReadText(const std::string& path, std::string* out) {
  Result<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return false;
  *out = std::move(*text);
  return true;
}

Result<RenderedText> RenderMistral(std::span<const ChatMessage> messages) {
  Writer w;
  w.Context("<s>");
  std::string_view system;
  size_t first = 0;
  if (messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    if (m.role != "user" && m.role != "assistant") {
      return Status::InvalidArgument("the mistral template takes only user and assistant roles " +
                                     std::string("after an optional first system message; got '") +
                                     m.role + "' in message " + std::to_string(i));
    }
    if ((m.role == "user") != user_turn) {
      return Status::InvalidArgument(
          "the mistral template needs user and assistant turns to alternate, starting with user "
          "(message " +
          std::to_string(i) + " is '" + m.role + "')");
    }
    if (user_turn) {
      w.Context(" [INST] ");
      if (i == first && first == 1) {
        w.Context(system);
        w.Context("\n\n");
      }
      w.Context(m.content);
      w.Context(" [/INST]");
    } else {
      w.Context(" ");
      w.Trained(m.content);
      w.Trained("</s>");
    }
  }
  return std::move(w.out);
}

// Python's str.strip / lstrip / rstrip of '\n' only, as the Qwen3 template calls them.
std::string_view StripNewlines(std::string_view s, bool front, bool back) {
  while (front && s.starts_with('\n')) s.remove_prefix(1);
  while (back && s.ends_with('\n')) s.remove_suffix(1);
  return s;
}

// Qwen2.5's and Qwen3's tool list, after the system text: the tools, one `tojson` a line.
std::string ToolsPrompt(std::span<const std::string> tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
      "provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const std::string& tool : tools) out += "\n" + tool;
  return out +
         "\n</tools>\n\nFor each function call, return a json object with function name and "
         "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
         "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
}

// An assistant turn's tool calls as Qwen's templates write them after its content: each in
// <tool_call> tags, on a line of its own after the content (when there is some) and after the
// call before it. `arguments_as_text`: Qwen3's (a string's text as it is); else Qwen2.5's
// (always `tojson`).
std::string ToolCallsText(const ChatMessage& m, bool after_content, bool arguments_as_text) {
  std::string out;
  for (size_t k = 0; m.tool_calls && k < m.calls.size(); ++k) {
    const ToolCall& c = m.calls[k];
    if (k > 0 || after_content) out += "\n";
    out += "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " +
           (arguments_as_text && c.arguments_text ? *c.arguments_text : c.arguments_json) +
           "}\n</tool_call>";
  }
  return out;
}

// Message i, a "tool" result, as Qwen's templates write it: a run of results is one user turn,
// each in <tool_response> tags (context).
void WriteToolResult(Writer& w, std::span<const ChatMessage> messages, size_t i) {
  if (i == 0 || messages[i - 1].role != "tool") w.Context("<|im_start|>user");
  w.Context("\n<tool_response>\n" + messages[i].content + "\n</tool_response>");
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") w.Context("<|im_end|>\n");
}

// `tool_use`: the template's (kQwen: "tool" results written; else refused as another role).
Result<RenderedText> RenderQwen3(std::span<const ChatMessage> messages,
                                 std::span<const std::string> tools, bool tool_use) {
  // The last user query: a user message that is not a tool's response (none: the last message).
  size_t last_query = messages.size() - 1;
  for (size_t k = messages.size(); k-- > 0;) {
    const std::string_view c = messages[k].content;
    if (messages[k].role == "user" &&
        !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  Writer w;
  const bool system_first = messages[0].role == "system";
  if (!tools.empty()) {  // the system turn lists the tools
    w.Context("<|im_start|>system\n" + (system_first ? messages[0].content + "\n\n" : "") +
              ToolsPrompt(tools));
  }
  for (size_t i = !tools.empty() && system_first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system" || m.role == "user") {
      w.Context("<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n");
      continue;
    }
    if (m.role == "tool" && tool_use) {
      WriteToolResult(w, messages, i);
      continue;
    }
    if (m.role != "assistant") {
      return Status::InvalidArgument(
          "the qwen3 template takes system, user and assistant roles; "
          "got '" +
          m.role + "' in message " + std::to_string(i));
    }
    constexpr std::string_view kOpen = "<think>", kClose = "</think>";
    std::string_view answer = m.content, reasoning;
    if (m.reasoning.has_value()) {
      reasoning = *m.reasoning;
    } else if (const size_t end = answer.find(kClose); end != std::string_view::npos) {
      reasoning = StripNewlines(answer.substr(0, end), false, true);
      if (const size_t open = reasoning.rfind(kOpen); open != std::string_view::npos) {
        reasoning.remove_prefix(open + kOpen.size());
      }
      reasoning = StripNewlines(reasoning, true, false);
      answer = StripNewlines(answer.substr(answer.rfind(kClose) + kClose.size()), true, false);
    }
    w.Context("<|im_start|>assistant\n");
    const bool has_content = !answer.empty();  // the template's `content`, before its lstrip
    if (i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
      const std::string_view thought = StripNewlines(reasoning, true, true);
      const std::string block = "<think>\n" + std::string(thought) + "\n</think>\n\n";
      thought.empty() ? w.Context(block) : w.Trained(block);
      answer = StripNewlines(answer, true, false);
    }
    w.Trained(answer);
    w.Trained(ToolCallsText(m, has_content, /*arguments_as_text=*/true));
    w.Trained("<|im_end|>");
    w.Context("\n");
  }
  return std::move(w.out);
}

// Per format: the marker that ends an assistant's turn, and the header add_generation_prompt=True
// adds for the answer (Mistral v0.2's " [/INST]" needs none).
struct FormatInfo {
  ChatFormat format;
  const char* end_of_turn;
  const char* answer_header;
};
constexpr FormatInfo kFormats[] = {
    {ChatFormat::kChatMl, "<|im_end|>", "<|im_start|>assistant\n"},
    {ChatFormat::kQwen3, "<|im_end|>", "<|im_start|>assistant\n"},
    {ChatFormat::kLlama3, "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n"},
    {ChatFormat::kMistral, "</s>", ""},
    {ChatFormat::kNone, "", ""}};

const FormatInfo& InfoOf(ChatFormat f) {
  for (const FormatInfo& i : kFormats) {
    if (i.format == f) return i;
  }
  return kFormats[std::size(kFormats) - 1];  // none
}

}  // namespace

ChatTemplate ChatTemplateFromText(std::string_view text) {
  auto has = [&](std::string_view marker) { return text.find(marker) != std::string_view::npos; };
  ChatTemplate t;
  if (has("<|im_start|>") && has("<think>")) {
    t.format = ChatFormat::kQwen3;
    for (std::string_view marker : kQwen3Markers) {
      if (!has(marker)) {
        t.unsupported =
            "a ChatML template with <think> blocks other than Qwen3's (QwQ's, or a "
            "later Qwen3 release's)";
      }
    }
  } else if (has("<|im_start|>")) {
    t.format = ChatFormat::kChatMl;
    if (has(kQwen25System)) {
      t.default_system = kQwen25System;
    } else if (has(kQwen2System)) {
      t.default_system = kQwen2System;
    }
  } else if (has("<|start_header_id|>")) {
    t.format = ChatFormat::kLlama3;
    t.knowledge_date = has("Cutting Knowledge Date");
  } else if (has("<<SYS>>")) {
    t.format = ChatFormat::kMistral;
    t.unsupported = "Llama 2's [INST] <<SYS>> template";
  } else if (has("[INST]")) {
    t.format = ChatFormat::kMistral;
    // v0.2's writes " [INST] " (spaces both sides) and " " + answer; v0.1's "[INST] " + ..., and
    // v0.3's "[INST] " ... "[/INST]" with trimmed answers, render differently.
    if (!has("' [INST] '") && !has("\" [INST] \"")) {
      t.unsupported = "an [INST] template other than Mistral v0.2's (v0.1, v0.3 or later)";
    }
  }
  // Qwen2.5's and Qwen3's write `tools`, `tool_calls` and "tool" results; Llama 3.1's too
  // ("ipython"); templates without tool use name none of them.
  if (t.format != ChatFormat::kNone && (has("tool_calls") || has("tools"))) {
    t.tool_use = t.format == ChatFormat::kLlama3 ? ToolUse::kIfPresent : ToolUse::kIfTruthy;
    // Qwen2.5's and Qwen3's tool clauses, as ToolsPrompt, ToolCallText and WriteToolResult write
    // them, and the ways each picks a call's fields.
    const bool qwen3 = t.format == ChatFormat::kQwen3 && t.unsupported.empty();
    const bool qwen25 = t.format == ChatFormat::kChatMl && t.default_system == kQwen25System;
    bool known = qwen3 || qwen25;
    for (std::string_view marker : kQwenToolMarkers) known = known && has(marker);
    for (std::string_view marker : qwen3 ? kQwen3ToolMarkers : kQwen25ToolMarkers) {
      known = known && has(marker);
    }
    if (known) t.tool_use = ToolUse::kQwen;
    bool llama31 = t.format == ChatFormat::kLlama3 && t.knowledge_date;
    for (std::string_view marker : kLlama31ToolMarkers) llama31 = llama31 && has(marker);
    if (llama31) t.tool_use = ToolUse::kLlama31;
  }
  return t;
}

ChatTemplate DetectChatTemplate(const std::string& model_dir) {
  std::string text;
  if (ReadText(model_dir + "/tokenizer_config.json", &text)) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("chat_template")) {
      const nlohmann::json& ct = j["chat_template"];
      std::string tmpl;
      if (ct.is_string()) tmpl = ct.get<std::string>();
      // A list of named templates: the "default" one (or the first).
      if (ct.is_array()) {
        for (const nlohmann::json& e : ct) {
          if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
          if (tmpl.empty() || e.value("name", "") == "default") {
            tmpl = e["template"].get<std::string>();
          }
        }
      }
      ChatTemplate t = ChatTemplateFromText(tmpl);
      if (t.format != ChatFormat::kNone) return t;
    }
  }
  if (ReadText(model_dir + "/config.json", &text)) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    const std::string type = j.is_object() ? j.value("model_type", "") : "";
    ChatTemplate t;
    if (type == "qwen2") t.format = ChatFormat::kChatMl;
    if (type == "qwen3") t.format = ChatFormat::kQwen3;
    // Qwen3's: the release template's (as the format assumes); Qwen2's or Qwen2.5's: refused.
    if (type == "qwen2") t.tool_use = ToolUse::kIfTruthy;
    if (type == "qwen3") t.tool_use = ToolUse::kQwen;
    if (type == "mistral") t.format = ChatFormat::kMistral;
    return t;
  }
  return {};
}

Result<RenderedText> RenderChat(const ChatTemplate& t, std::span<const ChatMessage> messages,
                                std::span<const std::string> tools, bool tools_listed) {
  if (t.format == ChatFormat::kNone) {
    return Status::InvalidArgument(
        "a chat needs a chat template and the model has none that ferry knows; pass "
        "--chat-template " +
        ChatFormatNames("|", /*with_none=*/false));
  }
  if (!t.unsupported.empty()) {
    return Status::InvalidArgument("the model's chat template (" + t.unsupported +
                                   ") is not one ferry renders exactly; pass --chat-template " +
                                   ChatFormatNames("|", /*with_none=*/false) +
                                   " to choose one ferry knows");
  }
  if (messages.empty()) return Status::InvalidArgument("the chat has no turn");
  const bool llama31 = t.tool_use == ToolUse::kLlama31;
  tools_listed = llama31 && (tools_listed || !tools.empty());
  if (std::string why = RefusedToolUse(t, messages, tools_listed); !why.empty()) {
    return Status::InvalidArgument(why);
  }
  if (t.format == ChatFormat::kMistral) return RenderMistral(messages);
  if (t.tool_use != ToolUse::kQwen && !llama31) tools = {};  // ignored, or refused above
  if (t.format == ChatFormat::kQwen3) {
    return RenderQwen3(messages, tools, t.tool_use == ToolUse::kQwen);
  }
  Writer w;
  if (t.format == ChatFormat::kChatMl) {
    const bool system_first = messages[0].role == "system";
    if (!tools.empty()) {  // Qwen2.5's: the system turn lists the tools
      w.Context("<|im_start|>system\n" +
                std::string(system_first ? std::string_view(messages[0].content) : kQwen25System) +
                "\n\n" + ToolsPrompt(tools));
    } else if (!t.default_system.empty() && !system_first) {
      w.Context("<|im_start|>system\n" + t.default_system + "<|im_end|>\n");
    }
    for (size_t i = !tools.empty() && system_first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (t.tool_use == ToolUse::kQwen && m.role == "tool") {
        WriteToolResult(w, messages, i);
        continue;
      }
      if (m.role == "assistant" && m.tool_calls) {  // "\n" content, then "\n<tool_call>..." each
        w.Context("<|im_start|>assistant\n");
        w.Trained(m.content + ToolCallsText(m, !m.content.empty(), /*arguments_as_text=*/false));
        w.Trained("<|im_end|>");
        w.Context("\n");
        continue;
      }
      w.Context("<|im_start|>" + m.role + "\n");
      if (m.role == "assistant") {
        w.Trained(m.content);
        w.Trained("<|im_end|>");
      } else {
        w.Context(m.content + "<|im_end|>");
      }
      w.Context("\n");
    }
    return std::move(w.out);
  }
  // Llama 3.
  w.Context("<|begin_of_text|>");
  std::span<const ChatMessage> rest = messages;
  if (t.knowledge_date) {
    std::string_view system;
    if (messages[0].role == "system") {
      system = Trim(messages[0].content);
      rest = rest.subspan(1);
    }
    w.Context("<|start_header_id|>system<|end_header_id|>\n\n");
    if (tools_listed) w.Context("Environment: ipython\n");
    w.Context(kKnowledgeDate);
    w.Context(system);
    w.Context("<|eot_id|>");
  }
  if (tools_listed) {  // the tools go in the first user message (RefusedToolUse: there is one)
    w.Context("<|start_header_id|>user<|end_header_id|>\n\n");
    w.Context(kLlama31ToolsPreamble);
    for (const std::string& tool : tools) w.Context(tool + "\n\n");
    w.Context(Trim(rest[0].content));
    w.Context("<|eot_id|>");
    rest = rest.subspan(1);
  }
  for (size_t i = 0; i < rest.size(); ++i) {
    const ChatMessage& m = rest[i];
    if (llama31 && m.tool_calls_key && m.calls.size() != 1) {
      return Status::InvalidArgument(
          "message " + std::to_string(i + size_t(rest.data() - messages.data())) + " has " +
          std::to_string(m.calls.size()) +
          " tool calls: the model's chat template (Llama 3.1's) takes one call a message");
    }
    if (llama31 && (m.role == "tool" || m.role == "ipython")) {  // the content's `tojson`
      w.Context("<|start_header_id|>ipython<|end_header_id|>\n\n" +
                m.content_json.value_or(PythonJsonDumps(nlohmann::ordered_json(m.content))) +
                "<|eot_id|>");
      continue;
    }
    if (llama31 && m.tool_calls_key) {  // its one call (RefusedToolUse), in place of its content
      w.Context("<|start_header_id|>assistant<|end_header_id|>\n\n");
      w.Trained("{\"name\": \"" + m.calls.at(0).name +
                "\", \"parameters\": " + m.calls.at(0).arguments_json + "}");
      w.Trained("<|eot_id|>");
      continue;
    }
    w.Context("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n");
    if (m.role == "assistant") {
      w.Trained(Trim(m.content));
      w.Trained("<|eot_id|>");
    } else {
      w.Context(Trim(m.content));
      w.Context("<|eot_id|>");
    }
  }
  return std::move(w.out);
}

std::string RefusedToolUse(const ChatTemplate& t, std::span<const ChatMessage> messages,
                           bool tools_listed) {
  const std::string own_way =
      ": the model's chat template writes tool use in its own format, which ferry does not "
      "render (it renders Qwen2.5's, Qwen3's and Llama 3.1's); leave tool conversations out";
  const bool qwen = t.tool_use == ToolUse::kQwen;
  if (t.tool_use != ToolUse::kLlama31) {
    for (size_t i = 0; i < messages.size(); ++i) {
      if (!messages[i].content_json) continue;
      return "message " + std::to_string(i) + " (" + messages[i].role +
             ") has a JSON object or array as its content, which the model's chat template "
             "would write as Python's text of it ({'a': None}), not as JSON (only Llama 3.1's "
             "writes a tool result's JSON); give it as a string";
    }
  }
  if (t.tool_use == ToolUse::kLlama31) {
    const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
    if (tools_listed && (first == messages.size() || messages[first].role != "user")) {
      return "the line lists 'tools', which the model's chat template (Llama 3.1's) puts in the "
             "first user message, and message " +
             std::to_string(first) + " is not the user's";
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if ((m.tool_calls_key || m.tool_calls) && m.role != "assistant") {
        return "message " + std::to_string(i) + " has 'tool_calls' but is not the assistant's";
      }
      if (m.tool_calls_key && !m.tool_calls) {
        return "message " + std::to_string(i) +
               " has 'tool_calls' that list no call: the model's chat template (Llama 3.1's) "
               "takes one call a message";
      }
    }
    return "";
  }
  if (tools_listed && t.tool_use != ToolUse::kNone && !qwen) {
    return "the line lists 'tools'" + own_way;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string which = "message " + std::to_string(i);
    auto unwritten_role = [&] {  // built only when refused: this runs for every line
      return which + " has role '" + m.role +
             "', which the model's chat template does not write (it takes system, user, "
             "assistant and tool)";
    };
    if (qwen) {
      if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
        return unwritten_role();
      }
      if (m.tool_calls && m.role != "assistant") {
        return which + " has 'tool_calls' but is not the assistant's";
      }
      continue;
    }
    if (m.tool_calls || (m.tool_calls_key && t.tool_use == ToolUse::kIfPresent)) {
      return which +
             " has 'tool_calls': ferry renders tool calls in Qwen2.5's, Qwen3's and Llama 3.1's " +
             "templates only (one without tool use would train the turn without them); leave " +
             "tool conversations out";
    }
    const bool result =
        m.role == "tool" || (m.role == "ipython" && t.tool_use == ToolUse::kIfPresent);
    if (t.tool_use != ToolUse::kNone && result) {
      return which + " is a tool result (role '" + m.role + "')" + own_way;
    }
    if (t.tool_use == ToolUse::kIfTruthy && m.role != "system" && m.role != "user" &&
        m.role != "assistant") {
      return unwritten_role();
    }
  }
  return "";
}

Result<std::string> RenderChatPrompt(const ChatTemplate& t, std::span<const ChatMessage> messages) {
  FERRY_ASSIGN_OR_RETURN(RenderedText r, RenderChat(t, messages));
  std::string prompt = r.text + InfoOf(t.format).answer_header;
  if (t.format == ChatFormat::kQwen3 && !t.enable_thinking) prompt += "<think>\n\n</think>\n\n";
  return prompt;
}

std::string_view EndOfTurn(ChatFormat f) { return InfoOf(f).end_of_turn; }

}  // namespace ferry
