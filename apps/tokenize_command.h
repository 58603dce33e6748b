// `ferry tokenize`: shows what a model sees. Text (--text or stdin) becomes ids; --decode turns
// ids back into text; --show-tokens lists each token with the bytes of the input it covers;
// --jsonl processes one JSON value per line (a string to encode, or with --decode an array of
// ids) for scripts and the tokenizer tests. --model is a Hugging Face model folder with
// tokenizer.json, or "tiny" for the built-in byte tokenizer.
//
// --data FILE shows what training sees: each example of a dataset file (any format `ferry train
// --data` reads, chat `messages` rendered with --chat-template, default auto) as its text with
// the trained (loss-carrying) tokens between [[ and ]], or with --show-tokens one token a line
// marked "train"/"ctx"; with --jsonl one JSON object per example:
//   {"line": N, "text": "...", "ids": [...], "trained": [0, 1, ...]}
// ("line" and "text" for .jsonl and .json, an array element's line its first; "text" for .txt).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace ferry {

struct TokenizeCommand {
  CLI::App* app = nullptr;
  std::string model;
  std::string text;
  bool has_text = false;
  bool decode = false;
  bool show_tokens = false;
  bool no_special = false;    // encode: no BOS/EOS from the post-processor
  bool skip_special = false;  // decode: drop special tokens
  bool jsonl = false;
  std::string data;                    // --data: show a dataset file's examples
  bool train_on_prompt = false;        // with --data: as ferry train --train-on-prompt
  bool skip_bad_lines = false;         // with --data: as ferry train --skip-bad-lines
  std::string chat_template = "auto";  // with --data or --chat
  bool chat = false;   // --chat: the text is a user turn of the chat template, as generate --chat
  std::string system;  // with --chat: a system turn first
  bool no_thinking = false;  // with --chat: Qwen3's enable_thinking=False
};

// Adds the `tokenize` subcommand to `parent`; `cmd` must outlive parsing.
void AddTokenizeCommand(CLI::App& parent, TokenizeCommand* cmd);

// Exit code: 0 done; 1 bad input (one line on stderr).
int RunTokenizeCommand(TokenizeCommand& cmd);

}  // namespace ferry
