#include "engine/plan/byte_size.h"

#include <gtest/gtest.h>

namespace ferry::plan {
namespace {

uint64_t Parse(std::string_view s) {
  Result<uint64_t> r = ParseByteSize(s);
  EXPECT_TRUE(r.ok()) << s << ": " << r.status().ToString();
  return r.ok() ? *r : 0;
}

TEST(ByteSize, ParsesPlainNumbersAndUnits) {
  EXPECT_EQ(Parse("0"), 0u);
  EXPECT_EQ(Parse("4096"), 4096u);
  EXPECT_EQ(Parse("4096B"), 4096u);
  EXPECT_EQ(Parse("24GiB"), 24ull << 30);
  EXPECT_EQ(Parse("24 GiB"), 24ull << 30);
  EXPECT_EQ(Parse("24gib"), 24ull << 30);
  EXPECT_EQ(Parse("24G"), 24ull << 30);
  EXPECT_EQ(Parse("500GB"), 500'000'000'000u);
  EXPECT_EQ(Parse("2TB"), 2'000'000'000'000u);
  EXPECT_EQ(Parse("1.5TiB"), 3ull << 39);
  EXPECT_EQ(Parse("1.5KiB"), 1536u);
  EXPECT_EQ(Parse("512MiB"), 512ull << 20);
  EXPECT_EQ(Parse("3KB"), 3000u);
  EXPECT_EQ(Parse(" 7 M "), 7ull << 20);
  EXPECT_EQ(Parse(".5K"), 512u);
}

TEST(ByteSize, RoundsFractionsToTheNearestByte) {
  EXPECT_EQ(Parse("0.001KB"), 1u);
  EXPECT_EQ(Parse("0.0004KB"), 0u);
}

TEST(ByteSize, RejectsMalformedInputWithAMessage) {
  for (std::string_view bad :
       {"", "GiB", "-1GiB", "12 parsecs", "1.2.3GB", "24GiB extra", "1e3", "20000000000TiB"}) {
    Result<uint64_t> r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "' parsed as " << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("byte size"), std::string::npos);
  }
}

TEST(ByteSize, Formats) {
  EXPECT_EQ(FormatByteSize(0), "0 B");
  EXPECT_EQ(FormatByteSize(1023), "1023 B");
  EXPECT_EQ(FormatByteSize(1536), "1.50 KiB");
  EXPECT_EQ(FormatByteSize(24ull << 30), "24.00 GiB");
  EXPECT_EQ(FormatByteSize(3ull << 39), "1.50 TiB");
}

}  // namespace
}  // namespace ferry::plan
