// NF4: 4-bit NormalFloat blockwise quantization (QLoRA, arXiv 2305.14314), stored exactly as
// bitsandbytes stores it, so ferry reads the published `*-bnb-4bit` folders and writes weights a
// bitsandbytes model would hold.
//
// A weight of n elements is split into blocks of `block` (64) consecutive elements (row-major,
// the last one short when n is not a multiple). Block b keeps absmax[b] = max |x| over the block
// (fp32) and each element the index q of the code nearest x / absmax[b] in the 16-entry table
// kNf4Code (bitsandbytes' `quant_map`); it dequantizes to code[q] * absmax[b], computed in fp32
// and rounded once to the output dtype. Two codes share a byte: element 2i in the high nibble,
// element 2i + 1 in the low one (a lone last element in the high nibble, low nibble 0).
//
// Double quantization ("compress_statistics", "nested"): the absmax vector itself is quantized.
// nested_offset = mean(absmax); the vector absmax - nested_offset is quantized in blocks of
// nested_block (256) to 8-bit indices into nested_code (bitsandbytes' signed dynamic map, 256
// fp32 entries), with nested_absmax (fp32) per nested block; absmax[b] dequantizes to
// nested_code[absmax_q[b]] * nested_absmax[b / nested_block] + nested_offset, in fp32.
//
// Rounding: bitsandbytes' CUDA kernel (which made the published folders) picks the code through
// a tree of thresholds halfway between neighbouring codes, computed in fp32; its CPU path takes
// the nearest code by |x - code|. The two differ only for values on (or within an fp32 ulp of) a
// threshold. Nf4Rounding names which one ferry follows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/status.h"

namespace ferry {

// bitsandbytes' NF4 table (functional.py, get_4bit_type("nf4")), ascending; index 7 is 0.
inline constexpr float kNf4Code[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

inline constexpr int64_t kNf4Block = 64;         // the only block size ferry computes with
inline constexpr int64_t kNf4NestedBlock = 256;  // bitsandbytes' nested block size

enum class Nf4Rounding {
  kThresholdTree,  // bitsandbytes' CUDA kernel (the published folders)
  kNearest,        // bitsandbytes' CPU quantize_4bit
};

// One NF4 weight on the host, in bitsandbytes' layout.
struct Nf4Host {
  std::vector<int64_t> shape;  // the logical (dequantized) shape, e.g. (out, in)
  int64_t block = kNf4Block;
  std::vector<float> code;      // 16 entries: the 4-bit map (bitsandbytes' quant_map)
  std::vector<uint8_t> packed;  // (numel + 1) / 2 bytes
  // Not nested: absmax, one fp32 per block; absmax_q, nested_* empty.
  std::vector<float> absmax;
  // Nested: absmax_q (one byte per block), nested_absmax (fp32 per nested block), nested_code
  // (256 fp32), nested_block, nested_offset; absmax empty.
  std::vector<uint8_t> absmax_q;
  std::vector<float> nested_absmax;
  std::vector<float> nested_code;
  int64_t nested_block = kNf4NestedBlock;
  float nested_offset = 0;

  bool nested() const { return !absmax_q.empty(); }
  int64_t numel() const;
  int64_t blocks() const { return (numel() + block - 1) / block; }
  // Bytes this weight occupies in ferry's tiers (packed codes + quant state, not the 16-entry
  // map, which is shared): what the memory model counts for it.
  size_t StoredBytes() const;
};

// The bytes an NF4 weight of `numel` elements occupies (packed + absmax, nested or not): what
// the planner counts for a frozen quantized weight without holding one.
size_t Nf4StoredBytes(int64_t numel, bool nested, int64_t block = kNf4Block,
                      int64_t nested_block = kNf4NestedBlock);

// bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True)), 256 entries: the
// nested_code double quantization uses.
std::vector<float> DynamicMap8();

// Quantizes `x` (numel = product of shape, fp32) to NF4 in blocks of `block`.
// Errors: an empty or non-positive shape, a size mismatch, block not positive and even.
Result<Nf4Host> QuantizeNf4(std::span<const float> x, std::vector<int64_t> shape, bool nested,
                            Nf4Rounding rounding = Nf4Rounding::kThresholdTree,
                            int64_t block = kNf4Block);

// Checks an NF4 weight's parts agree with each other (sizes from shape and block, a 16-entry code,
// a 256-entry nested code, finite absmax); `name` is the tensor named in the error.
Status ValidateNf4(const Nf4Host& w, const std::string& name);

// The fp32 absmax of every block (nested ones dequantized, as bitsandbytes does).
std::vector<float> Nf4Absmax(const Nf4Host& w);

// Dequantizes into `out` (numel elements of dtype `out_dtype`: f32, bf16 or f16), each element
// computed in fp32 and rounded once. REQUIRES: ValidateNf4(w) is OK.
void DequantizeNf4(const Nf4Host& w, DType out_dtype, void* out);

}  // namespace ferry
