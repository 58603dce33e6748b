#include "offload/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>

#include "offload/offload_test_util.h"

namespace ferry {
namespace {

TEST(Crc32c, StandardCheckValue) {
  const char* s = "123456789";
  const auto bytes = std::as_bytes(std::span(s, std::strlen(s)));
  EXPECT_EQ(Crc32c(bytes), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable(bytes), 0xE3069283u);
}

TEST(Crc32c, HardwareMatchesPortableAndExtends) {
  const auto data = testing::Pattern(10007, 3);
  for (size_t n : {0, 1, 7, 8, 9, 63, 4096, 10007}) {
    const auto part = std::span(data).first(n);
    EXPECT_EQ(Crc32c(part), Crc32cPortable(part)) << n;
  }
  const auto all = std::span(data);
  EXPECT_EQ(Crc32c(all.subspan(1000), Crc32c(all.first(1000))), Crc32c(all));
}

// Large inputs take the three-stream path (from 1536 bytes on); sizes around its threshold, odd
// tails and a seed check the joining of the streams.
TEST(Crc32c, InterleavedStreamsMatchPortable) {
  const auto data = testing::Pattern((1 << 20) + 13, 7);
  for (size_t n : {1535, 1536, 1537, 1543, 1544, 4096, 65536 + 5, (1 << 20) + 13}) {
    const auto part = std::span(data).first(n);
    EXPECT_EQ(Crc32c(part), Crc32cPortable(part)) << n;
    EXPECT_EQ(Crc32c(part, 0x12345678u), Crc32cPortable(part, 0x12345678u)) << n;
  }
}

}  // namespace
}  // namespace ferry
