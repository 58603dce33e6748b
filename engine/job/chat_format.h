// ChatFormat: the chat templates ferry renders (--chat-template; engine/train/chat_template.h
// renders them). The names live here, below the job's validation and the apps' help, so that
// a template is named in one place.
#pragma once

#include <string>
#include <string_view>

#include "kernels/status.h"

namespace ferry {

enum class ChatFormat { kNone, kChatMl, kQwen3, kLlama3, kMistral };

// "chatml", "qwen3", "llama3", "mistral", "none".
const char* ChatFormatName(ChatFormat f);
// Errors: InvalidArgument naming --chat-template, the value and the names accepted.
Result<ChatFormat> ParseChatFormat(std::string_view name);
// The names joined by `separator`, in the order above; with_none false leaves out "none" (the
// templates that render a chat): "chatml|qwen3|llama3|mistral".
std::string ChatFormatNames(std::string_view separator = ", ", bool with_none = true);

}  // namespace ferry
