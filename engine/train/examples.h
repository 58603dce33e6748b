// Training examples read from a dataset file (`--data FILE`), tokenized, with a loss mask.
//
// Formats, by extension:
//  .jsonl  one JSON object per line (blank lines skipped), one of
//            {"text": "..."}                                  all tokens trained
//            {"prompt": "...", "completion": "..."}           loss on the completion only
//            {"messages": [{"role": "...", "content": "..."}, ...]}
//                                       rendered with the chat template (chat_template.h);
//                                       loss on the assistant turns only; a "tools"
//                                       list and "tool_calls" rendered by Qwen's
//                                       templates, refused as RefusedToolUse says
//            {"conversations": [{"from": "human", "value": "..."}, ...]}
//                                       ShareGPT's: the same, "from" human/user -> user,
//                                       gpt/assistant/model -> assistant, system -> system
//            {"instruction": "...", "input": "...", "output": "..."}
//                                       Alpaca's: the same chat, the user's turn the
//                                       instruction (+ "\n" + input when non-empty), the
//                                       assistant's the output ("system" optional)
//  .json   the same objects as a JSON array ("[{...}, {...}]", as Alpaca's and ShareGPT's files
//          are published), or one object a line as .jsonl (what Hugging Face's `datasets` reads
//          from a .json file that does not start with '[')
//  .txt    documents separated by blank lines, all tokens trained
//  .bin / .tok  pre-tokenized ids, all trained, in one of
//            ferry's token file (WriteTokenFile below): "FERRYTOK" magic, uint32 version (1),
//              uint32 id width in bytes (2 or 4), uint64 documents D, uint64 offsets[D + 1]
//              (the first token of each document; offsets[D] = the total), then the ids;
//              all little-endian
//            llm.c's: a 256 x int32 header (magic 20240520, version 1, token count), uint16 ids
//            nanoGPT's: raw uint16 ids with no header; documents end at the tokenizer's EOS
//
// Tokenization and the mask (ExampleOptions::train_on_prompt trains the whole rendered text of
// every form instead). text and prompt + completion are encoded with the tokenizer's
// special tokens (its BOS), and the tokenizer's EOS is appended (trained) when the text does not
// already end in it; a rendered chat is encoded as it is (templates write their own BOS and
// end-of-turn tokens). The whole text is tokenized ONCE, so tokens across the prompt/completion
// boundary are what the tokenizer gives for the concatenated text; the mask then comes from the
// byte range of each token (Tokenizer::EncodeWithOffsets): a token is trained iff its range
// overlaps a trained byte range. A token straddling the boundary (part prompt, part completion)
// is therefore TRAINED — predicting it is how the model produces the completion's first bytes.
// Tokens with an empty range (BOS/EOS added by the post-processor) are never trained, except the
// EOS this loader appends.
//
// Errors name the file and line: "data.jsonl:17: 'messages' must be an array" (for a JSON array,
// the line its element starts on). With skip_bad_lines a bad line or element is counted
// (LoadedExamples::skipped_lines) and skipped; a JSON array whose elements' bounds are unknown
// (the errors SplitJsonArray lists below: mismatched brackets, a missing ',', an array not
// closed, ...) is not skipped: the run stops naming the line.
//
// Plain functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/tokenizer.h"
#include "engine/train/chat_template.h"
#include "kernels/status.h"

namespace ferry {

struct Example {
  std::vector<int32_t> tokens;
  // trained[i] != 0: token i is a target — the loss of predicting it from tokens 0..i-1 counts.
  std::vector<uint8_t> trained;

  int64_t size() const { return int64_t(tokens.size()); }
  // Targets this example contributes when whole: trained tokens after the first.
  int64_t valid_targets() const;
};

struct ExampleOptions {
  const Tokenizer* tokenizer = nullptr;  // REQUIRED for .jsonl, .json, .txt; EOS for nanoGPT
  ChatTemplate chat_template = {};       // for `messages`
  int64_t vocab_size = 0;                // > 0: ids of token files must be below it
  bool skip_bad_lines = false;
  // Every token of a chat or prompt + completion carries the loss (the prompt, the system and
  // user turns, the template's own tokens), as a text example's do: axolotl's train_on_inputs,
  // LLaMA-Factory's train_on_prompt. Tokens the post-processor adds (BOS) still do not.
  bool train_on_prompt = false;
  bool keep_text = false;  // fill LoadedExamples::texts (for `ferry tokenize --data`)
};

struct LoadedExamples {
  std::vector<Example> examples;
  int64_t skipped_lines = 0;  // with skip_bad_lines: lines, or a JSON array's elements
  // Examples with a prompt (chats, prompt + completion): those train_on_prompt changes; 0 for
  // text and token files.
  int64_t with_prompt = 0;
  bool json_array = false;  // the file is a JSON array: skipped_lines counts elements
  // With keep_text, for .jsonl, .json and .txt files: each example's text as tokenized (the
  // rendered chat, prompt + completion, or the text) and, for .jsonl and .json, its line number
  // (1-based; an array element's first line).
  std::vector<std::string> texts;
  std::vector<int64_t> lines;
};

// Reads and tokenizes a dataset file (format by extension, see above).
Result<LoadedExamples> LoadExamples(const std::string& path, const ExampleOptions& options);

// "1 bad line skipped", "3 bad elements skipped" (a JSON array's); "" when none was.
std::string SkippedText(const LoadedExamples& loaded);
// What a run's data line says of --train-on-prompt where nothing has a prompt.
inline constexpr std::string_view kTrainOnPromptChangesNothing =
    "--train-on-prompt changes nothing here: no example has a prompt, and a text's every token "
    "already counts";
// With train_on_prompt over examples none of which has a prompt (a text or token file, text
// lines), a note that the option changes nothing; else "".
std::string UnusedTrainOnPrompt(const LoadedExamples& loaded, const ExampleOptions& options);

// One .jsonl line (without its newline) as an Example; errors without the file:line prefix.
// The pure entry point of the .jsonl reader (LoadExamples and the fuzz target call it). `text`,
// when given, receives the text that was tokenized; `has_prompt`, whether the example has a
// prompt (a chat or prompt + completion: what train_on_prompt trains too).
Result<Example> ParseJsonlLine(std::string_view line, const ExampleOptions& options,
                               std::string* text = nullptr, bool* has_prompt = nullptr);

// One JSON record of a dataset file: a top-level JSON array's element or a JSON line, with the
// line it starts on (1-based).
struct JsonRecord {
  std::string_view text;
  int64_t line = 0;
};

// The elements of the JSON array `text` holds (a UTF-8 BOM and white space around it allowed),
// found by following its brackets and strings instead of building the whole document: a parsed
// document takes several times the file's size (ShareGPT's published .json is 670 MB). Errors
// read "SOURCE:LINE: what is wrong": no '[' first, a closing bracket that does not match, a
// missing ',' between elements (one whose elements' bounds it can tell; the rest is the
// element's parser's), an empty element, an array not closed, text after it, brackets
// nested more than 10000 deep. Each element's own JSON (numbers,
// literals, escapes) is its parser's to check. On a valid JSON array the result is exactly its
// elements, in order (tests/fuzz/json_array_fuzz.cc checks this against nlohmann::json).
Result<std::vector<JsonRecord>> SplitJsonArray(std::string_view text, std::string_view source);

// Tokenizes r.text once and marks the tokens overlapping r.trained (the rule above).
Example TokenizeMasked(const Tokenizer& tokenizer, const RenderedText& r, bool add_special_tokens);

// Writes documents as ferry's token file (uint16 ids when all fit, else uint32).
Status WriteTokenFile(const std::string& path, std::span<const std::vector<int32_t>> documents);

}  // namespace ferry
