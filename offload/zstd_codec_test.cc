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

// Frames one after another, fed and taken in small uneven pieces (a checkpoint read back a piece at
// a time), give the bytes compressed; a stream cut inside a frame is not at a frame's end, and a
// damaged one is Corruption.
TEST(ZstdDecompressStream, ReadsFramesInPiecesOfAnySize) {
  ZstdCodec codec(3);
  std::vector<std::byte> data, stored;
  for (int f = 0; f < 3; ++f) {
    std::vector<std::byte> frame = testing::Pattern(40000 + 1000 * size_t(f), uint64_t(f) + 3);
    for (size_t i = 0; i < frame.size(); i += 3) frame[i] = std::byte{1};
    std::vector<std::byte> packed(ZstdCodec::CompressBound(frame.size()));
    Result<size_t> n = codec.Compress(frame, packed);
    ASSERT_TRUE(n.ok());
    data.insert(data.end(), frame.begin(), frame.end());
    stored.insert(stored.end(), packed.begin(), packed.begin() + std::ptrdiff_t(*n));
  }
  auto decompress = [&](std::span<const std::byte> in, size_t in_piece, size_t out_piece,
                        std::vector<std::byte>& out) -> Result<bool> {
    ZstdDecompressStream stream;
    out.assign(data.size() + 16, std::byte{0});
    size_t made = 0;
    for (size_t at = 0; at < in.size(); at += in_piece) {
      std::span<const std::byte> piece = in.subspan(at, std::min(in_piece, in.size() - at));
      while (!piece.empty() || !stream.at_frame_end()) {
        std::span<std::byte> dst =
            std::span(out).subspan(made, std::min(out_piece, out.size() - made));
        const size_t room = dst.size();
        FERRY_RETURN_IF_ERROR(stream.Decompress(piece, dst));
        made += room - dst.size();
        if (room == dst.size() && piece.empty()) break;  // needs more input
      }
    }
    out.resize(made);
    return stream.at_frame_end();
  };
  std::vector<std::byte> back;
  for (const auto& [in_piece, out_piece] :
       {std::pair<size_t, size_t>{7, 5}, {4096, 1000}, {stored.size(), data.size() + 16}}) {
    Result<bool> whole = decompress(stored, in_piece, out_piece, back);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_TRUE(*whole);
    EXPECT_TRUE(back == data) << in_piece << " " << out_piece;
  }
  Result<bool> cut = decompress(std::span(stored).first(stored.size() - 10), 4096, 1000, back);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_FALSE(*cut);
  std::vector<std::byte> damaged = stored;
  damaged[2] ^= std::byte{0x5a};  // the first frame's magic number
  EXPECT_EQ(decompress(damaged, 4096, 1000, back).status().code(), StatusCode::kCorruption);
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
  EXPECT_TRUE(ZstdCodec::Pays(m, 0.4e9));    // min(1, 2, 0.8) = 0.8 > 0.44
  EXPECT_FALSE(ZstdCodec::Pays(m, 0.95e9));  // min(1, 2, 1.9) = 1.0 < 1.045
}

}  // namespace
}  // namespace ferry
