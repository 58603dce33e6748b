#include "engine/train/examples.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "engine/json.h"
#include "engine/train/dataset.h"
#include "engine/train/python_json.h"
#include "offload/file_io.h"

namespace ferry {
namespace {

constexpr char kTokenMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'T', 'O', 'K'};
constexpr uint32_t kTokenVersion = 1;
constexpr int32_t kLlmcMagic = 20240520;
constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";
// Deeper than any dataset nests; bounds what a damaged file's run of '[' costs SplitJsonArray.
constexpr size_t kMaxJsonDepth = 10000;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The data file's bytes; a missing one names --data.
Result<std::string> ReadFile(const std::string& path) {
  Result<std::string> bytes = ReadWholeFile(path);
  if (bytes.status().code() == StatusCode::kNotFound) {
    return Status::NotFound(bytes.status().message() + "; check --data");
  }
  return bytes;
}

// Text trained whole: BOS (the tokenizer's rule), the text, and the appended EOS.
Example WholeText(const Tokenizer& tok, std::string_view text) {
  return TokenizeMasked(tok, {.text = std::string(text), .trained = {{0, text.size()}}}, true);
}

// Appends the tokenizer's EOS (trained) unless the example already ends in it.
void AppendEos(const Tokenizer& tok, Example& e) {
  const std::optional<int32_t> eos = tok.special_ids().eos;
  if (!eos || (!e.tokens.empty() && e.tokens.back() == *eos)) return;
  e.tokens.push_back(*eos);
  e.trained.push_back(1);
}

Result<std::string> StringField(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j[key];
  if (!v.is_string()) return Status::InvalidArgument("'" + std::string(key) + "' must be a string");
  return v.get<std::string>();
}

// What a Jinja `if` takes as none: null, false, 0, "", [], {}.
bool JinjaFalsy(const nlohmann::json& v) {
  if (v.is_null()) return true;
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number()) return v.get<double>() == 0;
  if (v.is_string()) return v.get_ref<const std::string&>().empty();
  return v.empty();  // arrays and objects
}

// ShareGPT's speakers ("from") as chat roles; nullptr for one it does not name.
const char* ShareGptRole(std::string_view from) {
  constexpr std::pair<std::string_view, const char*> kRoles[] = {
      {"system", "system"}, {"human", "user"},          {"user", "user"},
      {"gpt", "assistant"}, {"assistant", "assistant"}, {"model", "assistant"}};
  for (auto [name, role] : kRoles) {
    if (name == from) return role;
  }
  return nullptr;
}

// A chat's turns: `j` is the line's "messages" ({"role", "content"} each, any role) or, when
// `sharegpt`, its "conversations" ({"from", "value"} each: human/user -> user,
// gpt/assistant/model -> assistant, system -> system).
Result<std::vector<ChatMessage>> ParseTurns(const nlohmann::json& j, bool sharegpt) {
  const std::string list = sharegpt ? "'conversations'" : "'messages'";
  const char* role_key = sharegpt ? "from" : "role";
  const char* text_key = sharegpt ? "value" : "content";
  if (!j.is_array()) return Status::InvalidArgument(list + " must be an array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& m = j[i];
    const std::string where = list + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return Status::InvalidArgument(where + " must be an object");
    // An assistant's tool call (OpenAI's form) may have a null content, or none (some exports
    // leave the key out): read as an empty one, as Qwen2.5's and Llama 3.1's templates do (Qwen3's
    // fails on both; the templates without tool use are refused a call anyway).
    const bool tool_calls_key = !sharegpt && m.contains("tool_calls");
    const bool tool_calls = tool_calls_key && !JinjaFalsy(m["tool_calls"]);
    // A tool's result may be a JSON object or array (Llama 3.1's template writes its JSON).
    const bool json_result = !sharegpt && m.contains("role") && m.contains(text_key) &&
                             (m["role"] == "tool" || m["role"] == "ipython") &&
                             (m[text_key].is_object() || m[text_key].is_array());
    for (const char* key : {role_key, text_key}) {
      if (key == text_key && json_result) continue;
      if (tool_calls && key == text_key && (!m.contains(key) || m[key].is_null())) continue;
      if (!m.contains(key) || !m[key].is_string()) {
        return Status::InvalidArgument(where + " needs a string '" + key + "'");
      }
    }
    std::string role = m[role_key].get<std::string>();
    if (sharegpt) {
      const char* mapped = ShareGptRole(role);
      if (mapped == nullptr) {
        return Status::InvalidArgument(where + ": 'from' \"" + role +
                                       "\" is not one of human, gpt, system (or user, "
                                       "assistant, model)");
      }
      role = mapped;
    }
    ChatMessage message{.role = std::move(role),
                        .content = m.contains(text_key) && m[text_key].is_string()
                                       ? m[text_key].get<std::string>()
                                       : "",
                        .tool_calls_key = tool_calls_key,
                        .tool_calls = tool_calls};
    if (json_result) message.content_json = m[text_key].dump();  // ReadToolUse: in key order
    if (!sharegpt && m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
      if (!m["reasoning_content"].is_string()) {
        return Status::InvalidArgument(where + ": 'reasoning_content' must be a string");
      }
      message.reasoning = m["reasoning_content"].get<std::string>();
    }
    out.push_back(std::move(message));
  }
  return out;
}

// What `text` (valid JSON) holds that Python's json reads otherwise than nlohmann, so that
// written back as Python writes it (python_json.h) it would differ: an integer beyond 64 bits
// (Python keeps it whole, nlohmann reads a float), and nesting deeper than kMaxPythonDepth
// (Python stops at its recursion limit, about 1000; it keeps PythonJsonDumps' recursion short).
constexpr int kMaxPythonDepth = 500;
Status CheckJsonForPython(std::string_view text) {
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {  // a string: skip it, escapes included
      for (++i; i < text.size() && text[i] != '"'; ++i) i += text[i] == '\\';
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxPythonDepth) {
        return Status::InvalidArgument("JSON nested more than " + std::to_string(kMaxPythonDepth) +
                                       " deep");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t end = i;
      while (end < text.size() && std::strchr("+-0123456789.eE", text[end]) != nullptr) ++end;
      const std::string_view number = text.substr(i, end - i);
      int64_t signed_value = 0;
      uint64_t unsigned_value = 0;
      const char* last = number.data() + number.size();
      auto whole = [&](std::from_chars_result r) { return r.ec == std::errc() && r.ptr == last; };
      if (number.find_first_of(".eE") == std::string_view::npos &&
          !whole(std::from_chars(number.data(), last, signed_value)) &&
          !whole(std::from_chars(number.data(), last, unsigned_value))) {
        return Status::InvalidArgument("the integer " + std::string(number) +
                                       " is beyond 64 bits, which ferry does not write as Python "
                                       "does");
      }
      i = end - 1;
    }
  }
  return Status::Ok();
}

// The line's tool use for a kQwen or kLlama31 template (`llama`), read again keeping each
// object's key order (as Python's json does, which the template's `tojson` writes): `tools` (when
// listed: each tool's JSON, kLlama31's indented by 4) and each tool-calling message's calls (a
// name and the arguments; kLlama31 reads a call's `function` only), and the JSON of each tool
// result given as an object or array (`content_json`). `turns` are the line's "messages".
Status ReadToolUse(std::string_view line, bool llama, bool tools_listed,
                   std::vector<std::string>* tools, std::vector<ChatMessage>& turns) {
  FERRY_RETURN_IF_ERROR(CheckJsonForPython(line));
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, false);
  for (size_t i = 0; i < turns.size(); ++i) {
    if (turns[i].content_json) turns[i].content_json = PythonJsonDumps(j["messages"][i]["content"]);
  }
  if (tools_listed) {
    if (!j["tools"].is_array()) return Status::InvalidArgument("'tools' must be an array");
    for (const nlohmann::ordered_json& tool : j["tools"]) {
      // transformers' apply_chat_template refuses a tool that is not a JSON schema (an object).
      if (!tool.is_object()) return Status::InvalidArgument("each of 'tools' must be an object");
      tools->push_back(PythonJsonDumps(tool, llama ? 4 : -1));
    }
  }
  for (size_t i = 0; i < turns.size(); ++i) {
    if (!turns[i].tool_calls) continue;
    const std::string where = "'messages'[" + std::to_string(i) + "]";
    const nlohmann::ordered_json& list = j["messages"][i]["tool_calls"];
    if (!list.is_array()) return Status::InvalidArgument(where + ": 'tool_calls' must be an array");
    for (const nlohmann::ordered_json& call : list) {
      // {"type": "function", "function": {"name", "arguments"}}, or the function itself (not
      // under Llama 3.1's template, which reads `tool_calls[0].function`).
      const bool wrapped = call.is_object() && call.contains("function");
      if (llama && !wrapped) {
        return Status::InvalidArgument(
            where +
            ": the model's chat template (Llama 3.1's) reads a tool call's 'function' "
            "({\"type\": \"function\", \"function\": {\"name\", \"arguments\"}})");
      }
      const nlohmann::ordered_json& f = wrapped ? call["function"] : call;
      if (!f.is_object() || f.empty() || !f.contains("name") || !f["name"].is_string() ||
          !f.contains("arguments")) {
        return Status::InvalidArgument(where +
                                       ": each tool call needs a string 'name' and 'arguments' "
                                       "(in its 'function', if it has one)");
      }
      const nlohmann::ordered_json& args = f["arguments"];
      turns[i].calls.push_back({.name = f["name"].get<std::string>(),
                                .arguments_json = PythonJsonDumps(args),
                                .arguments_text = args.is_string()
                                                      ? std::optional(args.get<std::string>())
                                                      : std::nullopt});
    }
  }
  return Status::Ok();
}

// Alpaca's {"instruction", "input", "output"} (and "system") as a chat: the user's turn is the
// instruction and the input, those that are not empty, joined by a line end (as LLaMA-Factory
// joins them), the assistant's the output.
Result<std::vector<ChatMessage>> AlpacaTurns(const nlohmann::json& j) {
  for (const char* key : {"instruction", "output"}) {
    if (!j.contains(key)) {
      return Status::InvalidArgument("'instruction' and 'output' go together; '" +
                                     std::string(key) + "' is missing");
    }
  }
  FERRY_ASSIGN_OR_RETURN(std::string user, StringField(j, "instruction"));
  FERRY_ASSIGN_OR_RETURN(std::string output, StringField(j, "output"));
  std::vector<ChatMessage> turns;
  if (j.contains("system") && !j["system"].is_null()) {
    FERRY_ASSIGN_OR_RETURN(std::string system, StringField(j, "system"));
    if (!system.empty()) turns.push_back({"system", std::move(system)});
  }
  if (j.contains("input") && !j["input"].is_null()) {
    FERRY_ASSIGN_OR_RETURN(std::string input, StringField(j, "input"));
    if (!input.empty()) user += (user.empty() ? "" : "\n") + input;  // the non-empty ones, joined
  }
  turns.push_back({"user", std::move(user)});
  turns.push_back({"assistant", std::move(output)});
  return turns;
}

template <typename T>
T ReadLe(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the formats are little-endian, as is every supported host
  return v;
}

// Ids of `count` tokens of `width` bytes at `p`, checked against the vocabulary.
Result<std::vector<int32_t>> ReadIds(const std::string& path, const char* p, uint64_t count,
                                     int width, int64_t vocab) {
  std::vector<int32_t> ids(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint32_t id = width == 2 ? ReadLe<uint16_t>(p + 2 * i) : ReadLe<uint32_t>(p + 4 * i);
    if (id > uint32_t(INT32_MAX) || (vocab > 0 && int64_t(id) >= vocab)) {
      return Status::InvalidArgument(path + ": token " + std::to_string(i) + " is id " +
                                     std::to_string(id) + ", outside the model's vocabulary of " +
                                     std::to_string(vocab));
    }
    ids[i] = int32_t(id);
  }
  return ids;
}

Example AllTrained(std::vector<int32_t> ids) {
  Example e;
  e.trained.assign(ids.size(), 1);
  e.tokens = std::move(ids);
  return e;
}

Result<LoadedExamples> LoadTokenFile(const std::string& path, const ExampleOptions& o) {
  FERRY_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  LoadedExamples out;
  const char* p = bytes.data();
  const uint64_t size = bytes.size();
  auto corrupt = [&](const std::string& what) {
    return Status::InvalidArgument(path + ": " + what + " (a ferry token file: see examples.h)");
  };
  if (size >= 24 && std::memcmp(p, kTokenMagic, 8) == 0) {
    const uint32_t version = ReadLe<uint32_t>(p + 8), width = ReadLe<uint32_t>(p + 12);
    const uint64_t docs = ReadLe<uint64_t>(p + 16);
    if (version != kTokenVersion) return corrupt("version " + std::to_string(version) + " != 1");
    if (width != 2 && width != 4) return corrupt("id width " + std::to_string(width));
    if (size < 32 || docs > (size - 32) / 8) return corrupt("truncated document table");
    const uint64_t header = 24 + 8 * (docs + 1);
    std::vector<uint64_t> offsets(docs + 1);
    for (uint64_t d = 0; d <= docs; ++d) {
      offsets[d] = ReadLe<uint64_t>(p + 24 + 8 * d);
      if (d > 0 && offsets[d] < offsets[d - 1]) return corrupt("document offsets decrease");
    }
    const uint64_t total = offsets[docs];
    if (offsets[0] != 0 || total > (size - header) / width || header + total * width != size) {
      return corrupt("the document table does not match the file size");
    }
    FERRY_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                           ReadIds(path, p + header, total, int(width), o.vocab_size));
    for (uint64_t d = 0; d < docs; ++d) {
      out.examples.push_back(AllTrained(std::vector<int32_t>(
          ids.begin() + int64_t(offsets[d]), ids.begin() + int64_t(offsets[d + 1]))));
    }
    return out;
  }
  // llm.c (header of 256 int32) or nanoGPT (no header): uint16 ids, documents ending at EOS.
  uint64_t header = 0, count = size / 2;
  if (size >= 1024 && ReadLe<int32_t>(p) == kLlmcMagic) {
    header = 1024;
    count = uint64_t(ReadLe<int32_t>(p + 8));
    if (count > (size - header) / 2) return corrupt("llm.c header counts more tokens than stored");
  } else if (size % 2 != 0) {
    return Status::InvalidArgument(path +
                                   ": a raw uint16 token file must have an even size; is it "
                                   "really pre-tokenized?");
  }
  FERRY_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                         ReadIds(path, p + header, count, 2, o.vocab_size));
  // -1 (no id) without a tokenizer or an EOS: one document.
  int32_t eos = -1;
  if (o.tokenizer != nullptr) eos = o.tokenizer->special_ids().eos.value_or(-1);
  std::vector<int32_t> doc;
  for (int32_t id : ids) {
    doc.push_back(id);
    if (id == eos) out.examples.push_back(AllTrained(std::exchange(doc, {})));
  }
  if (!doc.empty()) out.examples.push_back(AllTrained(std::move(doc)));
  return out;
}

}  // namespace

int64_t Example::valid_targets() const {
  int64_t n = 0;
  for (size_t i = 1; i < trained.size(); ++i) n += trained[i] != 0;
  return n;
}

Example TokenizeMasked(const Tokenizer& tokenizer, const RenderedText& r, bool add_special_tokens) {
  const Encoding enc = tokenizer.EncodeWithOffsets(r.text, add_special_tokens);
  Example e;
  e.tokens = enc.ids;
  e.trained.resize(enc.ids.size());
  size_t range = 0;  // first trained range that may still overlap (ranges and offsets ascend)
  for (size_t i = 0; i < enc.ids.size(); ++i) {
    const auto [b, end] = enc.offsets[i];
    if (b >= end) continue;  // added by the post-processor: never trained
    while (range < r.trained.size() && r.trained[range].second <= b) ++range;
    e.trained[i] = range < r.trained.size() && r.trained[range].first < end;
  }
  return e;
}

Result<Example> ParseJsonlLine(std::string_view line, const ExampleOptions& o, std::string* text,
                               bool* has_prompt) {
  if (has_prompt != nullptr) *has_prompt = false;
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("not a JSON object");
  const Tokenizer& tok = *o.tokenizer;
  // A chat is "messages", ShareGPT's "conversations" or Alpaca's "instruction" and "output" (a
  // null key, as some exports write the other forms' keys, is absent).
  auto has = [&j](const char* key) { return j.contains(key) && !j[key].is_null(); };
  const bool messages = has("messages"), conversations = has("conversations"),
             alpaca = has("instruction") || has("output");
  if (messages || conversations || alpaca) {
    if (int(messages) + int(conversations) + int(alpaca) > 1) {
      return Status::InvalidArgument(
          "the line holds more than one chat ('messages', 'conversations', 'instruction'); keep "
          "one");
    }
    FERRY_ASSIGN_OR_RETURN(std::vector<ChatMessage> turns,
                           messages        ? ParseTurns(j["messages"], false)
                           : conversations ? ParseTurns(j["conversations"], true)
                                           : AlpacaTurns(j));
    const ToolUse tool_use = o.chat_template.tool_use;
    const bool llama = tool_use == ToolUse::kLlama31;
    const bool tools_listed = tool_use == ToolUse::kIfPresent || llama
                                  ? has("tools")
                                  : has("tools") && !JinjaFalsy(j["tools"]);
    if (std::string why = RefusedToolUse(o.chat_template, turns, tools_listed); !why.empty()) {
      return Status::InvalidArgument(why);
    }
    // A tool call, or a JSON tool result (Llama 3.1's alone: RefusedToolUse), is read below.
    const bool calls_or_json = std::any_of(turns.begin(), turns.end(), [](const ChatMessage& m) {
      return m.tool_calls || m.content_json.has_value();
    });
    std::vector<std::string> tools;
    if ((tool_use == ToolUse::kQwen || llama) && (tools_listed || calls_or_json)) {
      FERRY_RETURN_IF_ERROR(ReadToolUse(line, llama, tools_listed, &tools, turns));
    }
    FERRY_ASSIGN_OR_RETURN(RenderedText r, RenderChat(o.chat_template, turns, tools, tools_listed));
    if (o.train_on_prompt) r.trained = {{0, r.text.size()}};
    if (text != nullptr) *text = r.text;
    if (has_prompt != nullptr) *has_prompt = true;
    return TokenizeMasked(tok, r, /*add_special_tokens=*/false);
  }
  if (j.contains("prompt") || j.contains("completion")) {
    if (!j.contains("prompt") || !j.contains("completion")) {
      return Status::InvalidArgument("'prompt' and 'completion' go together; one is missing");
    }
    FERRY_ASSIGN_OR_RETURN(std::string prompt, StringField(j, "prompt"));
    FERRY_ASSIGN_OR_RETURN(std::string completion, StringField(j, "completion"));
    RenderedText r{
        .text = prompt + completion,
        .trained = {{o.train_on_prompt ? 0 : prompt.size(), prompt.size() + completion.size()}}};
    Example e = TokenizeMasked(tok, r, /*add_special_tokens=*/true);
    AppendEos(tok, e);
    if (text != nullptr) *text = std::move(r.text);
    if (has_prompt != nullptr) *has_prompt = true;
    return e;
  }
  if (j.contains("text")) {
    FERRY_ASSIGN_OR_RETURN(std::string whole, StringField(j, "text"));
    Example e = WholeText(tok, whole);
    AppendEos(tok, e);
    if (text != nullptr) *text = std::move(whole);
    return e;
  }
  return Status::InvalidArgument(
      "a line needs 'text', 'prompt' and 'completion', 'messages', 'conversations', or "
      "'instruction' and 'output'");
}

std::string SkippedText(const LoadedExamples& loaded) {
  if (loaded.skipped_lines == 0) return "";
  return std::to_string(loaded.skipped_lines) + " bad " + (loaded.json_array ? "element" : "line") +
         (loaded.skipped_lines == 1 ? "" : "s") + " skipped";
}

std::string UnusedTrainOnPrompt(const LoadedExamples& loaded, const ExampleOptions& o) {
  if (!o.train_on_prompt || loaded.with_prompt > 0 || loaded.examples.empty()) return "";
  return std::string(kTrainOnPromptChangesNothing);
}

Result<std::vector<JsonRecord>> SplitJsonArray(std::string_view text, std::string_view source) {
  size_t i = text.starts_with(kUtf8Bom) ? kUtf8Bom.size() : 0;
  int64_t line = 1;
  auto skip_space = [&] {
    for (; i < text.size(); ++i) {
      const char c = text[i];
      if (c == '\n') {
        ++line;
      } else if (c != ' ' && c != '\t' && c != '\r') {
        break;
      }
    }
  };
  auto at = [&line, source](const std::string& what) {
    return Status::InvalidArgument(std::string(source) + ":" + std::to_string(line) + ": " + what);
  };
  skip_space();
  if (i == text.size() || text[i] != '[') return at("a JSON array of examples must start with '['");
  ++i;
  std::vector<JsonRecord> elements;
  // The brackets open inside the current element, with the line each opened on.
  std::vector<std::pair<char, int64_t>> open;
  for (;;) {
    skip_space();
    if (i < text.size() && text[i] == ']' && elements.empty()) {  // []
      ++i;
      break;
    }
    const int64_t element_line = line;
    const size_t begin = i;
    size_t end = begin;  // past the element's last non-space byte
    bool in_string = false;
    // A whole value at the element's top level: only ',' or ']' may follow it (a valid element is
    // one value, with no space inside it outside its brackets).
    bool whole = false;
    bool scalar = false;  // a number or literal (true, null, ...) began at the top level
    for (; i < text.size(); ++i) {
      const char c = text[i];
      if (c == '\n') ++line;
      if (in_string) {
        if (c == '\\') {
          ++i;  // the escaped byte (a '"' or '\\' among them)
          if (i < text.size() && text[i] == '\n') ++line;
        } else if (c == '"') {
          in_string = false;
          whole = open.empty();
        }
        end = i + 1;
        continue;
      }
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        whole = whole || (open.empty() && end > begin);
        continue;
      }
      if (open.empty() && (c == ',' || c == ']')) break;  // the element's end; ']' the array's
      if (c == '}' && open.empty()) return at("a '}' with no '{' open");
      if (open.empty() && (whole || (scalar && (c == '"' || c == '[' || c == '{')))) {
        return at("a ',' is missing between two elements");
      }
      if (open.empty() && c != '"' && c != '[' && c != '{' && c != '}') scalar = true;
      if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        if (open.size() == kMaxJsonDepth) {
          return at("brackets nested more than " + std::to_string(kMaxJsonDepth) + " deep");
        }
        open.emplace_back(c, line);
      } else if (c == ']' || c == '}') {
        if ((c == ']') != (open.back().first == '[')) {
          return at(std::string("a '") + c + "' closes the '" + open.back().first +
                    "' opened on line " + std::to_string(open.back().second));
        }
        open.pop_back();
        whole = open.empty();
      }
      end = i + 1;
    }
    if (i >= text.size()) {
      return at(std::string(in_string ? "the file ends inside a string"
                                      : "the file ends before the array's ']'") +
                " (a truncated file?); the last element starts on line " +
                std::to_string(element_line));
    }
    if (end == begin) {
      return at(text[i] == ',' ? "an empty element (a ',' with nothing before it)"
                               : "an empty element (a ',' before ']')");
    }
    elements.push_back({.text = text.substr(begin, end - begin), .line = element_line});
    if (text[i++] == ']') break;
  }
  skip_space();
  if (i < text.size()) return at("text after the JSON array's closing ']'");
  return elements;
}

Result<LoadedExamples> LoadExamples(const std::string& path, const ExampleOptions& o) {
  if (EndsWith(path, ".bin") || EndsWith(path, ".tok")) return LoadTokenFile(path, o);
  const bool jsonl = EndsWith(path, ".jsonl");
  const bool json = jsonl || EndsWith(path, ".json");
  if (!json && !EndsWith(path, ".txt")) {
    return Status::InvalidArgument(
        "--data " + path + ": unknown format; use .jsonl, .json, .txt, or .bin/.tok token files");
  }
  if (o.tokenizer == nullptr) return Status::InvalidArgument("no tokenizer to read " + path);
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  LoadedExamples out;
  if (!json) {
    for (std::string_view doc : SplitDocuments(text)) {
      out.examples.push_back(WholeText(*o.tokenizer, doc));
      AppendEos(*o.tokenizer, out.examples.back());
      if (o.keep_text) out.texts.emplace_back(doc);
    }
    return out;
  }
  // One JSON object per record: the array's elements, or the lines (blank ones skipped).
  std::string_view body = text;
  if (body.starts_with(kUtf8Bom)) body.remove_prefix(kUtf8Bom.size());
  const size_t first = body.find_first_not_of(" \t\r\n");
  const bool array =
      EndsWith(path, ".json") && first != std::string_view::npos && body[first] == '[';
  std::vector<JsonRecord> records;
  out.json_array = array;
  if (array) {
    FERRY_ASSIGN_OR_RETURN(records, SplitJsonArray(text, path));
  } else {
    size_t pos = 0;
    for (int64_t line_no = 1; pos < text.size(); ++line_no) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      std::string_view line(text.data() + pos, nl - pos);
      pos = nl + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      records.push_back({.text = line, .line = line_no});
    }
    // One object over several lines ({"data": [...]}, pretty-printed: the file is one JSON
    // value) is neither form: say so, rather than report each of its lines as a bad example.
    if (!jsonl && !records.empty() && !nlohmann::json::accept(records[0].text) &&
        nlohmann::json::accept(body)) {
      return Status::InvalidArgument(
          path + ":" + std::to_string(records[0].line) +
          ": not a whole JSON value; a .json dataset holds one JSON array of examples "
          "([{...}, {...}]) or one JSON object a line, and one object over several lines is "
          "neither");
    }
  }
  for (const JsonRecord& record : records) {
    std::string record_text;
    bool prompted = false;
    Result<Example> e =
        ParseJsonlLine(record.text, o, o.keep_text ? &record_text : nullptr, &prompted);
    if (!e.ok()) {
      if (o.skip_bad_lines) {
        ++out.skipped_lines;
        continue;
      }
      return Status::InvalidArgument(path + ":" + std::to_string(record.line) + ": " +
                                     e.status().message() + " (--skip-bad-lines skips such " +
                                     (array ? "elements" : "lines") + ")");
    }
    out.examples.push_back(std::move(*e));
    out.with_prompt += prompted ? 1 : 0;
    if (o.keep_text) {
      out.texts.push_back(std::move(record_text));
      out.lines.push_back(record.line);
    }
  }
  return out;
}

Status WriteTokenFile(const std::string& path, std::span<const std::vector<int32_t>> documents) {
  uint32_t width = 2;
  uint64_t total = 0;
  for (const std::vector<int32_t>& d : documents) {
    for (int32_t id : d) {
      if (id < 0) return Status::InvalidArgument("negative token id " + std::to_string(id));
      if (id > 0xFFFF) width = 4;
    }
    total += d.size();
  }
  std::string out(kTokenMagic, 8);
  auto put = [&](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(kTokenVersion);
  put(width);
  put(uint64_t(documents.size()));
  uint64_t offset = 0;
  put(offset);
  for (const std::vector<int32_t>& d : documents) put(offset += d.size());
  out.reserve(out.size() + total * width);
  for (const std::vector<int32_t>& d : documents) {
    for (int32_t id : d) width == 2 ? put(uint16_t(id)) : put(uint32_t(id));
  }
  return WriteTextFile(path, out);
}

}  // namespace ferry
