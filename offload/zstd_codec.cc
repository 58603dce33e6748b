#include "offload/zstd_codec.h"

#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace ferry {

struct ZstdCodec::Contexts {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~Contexts() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};

ZstdCodec::ZstdCodec(int level) : level_(level), ctx_(std::make_unique<Contexts>()) {}
ZstdCodec::~ZstdCodec() = default;
ZstdCodec::ZstdCodec(ZstdCodec&&) noexcept = default;
ZstdCodec& ZstdCodec::operator=(ZstdCodec&&) noexcept = default;

size_t ZstdCodec::CompressBound(size_t n) { return ZSTD_compressBound(n); }

Result<size_t> ZstdCodec::Compress(std::span<const std::byte> src, std::span<std::byte> dst) {
  const size_t n =
      ZSTD_compressCCtx(ctx_->c, dst.data(), dst.size(), src.data(), src.size(), level_);
  if (ZSTD_isError(n)) {
    return Status::FailedPrecondition(std::string("zstd compression of ") +
                                      std::to_string(src.size()) + " bytes into " +
                                      std::to_string(dst.size()) + ": " + ZSTD_getErrorName(n));
  }
  return n;
}

Status ZstdCodec::Decompress(std::span<const std::byte> src, std::span<std::byte> dst) {
  const size_t n = ZSTD_decompressDCtx(ctx_->d, dst.data(), dst.size(), src.data(), src.size());
  if (ZSTD_isError(n)) {
    return Status::Corruption(std::string("zstd decompression failed: ") + ZSTD_getErrorName(n));
  }
  if (n != dst.size()) {
    return Status::Corruption("zstd block decompressed to " + std::to_string(n) +
                              " bytes, expected " + std::to_string(dst.size()));
  }
  return Status::Ok();
}

struct ZstdDecompressStream::Context {
  ZSTD_DStream* d = ZSTD_createDStream();
  ~Context() { ZSTD_freeDStream(d); }
};

ZstdDecompressStream::ZstdDecompressStream() : ctx_(std::make_unique<Context>()) {}
ZstdDecompressStream::~ZstdDecompressStream() = default;
ZstdDecompressStream::ZstdDecompressStream(ZstdDecompressStream&&) noexcept = default;
ZstdDecompressStream& ZstdDecompressStream::operator=(ZstdDecompressStream&&) noexcept = default;

Status ZstdDecompressStream::Decompress(std::span<const std::byte>& in, std::span<std::byte>& out) {
  ZSTD_inBuffer src{in.data(), in.size(), 0};
  ZSTD_outBuffer dst{out.data(), out.size(), 0};
  while (dst.pos < dst.size && (src.pos < src.size || !at_frame_end_)) {
    const size_t before_in = src.pos, before_out = dst.pos;
    const size_t r = ZSTD_decompressStream(ctx_->d, &dst, &src);
    if (ZSTD_isError(r)) {
      return Status::Corruption(std::string("zstd decompression failed: ") + ZSTD_getErrorName(r));
    }
    at_frame_end_ = r == 0;
    if (src.pos == before_in && dst.pos == before_out) break;  // needs more input
  }
  in = in.subspan(src.pos);
  out = out.subspan(dst.pos);
  return Status::Ok();
}

CodecMeasurement ZstdCodec::Measure(std::span<const std::byte> sample) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kMinTime = std::chrono::milliseconds(2);
  CodecMeasurement m;
  if (sample.empty()) return m;
  std::vector<std::byte> packed(CompressBound(sample.size()));
  std::vector<std::byte> unpacked(sample.size());
  size_t packed_size = 0;
  int reps = 0;
  const auto c0 = Clock::now();
  do {
    auto r = Compress(sample, packed);
    packed_size = r.ok() ? *r : sample.size();
    ++reps;
  } while (Clock::now() - c0 < kMinTime);
  const double ctime = std::chrono::duration<double>(Clock::now() - c0).count();
  m.ratio = double(sample.size()) / double(std::max<size_t>(packed_size, 1));
  m.compress_bytes_per_s = double(sample.size()) * reps / ctime;
  reps = 0;
  const auto d0 = Clock::now();
  do {
    if (!Decompress({packed.data(), packed_size}, unpacked).ok()) break;
    ++reps;
  } while (Clock::now() - d0 < kMinTime);
  const double dtime = std::chrono::duration<double>(Clock::now() - d0).count();
  m.decompress_bytes_per_s = reps > 0 ? double(sample.size()) * reps / dtime : 0.0;
  return m;
}

bool ZstdCodec::Pays(const CodecMeasurement& m, double disk_bytes_per_s) {
  const double with =
      std::min({m.compress_bytes_per_s, m.decompress_bytes_per_s, m.ratio * disk_bytes_per_s});
  return with > 1.1 * disk_bytes_per_s;
}

std::string CodecMeasurement::ToString() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "ratio %.2f, compress %.2f GB/s, decompress %.2f GB/s", ratio,
                compress_bytes_per_s / 1e9, decompress_bytes_per_s / 1e9);
  return buf;
}

}  // namespace ferry
