// Hugging Face tokenizer.json support: a BPE model (byte-level as in GPT-2, Llama 3 and Qwen, or
// with byte fallback as in Llama 2 and Mistral) with its added tokens, text stages
// (text_pipeline.h) and post-processor, behind the Tokenizer interface (tokenizer.h).
//
// ParseTokenizerJson is the pure entry point (no files: what LoadTokenizer and the fuzz target
// call). Anything the file asks for that ferry does not implement is an error naming the
// component ("tokenizer.json: pre_tokenizer type 'Whitespace' is not supported"), never a
// silently different tokenization.
//
// The returned tokenizer is immutable; all its methods are const and thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "engine/text/tokenizer.h"
#include "kernels/status.h"

namespace ferry {

// Which tokens are BOS/EOS/PAD, as a model folder's tokenizer_config.json names them (by token
// text) or config.json gives them (by id). Names win over ids; with neither, BOS/EOS are the
// special tokens the post-processor puts before/after the text.
struct SpecialTokenChoice {
  std::optional<std::string> bos, eos, pad;
  SpecialTokenIds ids;
};

// `what` names the source in errors (a path, or "tokenizer.json").
Result<std::unique_ptr<Tokenizer>> ParseTokenizerJson(std::string_view json, std::string_view what,
                                                      const SpecialTokenChoice& special = {});

}  // namespace ferry
