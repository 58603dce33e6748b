// Hand-checked encodings and parser errors for tokenizer.json support (no Python needed; the
// comparison with Hugging Face tokenizers and tiktoken on thousands of strings is
// tests/tokenizer_check.py).
#include "engine/text/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/json.h"
#include "engine/testing/tokenizer_json.h"
#include "engine/text/utf8_text.h"

namespace ferry {
namespace {

using json = nlohmann::json;

json ByteLevelJson() { return testing::ByteLevelTokenizerJson(); }

std::unique_ptr<Tokenizer> Parse(const json& j) {
  Result<std::unique_ptr<Tokenizer>> r = ParseTokenizerJson(j.dump(), "tokenizer.json");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::string ParseError(const json& j) {
  Result<std::unique_ptr<Tokenizer>> r = ParseTokenizerJson(j.dump(), "tokenizer.json");
  return r.ok() ? "ok" : r.status().message();
}

TEST(BpeTokenizerTest, ByteLevelMergesAndOffsets) {
  auto tok = Parse(ByteLevelJson());
  ASSERT_NE(tok, nullptr);
  Encoding e = tok->EncodeWithOffsets("hello world", false);
  // "hello" -> he(rank 0), ll(1), hell(2) + o; " world" -> Ġw + o r l d.
  EXPECT_EQ(e.ids, (std::vector<int32_t>{258, 'o', 259, 'o', 'r', 'l', 'd'}));
  using R = std::pair<uint32_t, uint32_t>;
  EXPECT_EQ(e.offsets, (std::vector<R>{{0, 4}, {4, 5}, {5, 7}, {7, 8}, {8, 9}, {9, 10}, {10, 11}}));
  EXPECT_EQ(tok->Decode(e.ids, false), "hello world");
  EXPECT_EQ(tok->vocab_size(), 262);
  EXPECT_EQ(tok->TokenId("<|eot|>"), 260);
  EXPECT_EQ(tok->TokenId("hell"), 258);
  EXPECT_EQ(tok->TokenId("nope"), std::nullopt);
}

TEST(BpeTokenizerTest, IgnoreMergesTakesWholeWords) {
  json j = ByteLevelJson();
  EXPECT_EQ(Parse(j)->Encode(" world", false), (std::vector<int32_t>{259, 'o', 'r', 'l', 'd'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(Parse(j)->Encode(" world", false), (std::vector<int32_t>{261}));
}

TEST(BpeTokenizerTest, SpecialTokensInTextAndDecodeSkipping) {
  auto tok = Parse(ByteLevelJson());
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids = tok->Encode("hi<|eot|>hi", false);
  EXPECT_EQ(ids, (std::vector<int32_t>{'h', 'i', 260, 'h', 'i'}));
  EXPECT_EQ(tok->Decode(ids, false), "hi<|eot|>hi");
  EXPECT_EQ(tok->Decode(ids, true), "hihi");
}

TEST(BpeTokenizerTest, InvalidUtf8BecomesReplacementCharacter) {
  auto tok = Parse(ByteLevelJson());
  ASSERT_NE(tok, nullptr);
  Encoding e = tok->EncodeWithOffsets("a\xFF", false);
  EXPECT_EQ(e.ids, (std::vector<int32_t>{'a', 0xEF, 0xBF, 0xBD}));  // U+FFFD's bytes
  EXPECT_EQ(e.offsets.back(), (std::pair<uint32_t, uint32_t>{1, 2}));
}

TEST(BpeTokenizerTest, LongRunsRoundTrip) {
  // Long runs of one character class stress the regex engine (JIT stack) and the merge loop.
  auto tok = Parse(ByteLevelJson());
  ASSERT_NE(tok, nullptr);
  std::string text = std::string(200000, ' ') + "x" + std::string(100000, '\n') + "hello";
  std::vector<int32_t> ids = tok->Encode(text, false);
  EXPECT_EQ(tok->Decode(ids, false), text);
}

TEST(BpeTokenizerTest, TemplateAddsBosEos) {
  json j = ByteLevelJson();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|eot|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "<|eot|>"}, {"type_id", 0}}}}})},
      {"special_tokens", {{"<|eot|>", {{"id", "<|eot|>"}, {"ids", {260}}}}}}};
  auto tok = Parse(j);
  ASSERT_NE(tok, nullptr);
  Encoding e = tok->EncodeWithOffsets("hi", true);
  EXPECT_EQ(e.ids, (std::vector<int32_t>{260, 'h', 'i', 260}));
  EXPECT_EQ(e.offsets.front(), (std::pair<uint32_t, uint32_t>{0, 0}));
  EXPECT_EQ(e.offsets.back(), (std::pair<uint32_t, uint32_t>{2, 2}));
  EXPECT_EQ(tok->special_ids().bos, 260);
  EXPECT_EQ(tok->special_ids().eos, 260);
}

// Llama 2 style: normalizer Prepend + Replace, byte fallback, decoder Replace/ByteFallback/Fuse/
// Strip.
json ByteFallbackJson() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  vocab["▁"] = 259;
  vocab["h"] = 260;
  vocab["i"] = 261;
  vocab["▁h"] = 262;
  vocab["▁hi"] = 263;
  json replace_space = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}};
  return {
      {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                    {{"id", 1}, {"content", "<s>"}, {"special", true}}})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "▁"}}, replace_space})}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"vocab", vocab},
        {"merges", json::array({"▁ h", "▁h i"})}}}};
}

TEST(BpeTokenizerTest, ByteFallbackWithPrependNormalizer) {
  auto tok = Parse(ByteFallbackJson());
  ASSERT_NE(tok, nullptr);
  // "hi é" -> "▁hi▁é": ▁hi, ▁, then é's bytes C3 A9 as <0xC3> <0xA9>.
  Encoding e = tok->EncodeWithOffsets("hi é", false);
  EXPECT_EQ(e.ids, (std::vector<int32_t>{263, 259, 3 + 0xC3, 3 + 0xA9}));
  using R = std::pair<uint32_t, uint32_t>;
  EXPECT_EQ(e.offsets, (std::vector<R>{{0, 2}, {2, 3}, {3, 5}, {3, 5}}));
  // The prepended "▁" stands for the first character, as in tokenizers (NormalizedString::prepend
  // aligns it with that character): alone as a token, it covers it.
  const Encoding lone = tok->EncodeWithOffsets("é", false);
  EXPECT_EQ(lone.ids, (std::vector<int32_t>{259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(lone.offsets, (std::vector<R>{{0, 2}, {0, 2}, {0, 2}}));
  EXPECT_EQ(tok->Decode(e.ids, false), "hi é");
  // A lone byte token decodes to U+FFFD.
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{263, 3 + 0xC3}, false), "hi\xEF\xBF\xBD");
  EXPECT_TRUE(tok->Describe().find("byte fallback") != std::string::npos);
}

TEST(BpeTokenizerTest, UnsupportedComponentsAreNamed) {
  json j = ByteLevelJson();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_EQ(ParseError(j), "tokenizer.json: pre_tokenizer type 'Whitespace' is not supported");
  j = ByteLevelJson();
  j["model"]["type"] = "WordPiece";
  EXPECT_EQ(ParseError(j), "tokenizer.json: model type 'WordPiece' is not supported");
  j = ByteLevelJson();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_EQ(ParseError(j), "tokenizer.json: normalizer type 'Lowercase' is not supported");
  j = ByteLevelJson();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_EQ(ParseError(j), "tokenizer.json: decoder type 'WordPiece' is not supported");
  j = ByteLevelJson();
  j["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_EQ(ParseError(j), "tokenizer.json: post_processor type 'BertProcessing' is not supported");
}

TEST(BpeTokenizerTest, MalformedFilesAreErrors) {
  json j = ByteLevelJson();
  j["model"]["merges"].push_back("x zz");
  EXPECT_NE(ParseError(j).find("model.merges[4] 'x zz' uses a token missing"), std::string::npos);
  j = ByteLevelJson();
  j["model"]["merges"].push_back("a b c");
  EXPECT_NE(ParseError(j).find("not two tokens"), std::string::npos);
  // Found by fuzzing (tokenizer_json): ids that are floats or beyond int32_t were converted with
  // undefined behaviour; now they are errors.
  for (const json& bad : {json(1e75), json(-1e75), json(0.5), json(uint64_t(1) << 40)}) {
    j = ByteLevelJson();
    j["model"]["vocab"]["a"] = bad;
    EXPECT_NE(ParseError(j).find("expected a 32-bit integer"), std::string::npos) << bad;
    j = ByteLevelJson();
    j["added_tokens"] = json::array({{{"id", bad}, {"content", "<x>"}, {"special", true}}});
    EXPECT_NE(ParseError(j).find("expected a 32-bit integer"), std::string::npos) << bad;
  }
  j = ByteLevelJson();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(ParseError(j).find("regex '(unclosed'"), std::string::npos);
  j = ByteLevelJson();
  j["model"]["vocab"] = "not an object";
  EXPECT_NE(ParseError(j).find("tokenizer.json: "), std::string::npos);
  j = ByteLevelJson();
  j["model"]["vocab"]["huge"] = 2000000000;  // would size tables by the largest id
  EXPECT_NE(ParseError(j).find("token 'huge' has id 2000000000"), std::string::npos);
  j = ByteLevelJson();
  json nested = {{"type", "ByteLevel"}};
  for (int i = 0; i < 100; ++i) {
    nested = {{"type", "Sequence"}, {"decoders", json::array({nested})}};
  }
  j["decoder"] = nested;
  EXPECT_NE(ParseError(j).find("nest too deeply"), std::string::npos);
  Result<std::unique_ptr<Tokenizer>> r = ParseTokenizerJson("{\"model\": [", "t.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("t.json: ", 0), 0u);
}

TEST(BpeTokenizerTest, LoadTokenizerReadsSpecialTokenNames) {
  std::string dir = std::filesystem::temp_directory_path() / "ferry_tok_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  std::ofstream(dir + "/tokenizer.json") << ByteLevelJson().dump();
  std::ofstream(dir + "/config.json") << R"({"bos_token_id": 104, "eos_token_id": [105, 7]})";
  Result<std::unique_ptr<Tokenizer>> r = LoadTokenizer(dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->special_ids().bos, 104);
  EXPECT_EQ((*r)->special_ids().eos, 105);
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"eos_token": {"content": "<|eot|>"}, "pad_token": "hell"})";
  r = LoadTokenizer(dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->special_ids().bos, 104);
  EXPECT_EQ((*r)->special_ids().eos, 260);
  EXPECT_EQ((*r)->special_ids().pad, 258);
  std::ofstream(dir + "/tokenizer_config.json") << R"({"bos_token": "<nope>"})";
  r = LoadTokenizer(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tokenizer_config.json names bos_token '<nope>'"),
            std::string::npos)
      << r.status().message();
  std::filesystem::remove_all(dir);
  r = LoadTokenizer(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(dir + "/tokenizer.json"), std::string::npos);
}

TEST(BpeTokenizerTest, ThreadsShareOneTokenizer) {
  // The tokenizer is const and thread-safe (TSan checks this test): concurrent encodes agree
  // with a serial one.
  auto tok = Parse(ByteFallbackJson());
  ASSERT_NE(tok, nullptr);
  const std::string text = "hi hi é hi  h\xC3\xA9";
  const std::vector<int32_t> want = tok->Encode(text, true);
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) bad[size_t(t)] += tok->Encode(text, true) != want;
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

TEST(Utf8TextTest, LossyMatchesRustMaximalSubparts) {
  // E2 82 is a truncated 3-byte sequence: one U+FFFD; FF alone: one; valid text kept.
  EXPECT_EQ(Utf8Lossy("a\xE2\x82z\xFF\xC3\xA9"), "a\xEF\xBF\xBDz\xEF\xBF\xBD\xC3\xA9");
  // ED A0 80 (a surrogate) is three errors: ED cannot be followed by A0.
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace ferry
