// `ferry tokenize`: shows what a model sees. Text (--text or stdin) becomes ids; --decode turns
// ids back into text; --show-tokens lists each token with the bytes of the input it covers;
// --jsonl processes one JSON value per line (a string to encode, or with --decode an array of
// ids) for scripts and the tokenizer tests. --model is a Hugging Face model folder with
// tokenizer.json, or "tiny" for the built-in byte tokenizer.
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
};

// Adds the `tokenize` subcommand to `parent`; `cmd` must outlive parsing.
void AddTokenizeCommand(CLI::App& parent, TokenizeCommand* cmd);

// Exit code: 0 done; 1 bad input (one line on stderr).
int RunTokenizeCommand(TokenizeCommand& cmd);

}  // namespace ferry
