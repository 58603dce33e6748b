#include "engine/job/chat_format.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(ChatFormat, EveryNameParsesToTheFormatNamedSo) {
  for (ChatFormat f : {ChatFormat::kChatMl, ChatFormat::kQwen3, ChatFormat::kLlama3,
                       ChatFormat::kMistral, ChatFormat::kNone}) {
    Result<ChatFormat> back = ParseChatFormat(ChatFormatName(f));
    ASSERT_TRUE(back.ok()) << ChatFormatName(f);
    EXPECT_EQ(*back, f) << ChatFormatName(f);
  }
  EXPECT_EQ(ChatFormatNames(), "chatml, qwen3, llama3, mistral, none");
  EXPECT_EQ(ChatFormatNames("|", /*with_none=*/false), "chatml|qwen3|llama3|mistral");
}

TEST(ChatFormat, AnUnknownNameIsRefusedNamingTheKnownOnes) {
  for (const char* bad : {"jinja", "auto", "", "ChatML", "qwen3 "}) {
    Result<ChatFormat> f = ParseChatFormat(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().message(), "--chat-template '" + std::string(bad) +
                                        "' is not one of chatml, qwen3, llama3, mistral, none")
        << bad;
  }
}

}  // namespace
}  // namespace ferry
