#include "offload/zstd_codec.h"

#include <gtest/gtest.h>

#include "offload/offload_test_util.h"

namespace ferry {
namespace {

TEST(ZstdCodec, RoundTripsAndDetectsDamage) {
  for (int level : {-1, 1, 3}) {
    ZstdCodec codec(level);
    auto data = testing::Pattern(100000, 1);
    for (size_t i = 0; i < data.size(); i += 2) data[i] = std::byte{7};
    std::vector<std::byte> packed(ZstdCodec::CompressBound(data.size()));
    auto n = codec.Compress(data, packed);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_LT(*n, data.size());
    std::vector<std::byte> back(data.size());
    ASSERT_TRUE(codec.Decompress({packed.data(), *n}, back).ok());
    EXPECT_TRUE(back == data) << "level " << level;
    std::vector<std::byte> wrong_size(data.size() + 1);
    EXPECT_EQ(codec.Decompress({packed.data(), *n}, wrong_size).code(), StatusCode::kCorruption);
  }
}

TEST(ZstdCodec, TooSmallOutputIsRefused) {
  ZstdCodec codec(1);
  const auto noise = testing::Pattern(8192, 2);
  std::vector<std::byte> small(4096);
  EXPECT_FALSE(codec.Compress(noise, small).ok());
}

TEST(ZstdCodec, MeasuredDecision) {
  ZstdCodec codec(1);
  const std::vector<std::byte> zeros(1 << 20);
  const auto noise = testing::Pattern(1 << 20, 3);
  const CodecMeasurement mz = codec.Measure(zeros), mn = codec.Measure(noise);
  EXPECT_GT(mz.ratio, 100.0) << mz.ToString();
  EXPECT_LT(mn.ratio, 1.01) << mn.ToString();
  EXPECT_GT(mz.compress_bytes_per_s, 0.0);
  EXPECT_GT(mz.decompress_bytes_per_s, 0.0);
  // Noise never pays; zeros pay on a disk slower than the codec.
  EXPECT_FALSE(ZstdCodec::Pays(mn, 1e6));
  EXPECT_TRUE(ZstdCodec::Pays(mz, 1e7));
  // The rule itself, on fixed numbers: 2x ratio, 1 GB/s codec.
  const CodecMeasurement m{2.0, 1e9, 2e9};
  EXPECT_TRUE(ZstdCodec::Pays(m, 0.4e9));   // min(1, 2, 0.8) = 0.8 > 0.44
  EXPECT_FALSE(ZstdCodec::Pays(m, 0.95e9)); // min(1, 2, 1.9) = 1.0 < 1.045
}

}  // namespace
}  // namespace ferry
