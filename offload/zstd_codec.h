// ZstdCodec: per-block zstd compression for NVMe blocks and checkpoints, and a measured decision
// whether compressing pays.
//
// Compression pays when pushing bytes through the codec and then the disk moves more user bytes
// per second than the disk alone: with compression running alongside the I/O of other blocks, the
// rate is min(compress speed, decompress speed, ratio * disk rate), and it must beat the disk
// rate by a margin (the codec also costs CPU the trainer could use). Measure() times the codec on
// a sample of the real data; Pays() applies the rule.
//
// Ownership: owns its zstd contexts. Thread-safety: one thread at a time per ZstdCodec (zstd
// contexts are not shareable); use one codec per thread.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "kernels/status.h"

namespace ferry {

struct CodecMeasurement {
  double ratio = 1.0;                 // input bytes / compressed bytes
  double compress_bytes_per_s = 0;    // input bytes per second
  double decompress_bytes_per_s = 0;  // output bytes per second
  std::string ToString() const;
};

class ZstdCodec {
 public:
  // `level`: zstd's level (1 fast ... 19 strong; negative levels are faster still).
  explicit ZstdCodec(int level = 1);
  ~ZstdCodec();
  ZstdCodec(ZstdCodec&&) noexcept;
  ZstdCodec& operator=(ZstdCodec&&) noexcept;
  ZstdCodec(const ZstdCodec&) = delete;
  ZstdCodec& operator=(const ZstdCodec&) = delete;

  int level() const { return level_; }
  // Worst-case compressed size of n input bytes.
  static size_t CompressBound(size_t n);

  // Compresses `src` into `dst`; returns the compressed size. Fails (FailedPrecondition) when the
  // result would not fit in dst: callers then store the block raw.
  Result<size_t> Compress(std::span<const std::byte> src, std::span<std::byte> dst);
  // Decompresses exactly dst.size() bytes; anything else is Corruption.
  Status Decompress(std::span<const std::byte> src, std::span<std::byte> dst);

  // Times compression and decompression of `sample` (repeating small samples until ~2 ms have
  // passed, so the clock's resolution does not dominate).
  CodecMeasurement Measure(std::span<const std::byte> sample);
  // The rule above with a 10% margin. disk_bytes_per_s > 0.
  static bool Pays(const CodecMeasurement& m, double disk_bytes_per_s);

 private:
  struct Contexts;
  int level_;
  std::unique_ptr<Contexts> ctx_;
};

// Decompresses a stream of zstd frames a piece at a time, so a compressed file (a checkpoint's)
// is read back without its whole image in memory. Owns its zstd context; one thread at a time.
class ZstdDecompressStream {
 public:
  ZstdDecompressStream();
  ~ZstdDecompressStream();
  ZstdDecompressStream(ZstdDecompressStream&&) noexcept;
  ZstdDecompressStream& operator=(ZstdDecompressStream&&) noexcept;

  // Decompresses from the front of `in` into the front of `out`, advancing both past what was
  // consumed and made; stops when `in` is used up or `out` is full. Errors: Corruption.
  Status Decompress(std::span<const std::byte>& in, std::span<std::byte>& out);
  // True when everything given so far formed whole frames, all of it handed out.
  bool at_frame_end() const { return at_frame_end_; }

 private:
  struct Context;
  std::unique_ptr<Context> ctx_;
  bool at_frame_end_ = true;
};

}  // namespace ferry
