// Chat templates: a conversation (`messages`: role + content) rendered as text the way the model
// family's Hugging Face chat template renders it (apply_chat_template, tokenize=False,
// add_generation_prompt=False), with the byte ranges that carry the loss. There is no Jinja
// engine: the families' templates are written out here.
//
//  chatml   (Qwen2/2.5): for each message
//             "<|im_start|>" role "\n" content "<|im_end|>\n"
//           with `default_system` first when the template has one and the conversation has no
//           system message (Qwen2.5's "You are Qwen, created by Alibaba Cloud. ...").
//  qwen3    (Qwen3's release template: ChatML with <think> blocks; roles system, user, assistant):
//           an assistant message's content splits at "</think>" into reasoning (after the last
//           "<think>" before the first "</think>", newlines trimmed) and the answer (after the
//           last "</think>", leading newlines trimmed), unless the message gives
//           `reasoning_content`. An assistant turn after the last user query (a user message
//           that is not a "<tool_response>...</tool_response>") is written
//             "<|im_start|>assistant\n<think>\n" reasoning "\n</think>\n\n" answer "<|im_end|>\n"
//           when it is the last message or has reasoning (so a conversation's final answer always
//           carries the block, empty or not); every other assistant turn is
//             "<|im_start|>assistant\n" answer "<|im_end|>\n"  (earlier reasoning dropped).
//           The template is not incremental: a turn renders differently once a user query
//           follows it.
//  tools    (chatml from Qwen2.5's template, qwen3; ToolUse::kQwen): with a line's `tools`, the
//           system turn is "<|im_start|>system\n" system "\n\n" + the tools prompt (each tool's
//           JSON a line in <tools></tools>) + "<|im_end|>\n" (Qwen2.5: its default system when
//           none is given; Qwen3: none, and no "\n\n"); an assistant's calls follow its answer,
//           each "<tool_call>\n{\"name\": \"" name "\", \"arguments\": " arguments
//           "}\n</tool_call>" (Qwen2.5: each after "\n", arguments as JSON; Qwen3: "\n" between the
//           answer, if any, and the first and between calls, arguments that are a JSON string as
//           they are); a run of "tool" results is one turn "<|im_start|>user" +
//           ("\n<tool_response>\n" result
//           "\n</tool_response>") each + "<|im_end|>\n". Calls are trained with their turn.
//  llama3   (Llama 3 / 3.x header format): "<|begin_of_text|>" then for each message
//             "<|start_header_id|>" role "<|end_header_id|>\n\n" trim(content) "<|eot_id|>"
//           Llama 3.1/3.2/3.3's templates (detected by their "Cutting Knowledge Date" text:
//           ChatTemplate::knowledge_date) always open with a system turn whose content is
//             "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" trim(system)
//           (the system message, if any, moves there; "26 Jul 2024" is the templates' own default
//           date — Llama 3.2's uses today's date when the caller provides strftime_now; ferry
//           keeps the fixed one so that a dataset tokenizes the same every day).
//  tools    (Llama 3.1's template, ToolUse::kLlama31): with a line's `tools` (any list, [] too),
//           the system turn's content starts "Environment: ipython\n", and the first message
//           after the system's (a user's) becomes
//             "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, ..."
//             + each tool's `tojson(indent=4)` + "\n\n" + trim(content) + "<|eot_id|>";
//           an assistant's one tool call (its `function`) is the whole turn, its content dropped:
//             header "{\"name\": \"" name "\", \"parameters\": " tojson(arguments) "}<|eot_id|>"
//           (trained as the turn's content); a "tool" or "ipython" result is
//             "<|start_header_id|>ipython<|end_header_id|>\n\n" tojson(content) "<|eot_id|>"
//           (a string's JSON, quotes and escapes: the template's `is iterable` takes strings).
//  mistral  (Mistral-7B-Instruct-v0.2 / Mixtral): "<s>" then, after an optional first system
//           message, strictly alternating user/assistant turns:
//             user       " [INST] " [system "\n\n" on the first user turn] content " [/INST]"
//             assistant  " " content "</s>"
//
// Detected but refused (ChatTemplate::unsupported, RenderChat says so and suggests
// --chat-template): Llama 2's "<<SYS>>" template and [INST] templates other than v0.2's
// (Mistral v0.1's, v0.3's "[INST]" without spaces and trimmed answers, tool-calling v0.3+).
// tests/dataset_check.py renders the real Jinja templates (tests/chat_templates/) with jinja2
// and compares them with ferry's rendering.
//
// Trained ranges: each assistant message's content and its end-of-turn marker ("<|im_end|>",
// "<|eot_id|>", "</s>"); the role header, the newline after "<|im_end|>" and everything else is
// context only. qwen3: the answer and "<|im_end|>", and a <think> block when it holds reasoning
// (the model wrote it); an empty block is context, as the template's prompt with
// enable_thinking=False holds it.
//
// Plain functions and value types; thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/job/chat_format.h"
#include "kernels/status.h"

namespace ferry {

// Tool use in a chat template (a line's `tools`, an assistant's `tool_calls`, "tool" results):
enum class ToolUse {
  kNone,     // none (Llama 3.0's, Mistral v0.2's): `tools` ignored, every role written as is
  kQwen,     // Qwen2.5's and Qwen3's release templates (and qwen3 by name), whose tool clauses
             // ferry renders as they render them (below); other roles are not written
  kLlama31,  // Llama 3.1's (found by its tool clauses' text), rendered as it renders them
  // Refused (RefusedToolUse): templates that write tool use in a way ferry does not render.
  kIfTruthy,   // Qwen-like ones other than the release templates (and a qwen2 model_type without
               // a template): `if tools`, `if message.tool_calls`; other roles not written
  kIfPresent,  // Llama 3.1-like ones other than Llama 3.1's: `tools is not none`, `'tool_calls'
               // in message`, "tool"/"ipython" results (written as ipython turns)
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::kNone;
  std::string default_system = {};  // chatml only: a system message used when none is given
  bool knowledge_date = false;      // llama3 only: Llama 3.1+'s "Cutting Knowledge Date" preamble
  // qwen3 only, for RenderChatPrompt: false is the template's enable_thinking=False (the prompt
  // ends with an empty <think> block, so the model answers without thinking).
  bool enable_thinking = true;
  // Non-empty: the model's template, detected as this (e.g. "Llama 2's <<SYS>> template"), is one
  // ferry cannot render exactly; RenderChat refuses it.
  std::string unsupported = {};
  // How the template treats tool use: see ToolUse. kNone for chatml, llama3 and mistral by name;
  // qwen3 by name is Qwen3's release template, kQwen.
  ToolUse tool_use = ToolUse::kNone;
};

// One call of an assistant's `tool_calls` ({"function": {"name", "arguments"}} or {"name",
// "arguments"}; kLlama31: the first form only), as kQwen and kLlama31 templates write it.
struct ToolCall {
  std::string name;
  std::string arguments_json;  // the arguments as `tojson` writes them (python_json.h)
  // The arguments when they are a JSON string (OpenAI's form): Qwen3's template writes it as it
  // is, Qwen2.5's quoted (arguments_json).
  std::optional<std::string> arguments_text = std::nullopt;
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (chatml and llama3: any, as ToolUse says)
  std::string content;
  // An assistant message's `reasoning_content` (qwen3 writes it in the <think> block; the other
  // templates ignore it, as theirs do).
  std::optional<std::string> reasoning = std::nullopt;
  // The message's `tool_calls`: present (any value, null too), and listing calls (not null,
  // false, 0, "", [] or {}: what a Jinja `if` takes as none).
  bool tool_calls_key = false;
  bool tool_calls = false;
  std::vector<ToolCall> calls = {};  // under a kQwen or kLlama31 template: the calls, in order
  // A "tool" or "ipython" result whose content is a JSON object or array (`content` is then ""):
  // its JSON as the template's `tojson` writes it. Only Llama 3.1's template writes it as JSON
  // (the others write Python's text of the object: RefusedToolUse).
  std::optional<std::string> content_json = std::nullopt;
};

// Rendered conversation: `text`, and the byte ranges [begin, end) of it that carry the loss, in
// increasing order.
struct RenderedText {
  std::string text;
  std::vector<std::pair<size_t, size_t>> trained;
};

// The template of a Hugging Face model folder: from tokenizer_config.json's `chat_template` text
// (the markers it contains) when present, else from config.json's model_type (qwen2 -> chatml,
// qwen3 -> qwen3, mistral -> mistral); kNone when neither tells. A ChatML template with <think>
// blocks other than Qwen3's release template (QwQ's, later Qwen3 releases') is detected as qwen3
// but marked unsupported.
ChatTemplate DetectChatTemplate(const std::string& model_dir);
// The same from a chat_template text alone.
ChatTemplate ChatTemplateFromText(std::string_view template_text);

// Renders `messages`, with `tools` (a line's tool list, each as the template's `tojson` writes it:
// kQwen one line, kLlama31 indent=4) for a kQwen or kLlama31 template; `tools_listed`: the line
// lists tools, maybe none (kLlama31's `tools is not none`). Errors (InvalidArgument, one line):
// no template (kNone), an unsupported detected template, an empty conversation, tool use
// (RefusedToolUse), and for mistral a system message not first or roles that do not alternate.
Result<RenderedText> RenderChat(const ChatTemplate& t, std::span<const ChatMessage> messages,
                                std::span<const std::string> tools = {}, bool tools_listed = false);

// Why ferry refuses the chat's tool use under `t` (empty: none to refuse). Under kQwen: a role
// other than system, user, assistant and tool, or tool calls on a message other than an
// assistant's. Under kLlama31: `tool_calls` on a message other than an assistant's or listing no
// call, and with `tools_listed` a conversation whose first message after the system's is not the
// user's (the template puts the tools there). Otherwise: a message listing tool calls (under any
// template: a template without tool use would train the turn without them), and as t.tool_use says,
// a tool result or a role the template does not write, or `tools_listed` (the line's `tools` is one
// the template writes: any non-null one for kIfPresent, one a Jinja `if` takes as some for
// kIfTruthy). Under any template but kLlama31: a tool result given as a JSON object or array
// (the template would write Python's text of it).
std::string RefusedToolUse(const ChatTemplate& t, std::span<const ChatMessage> messages,
                           bool tools_listed);

// The text a model continues to answer `messages` (apply_chat_template with
// add_generation_prompt=True): RenderChat's text, then the assistant's header, chatml's and
// qwen3's "<|im_start|>assistant\n" (qwen3: then "<think>\n\n</think>\n\n" when
// !enable_thinking; transformers' default leaves it out and the model may think) or
// llama3's "<|start_header_id|>assistant<|end_header_id|>\n\n"
// (mistral's " [/INST]" already hands the turn over). Errors: RenderChat's.
Result<std::string> RenderChatPrompt(const ChatTemplate& t, std::span<const ChatMessage> messages);

// What ends an assistant's turn: "<|im_end|>", "<|eot_id|>", "</s>"; "" for kNone.
std::string_view EndOfTurn(ChatFormat f);

}  // namespace ferry
