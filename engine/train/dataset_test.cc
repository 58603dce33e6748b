#include "engine/train/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "engine/text/byte_tokenizer.h"
#include "engine/train/builtin_text.h"

namespace ferry {
namespace {

TEST(ByteTokenizerTest, RoundTripsAnyBytes) {
  std::string s = "héllo\n\t\x01\xff";
  std::vector<int32_t> ids = ByteTokenizer::Encode(s);
  ASSERT_EQ(ids.size(), s.size());
  EXPECT_EQ(ids[1], 0xc3);  // first byte of é in UTF-8
  EXPECT_EQ(ids.back(), 255);
  EXPECT_EQ(ByteTokenizer::Decode(ids), s);
  EXPECT_EQ(ByteTokenizer::Decode({'a', ByteTokenizer::kBos, 'b', ByteTokenizer::kEos}), "ab");
  EXPECT_EQ(ByteTokenizer::Decode({'a', 999}), "a\xEF\xBF\xBD");
}

TEST(TokenStreamTest, SplitsDocumentsAtBlankLines) {
  TokenStream s = TokenStream::FromText("ab\ncd\n\n  \n\nef");
  EXPECT_EQ(s.documents(), 2);
  const std::vector<int32_t> want = {ByteTokenizer::kBos,
                                     'a',
                                     'b',
                                     '\n',
                                     'c',
                                     'd',
                                     ByteTokenizer::kEos,
                                     ByteTokenizer::kBos,
                                     'e',
                                     'f',
                                     ByteTokenizer::kEos};
  EXPECT_EQ(s.tokens(), want);
}

TEST(TokenStreamTest, BuiltinDatasetIsSizeable) {
  TokenStream s = TokenStream::Builtin();
  EXPECT_GE(s.documents(), 10);
  EXPECT_GT(s.tokens().size(), 4000u);
}

TEST(BatcherTest, WindowsAreShiftedAndMasked) {
  TokenStream s = TokenStream::FromText("abcdefgh\n\nijklmnop\n\nqrstuvwx");
  Result<Batcher> b = Batcher::Create(&s, 4, 7, /*seed=*/5);
  ASSERT_TRUE(b.ok());
  const std::vector<int32_t> &all = s.tokens();
  for (int64_t step = 0; step < 20; ++step) {
    MicroBatch mb = b->MakeMicroBatch(step, 1);
    ASSERT_EQ(mb.tokens.size(), 28u);
    int64_t valid = 0;
    for (int64_t r = 0; r < 4; ++r) {
      // The row is a window of the stream; each target is the next token unless
      // it is <bos>.
      const int32_t *row = &mb.tokens[size_t(r * 7)];
      auto it = std::search(all.begin(), all.end(), row, row + 7);
      ASSERT_NE(it, all.end());
      for (int64_t t = 0; t < 7; ++t) {
        const int32_t next = *(it + t + 1);
        const int32_t target = mb.targets[size_t(r * 7 + t)];
        EXPECT_EQ(target, next == ByteTokenizer::kBos ? kIgnoreTarget : next);
        valid += target != kIgnoreTarget;
      }
    }
    EXPECT_EQ(mb.valid_targets, valid);
  }
}

TEST(BatcherTest, DeterministicBySeedAndCoordinates) {
  TokenStream s = TokenStream::Builtin();
  Result<Batcher> a = Batcher::Create(&s, 3, 64, 1);
  Result<Batcher> a2 = Batcher::Create(&s, 3, 64, 1);
  Result<Batcher> c = Batcher::Create(&s, 3, 64, 2);
  ASSERT_TRUE(a.ok() && a2.ok() && c.ok());
  EXPECT_EQ(a->MakeMicroBatch(7, 2).tokens, a2->MakeMicroBatch(7, 2).tokens);
  EXPECT_NE(a->MakeMicroBatch(7, 2).tokens, c->MakeMicroBatch(7, 2).tokens);
  EXPECT_NE(a->MakeMicroBatch(7, 2).tokens, a->MakeMicroBatch(7, 1).tokens);
  EXPECT_NE(a->MakeMicroBatch(7, 2).tokens, a->MakeMicroBatch(8, 2).tokens);
  EXPECT_EQ(a->ValidTargets(3, 2),
            a->MakeMicroBatch(3, 0).valid_targets + a->MakeMicroBatch(3, 1).valid_targets);
  // Windows spread over the stream rather than repeating a few starts.
  std::set<std::vector<int32_t>> distinct;
  for (int64_t step = 0; step < 50; ++step) distinct.insert(a->MakeMicroBatch(step, 0).tokens);
  EXPECT_EQ(distinct.size(), 50u);
}

TEST(BatcherTest, RefusesStreamShorterThanAWindow) {
  TokenStream s = TokenStream::FromText("abc");  // 5 tokens with <bos>, <eos>
  EXPECT_TRUE(Batcher::Create(&s, 1, 4, 0).ok());
  Result<Batcher> b = Batcher::Create(&s, 1, 5, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("--seq-len"), std::string::npos);
}

}  // namespace
}  // namespace ferry
