#include "apps/tokenize_command.h"

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "engine/job/chat_format.h"
#include "engine/json.h"
#include "engine/text/tokenizer.h"
#include "engine/text/utf8_text.h"
#include "engine/train/examples.h"
#include "engine/train/training_data.h"

namespace ferry {

void AddTokenizeCommand(CLI::App& parent, TokenizeCommand* cmd) {
  CLI::App* t = parent.add_subcommand(
      "tokenize", "Turn text into a model's token ids (or ids back into text with --decode).");
  cmd->app = t;
  t->add_option("--model", cmd->model,
                "Model folder with tokenizer.json, or 'tiny' for the built-in byte tokenizer")
      ->required();
  t->add_option("--text", cmd->text, "Text to encode (or ids to decode); default: stdin");
  t->add_flag("--decode", cmd->decode, "Read token ids (space or comma separated), print text");
  t->add_flag("--show-tokens", cmd->show_tokens,
              "Also list each token: id, input byte range, and the text it covers");
  t->add_flag("--no-special", cmd->no_special, "Do not add BOS/EOS when encoding");
  t->add_flag("--skip-special", cmd->skip_special, "Leave special tokens out when decoding");
  t->add_flag("--jsonl", cmd->jsonl,
              "One JSON value per input line: a string to encode (prints {\"ids\", \"offsets\"}), "
              "or with --decode an array of ids (prints a string); with --data one JSON object "
              "per example");
  t->add_option("--data", cmd->data,
                "Show a dataset file's examples as training sees them: tokens, and which carry "
                "the loss (between [[ and ]])");
  t->add_flag("--train-on-prompt", cmd->train_on_prompt,
              "With --data: as ferry train --train-on-prompt (every token of a chat or "
              "prompt+completion carries the loss)");
  t->add_flag("--skip-bad-lines", cmd->skip_bad_lines,
              "With --data: as ferry train --skip-bad-lines (skip malformed lines or .json array "
              "elements, and say how many)");
  t->add_option("--chat-template", cmd->chat_template,
                "With --data or --chat: template for chat 'messages': auto (from the model "
                "folder), " +
                    ChatFormatNames())
      ->capture_default_str();
  t->add_flag("--chat", cmd->chat,
              "Encode the text as the prompt `ferry generate --chat` gives the model: a user turn "
              "of the chat template and the assistant's header (with --jsonl each line is "
              "{\"user\": ..., \"system\": ...}; prints {\"text\", \"ids\", \"end_of_turn\"})");
  t->add_flag("--no-thinking", cmd->no_thinking,
              "With --chat on a Qwen3 model: the prompt generate --chat --no-thinking gives");
  t->add_option("--system", cmd->system,
                "With --chat: a system message first (with --jsonl: for lines without one)");
}

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "ferry tokenize: %s\n", msg.c_str());
  return 1;
}

// JSON string of possibly invalid UTF-8 (invalid bytes shown as U+FFFD).
std::string Quoted(std::string_view bytes) { return nlohmann::json(Utf8Lossy(bytes)).dump(); }

bool ParseIds(const std::string& text, int64_t vocab, std::vector<int32_t>* ids,
              std::string* error) {
  std::string s = text;
  for (char& c : s) {
    if (c == ',' || c == '[' || c == ']') c = ' ';
  }
  std::istringstream in(s);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    long long v = std::strtoll(word.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v >= vocab) {
      *error = "'" + word + "' is not a token id (0.." + std::to_string(vocab - 1) + ")";
      return false;
    }
    ids->push_back(int32_t(v));
  }
  return true;
}

int RunJsonl(const TokenizeCommand& cmd, const Tokenizer& tok) {
  std::string line;
  int64_t n = 0;
  std::string out;
  while (std::getline(std::cin, line)) {
    ++n;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (cmd.decode) {
      if (!j.is_array()) return Fail("stdin line " + std::to_string(n) + ": not a JSON array");
      std::vector<int32_t> ids;
      for (const auto& v : j) {
        if (!v.is_number_integer()) {
          return Fail("stdin line " + std::to_string(n) + ": ids must be integers");
        }
        ids.push_back(v.get<int32_t>());
      }
      out = Quoted(tok.Decode(ids, cmd.skip_special));
    } else {
      if (!j.is_string()) return Fail("stdin line " + std::to_string(n) + ": not a JSON string");
      Encoding e = tok.EncodeWithOffsets(j.get<std::string>(), !cmd.no_special);
      nlohmann::json r;
      r["ids"] = e.ids;
      r["offsets"] = e.offsets;
      out = r.dump();
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
  }
  return 0;
}

// --chat: each input (--text or stdin; with --jsonl each line's {"user", "system"}) encoded as
// generate --chat encodes its prompt (EncodeChatPrompt).
int RunChat(const TokenizeCommand& cmd, const Tokenizer& tok, const std::string& input) {
  Result<ChatTemplate> chat = ChatPromptTemplate(cmd.chat_template, cmd.model, !cmd.no_thinking);
  if (!chat.ok()) return Fail(chat.status().message());
  auto encode = [&](const std::string& system, const std::string& user) -> Result<ChatPrompt> {
    Result<ChatPrompt> p = EncodeChatPrompt(tok, *chat, system, user);
    if (!p.ok()) return p.status().WithContext("--chat");
    return p;
  };
  if (!cmd.jsonl) {
    Result<ChatPrompt> p = encode(cmd.system, input);
    if (!p.ok()) return Fail(p.status().message());
    std::string line;
    for (size_t i = 0; i < p->ids.size(); ++i) line += (i ? " " : "") + std::to_string(p->ids[i]);
    std::printf("%s\n", line.c_str());
    std::fprintf(stderr, "%zu tokens (chat template %s): %s\n", p->ids.size(),
                 ChatFormatName(chat->format), Quoted(p->text).c_str());
    return 0;
  }
  std::istringstream in(input);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("user") || !j["user"].is_string() ||
        (j.contains("system") && !j["system"].is_string())) {
      return Fail("stdin line " + std::to_string(n) +
                  ": not a JSON object with a string \"user\" (and \"system\")");
    }
    // A line without "system" takes --system's.
    Result<ChatPrompt> p = encode(j.value("system", cmd.system), j["user"].get<std::string>());
    if (!p.ok()) return Fail("stdin line " + std::to_string(n) + ": " + p.status().message());
    nlohmann::json r;
    r["text"] = Utf8Lossy(p->text);
    r["ids"] = p->ids;
    r["end_of_turn"] = p->end_of_turn ? nlohmann::json(*p->end_of_turn) : nlohmann::json();
    const std::string out = r.dump();
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
  }
  return 0;
}

// Tokens [b, e) of `e` decoded together, as JSON-quoted text without the quotes.
std::string Piece(const Tokenizer& tok, const Example& e, size_t b, size_t end) {
  const std::string q = Quoted(tok.Decode(std::span<const int32_t>(&e.tokens[b], end - b), false));
  return q.substr(1, q.size() - 2);
}

int RunData(const TokenizeCommand& cmd, const Tokenizer& tok) {
  Result<ChatTemplate> chat = ResolveChatTemplate(cmd.chat_template, cmd.model);
  if (!chat.ok()) return Fail(chat.status().message());
  ExampleOptions o;
  o.tokenizer = &tok;
  o.chat_template = *chat;
  o.vocab_size = tok.vocab_size();
  o.keep_text = true;
  o.train_on_prompt = cmd.train_on_prompt;
  o.skip_bad_lines = cmd.skip_bad_lines;
  Result<LoadedExamples> loaded = LoadExamples(cmd.data, o);
  if (!loaded.ok()) return Fail(loaded.status().message());
  int64_t tokens = 0, trained = 0;
  for (size_t i = 0; i < loaded->examples.size(); ++i) {
    const Example& e = loaded->examples[i];
    int64_t n_trained = 0;
    for (uint8_t t : e.trained) n_trained += t != 0;
    tokens += e.size();
    trained += n_trained;
    if (cmd.jsonl) {
      nlohmann::json j;
      if (i < loaded->lines.size()) j["line"] = loaded->lines[i];
      if (i < loaded->texts.size()) j["text"] = Utf8Lossy(loaded->texts[i]);
      j["ids"] = e.tokens;
      j["trained"] = e.trained;
      const std::string out = j.dump();
      std::printf("%s\n", out.c_str());
      continue;
    }
    const std::string where =
        i < loaded->lines.size() ? " (line " + std::to_string(loaded->lines[i]) + ")" : "";
    std::printf("example %zu%s: %lld tokens, %lld trained\n", i + 1, where.c_str(),
                static_cast<long long>(e.size()), static_cast<long long>(n_trained));
    if (cmd.show_tokens) {
      for (size_t k = 0; k < e.tokens.size(); ++k) {
        std::printf("%8d  %-5s  %s\n", e.tokens[k], e.trained[k] ? "train" : "ctx",
                    Piece(tok, e, k, k + 1).c_str());
      }
      continue;
    }
    // Runs of equally trained tokens decoded together (whole characters), trained ones in [[ ]].
    std::string line = "  ";
    for (size_t b = 0; b < e.tokens.size();) {
      size_t end = b;
      while (end < e.tokens.size() && e.trained[end] == e.trained[b]) ++end;
      const std::string piece = Piece(tok, e, b, end);
      line += e.trained[b] ? "[[" + piece + "]]" : piece;
      b = end;
    }
    std::printf("%s\n", line.c_str());
  }
  if (std::fflush(stdout) != 0) {
    return Fail(Status::FromErrno(errno, "write the output (stdout)").message());
  }
  const std::string skipped = loaded->skipped_lines > 0 ? ", " + SkippedText(*loaded) : "";
  std::fprintf(stderr, "%zu example%s%s, %lld tokens, %lld trained (%s; chat template %s)\n",
               loaded->examples.size(), loaded->examples.size() == 1 ? "" : "s", skipped.c_str(),
               static_cast<long long>(tokens), static_cast<long long>(trained),
               tok.Describe().c_str(), ChatFormatName(chat->format));
  if (std::string note = UnusedTrainOnPrompt(*loaded, o); !note.empty()) {
    std::fprintf(stderr, "ferry tokenize: note: %s\n", note.c_str());
  }
  return 0;
}

}  // namespace

int RunTokenizeCommand(TokenizeCommand& cmd) {
  std::unique_ptr<Tokenizer> tok;
  if (cmd.model == "tiny") {
    tok = MakeByteTokenizer();
  } else {
    Result<std::unique_ptr<Tokenizer>> r = LoadTokenizer(cmd.model);
    if (!r.ok()) return Fail(r.status().message());
    tok = std::move(r).value();
  }
  if (!cmd.data.empty()) {
    if (cmd.chat || cmd.app->count("--system") > 0 || cmd.no_thinking) {
      return Fail(
          "--chat, --system and --no-thinking encode a prompt; --data shows a dataset: give one "
          "of them");
    }
    return RunData(cmd, *tok);
  }
  if (cmd.chat && cmd.decode) return Fail("--chat encodes a prompt: leave out --decode");
  if (!cmd.chat && cmd.app->count("--system") > 0) return Fail("--system is for --chat");
  if (!cmd.chat && cmd.no_thinking) return Fail("--no-thinking is for --chat");
  if (cmd.train_on_prompt) {
    return Fail("--train-on-prompt is for a dataset's loss mask: give --data FILE");
  }
  if (cmd.skip_bad_lines) return Fail("--skip-bad-lines is for a dataset: give --data FILE");
  if (cmd.jsonl && !cmd.chat) return RunJsonl(cmd, *tok);
  std::string input = cmd.text;
  if (cmd.app->count("--text") == 0) {
    input.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  if (cmd.chat) {
    // Read from stdin, one turn as generate --chat reads it (--jsonl: lines of turns).
    const bool stdin_turn = cmd.app->count("--text") == 0 && !cmd.jsonl;
    return RunChat(cmd, *tok, stdin_turn ? ChatTurnFromInput(std::move(input)) : input);
  }
  if (cmd.decode) {
    std::vector<int32_t> ids;
    std::string error;
    if (!ParseIds(input, tok->vocab_size(), &ids, &error)) return Fail(error);
    std::string text = tok->Decode(ids, cmd.skip_special);
    std::printf("%s\n", text.c_str());
    return 0;
  }
  Encoding e = tok->EncodeWithOffsets(input, !cmd.no_special);
  std::string line;
  for (size_t i = 0; i < e.ids.size(); ++i) line += (i ? " " : "") + std::to_string(e.ids[i]);
  std::printf("%s\n", line.c_str());
  if (cmd.show_tokens) {
    for (size_t i = 0; i < e.ids.size(); ++i) {
      auto [b, en] = e.offsets[i];
      std::string piece = tok->Decode(std::span<const int32_t>(&e.ids[i], 1), false);
      std::printf("%6d  [%u, %u)  %s  %s\n", e.ids[i], b, en,
                  Quoted(std::string_view(input).substr(b, en - b)).c_str(), Quoted(piece).c_str());
    }
  }
  if (std::fflush(stdout) != 0) {
    return Fail(Status::FromErrno(errno, "write the output (stdout)").message());
  }
  std::fprintf(stderr, "%zu tokens (%s)\n", e.ids.size(), tok->Describe().c_str());
  return 0;
}

}  // namespace ferry
