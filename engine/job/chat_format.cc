#include "engine/job/chat_format.h"

#include <utility>

namespace ferry {

namespace {
constexpr std::pair<ChatFormat, const char*> kChatFormatNames[] = {
    {ChatFormat::kChatMl, "chatml"},
    {ChatFormat::kQwen3, "qwen3"},
    {ChatFormat::kLlama3, "llama3"},
    {ChatFormat::kMistral, "mistral"},
    {ChatFormat::kNone, "none"}};
}  // namespace

const char* ChatFormatName(ChatFormat f) {
  for (auto [format, name] : kChatFormatNames) {
    if (format == f) return name;
  }
  return "none";
}

Result<ChatFormat> ParseChatFormat(std::string_view name) {
  for (auto [format, known] : kChatFormatNames) {
    if (known == name) return format;
  }
  return Status::InvalidArgument("--chat-template '" + std::string(name) + "' is not one of " +
                                 ChatFormatNames());
}

std::string ChatFormatNames(std::string_view separator, bool with_none) {
  std::string out;
  for (auto [format, name] : kChatFormatNames) {
    if (format == ChatFormat::kNone && !with_none) continue;
    if (!out.empty()) out += separator;
    out += name;
  }
  return out;
}

}  // namespace ferry
