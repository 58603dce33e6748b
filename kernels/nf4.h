// NF4: 4-bit NormalFloat blockwise quantization (QLoRA, arXiv 2305.14314), stored exactly as
// bitsandbytes stores it, so ferry reads the published `*-bnb-4bit` folders and writes weights a
// bitsandbytes model would hold.
//
// A weight of n elements is split into blocks of `block` (64) consecutive elements (row-major,
// the last one short when n is not a multiple). Block b keeps absmax[b] = max |x| over the block
// (fp32) and each element the index q of the code nearest x / absmax[b] in the 16-entry table
// kNf4Code (bitsandbytes' `quant_map`); it dequantizes to code[q] * absmax[b], computed in fp32
// and rounded once to the output dtype. Two codes share a byte: element 2i in the high nibble,
// element 2i + 1 in the low one. A lone last element sits in the high nibble; the low nibble is
// the code bitsandbytes gives a zero padding element: 7 (0.0), or 0 under kThresholdTree when the
// last block is all zeros (see Rounding). Dequantization never reads it.
//
// Double quantization ("compress_statistics", "nested"): the absmax vector itself is quantized.
// nested_offset = mean(absmax); the vector absmax - nested_offset is quantized in blocks of
// nested_block (256) to 8-bit indices into nested_code (bitsandbytes' signed dynamic map, 256
// fp32 entries), with nested_absmax (fp32) per nested block; absmax[b] dequantizes to
// nested_code[absmax_q[b]] * nested_absmax[b / nested_block] + nested_offset, in fp32.
//
// Rounding: bitsandbytes' CUDA kernel (which made the published folders) picks the code through
// a tree of thresholds halfway between neighbouring codes, computed in fp32; its CPU path takes
// the nearest code by bucketize over the fp32 midpoints; both send a value on their boundary
// down. The tree's 15 constants (kNf4Thresholds) are those fp32 midpoints except four, between
// codes 0|1, 8|9, 12|13 and 14|15, where the decimal in the CUDA source rounds to the float an ulp
// beside the midpoint: a scaled value equal to the higher of the two gets code q + 1 from one
// rule and q from the other, the only scaled values they round apart. Beyond that they differ in
// how they scale and in the nested 8-bit codes. Nf4Rounding names which one ferry follows. In
// detail, each reproduced exactly:
//   kThresholdTree (csrc/kernels.cu, kQuantizeBlockwise): every block x * (1 / absmax) in fp32
//     through the tree dQuantizeNF4. An all-zero block: 1 / 0 = inf, 0 * inf = NaN, which the tree
//     sends to code 0 (-1.0), dequantizing to -0.0. Nested: quantize_blockwise on CUDA,
//     (absmax - offset) * (1 / nested_absmax) through dQuantize's binary search of the 256 codes,
//     then the nearer of the last two by their fp32 midpoint.
//   kNearest (backends/default quantize_4bit, bitsandbytes 0.50): full blocks x * (1 / absmax),
//     the last short block x / absmax (a true division, which can land an ulp from the product:
//     across a midpoint, a code apart from the tree's), absmax clamped to >= 1e-38 (a zero block
//     quantizes to 7 = 0.0; a zero short last block stores absmax 1e-38, as bitsandbytes does).
//     Nested: quantize_blockwise on the CPU (csrc/cpu_ops.cpp): the code read from a 65536-bin
//     lookup table over [-1, 1] (bin i holds the code nearest its centre -1 + 2i / 65535; a zero
//     block stores index 0). Within 2 / 65535 of as near as the exact nearest code, but not it
//     for values near a midpoint, nor near 0, where the map's codes lie closer than a bin.
// nested_offset is the mean of absmax, computed in double and rounded once; bitsandbytes takes
// torch's fp32 mean, whose summation order depends on the CPU's vector width, and can land an ulp
// away (NestNf4Absmax takes a given offset, so a test can use bitsandbytes' own).
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

// bitsandbytes' CUDA tree (dQuantizeNF4) decides between codes q and q + 1 at kNf4Thresholds[q],
// written there as these decimals (each read straight to fp32, as nvcc reads them): the fp32
// midpoint (kNf4Code[q] + kNf4Code[q + 1]) / 2, or for q = 0, 8, 12, 14 its neighbour.
inline constexpr float kNf4Thresholds[15] = {
    -0.8480964004993439f,  -0.6106329262256622f,  -0.4599952697753906f,   -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,   0.2035212516784668f,   0.2920137718319893f,    0.3893125355243683f,
    0.5016634166240692f,   0.6427869200706482f,   0.8614784181118011f,
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

// The bytes an NF4 weight of `numel` elements occupies: (numel + 1) / 2 packed, plus 4 a block
// (absmax) or, nested, 1 a block, 4 a nested block and 4 for the offset. The 16- and 256-entry
// maps are shared by every weight and not counted. What the planner counts for a frozen quantized
// weight without holding one.
size_t Nf4StoredBytes(int64_t numel, bool nested, int64_t block = kNf4Block,
                      int64_t nested_block = kNf4NestedBlock);

// bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True)), 256 entries: the
// nested_code double quantization uses.
std::vector<float> DynamicMap8();

// Quantizes `x` (numel = product of shape, fp32) to NF4 in blocks of `block`.
// Errors: an empty or non-positive shape, a size mismatch, block not positive and even, a value
// of x not finite.
Result<Nf4Host> QuantizeNf4(std::span<const float> x, std::vector<int64_t> shape, bool nested,
                            Nf4Rounding rounding = Nf4Rounding::kThresholdTree,
                            int64_t block = kNf4Block);

// The nested (double) quantization of w->absmax around `offset`: fills absmax_q, nested_absmax,
// nested_code (DynamicMap8) and nested_offset, clears absmax. QuantizeNf4 calls it with the mean of
// absmax. Errors: w already nested, nested_block not positive, an absmax or offset not finite.
Status NestNf4Absmax(Nf4Host* w, float offset, Nf4Rounding rounding);

// Checks an NF4 weight's parts agree with each other (sizes from shape and block, a 16-entry code,
// a 256-entry nested code, finite absmax); `name` is the tensor named in the error.
Status ValidateNf4(const Nf4Host& w, const std::string& name);

// The fp32 absmax of every block (nested ones dequantized, as bitsandbytes does).
std::vector<float> Nf4Absmax(const Nf4Host& w);

// The per-element arithmetic every dequantizer shares (host, CPU kernel; the CUDA kernel spells the
// same roundings with __fmul_rn/__fadd_rn). Files computing with them compile with
// -ffp-contract=off: bitsandbytes rounds the product and the sum apart, never as one fma.
// Element i's 4-bit code: the high nibble of packed[i / 2] for even i, the low one for odd i.
inline uint8_t Nf4Nibble(const uint8_t* packed, int64_t i) {
  const uint8_t byte = packed[i >> 1];
  return (i & 1) != 0 ? uint8_t(byte & 0x0f) : uint8_t(byte >> 4);
}
// An element before its output rounding: code[q] * absmax, one fp32 product.
inline float Nf4Value(float code_q, float absmax) { return code_q * absmax; }
// A nested block's absmax: nested_code[q] * nested_absmax, then + nested_offset, each rounded.
inline float Nf4NestedAbsmax(float code_q, float nested_absmax, float offset) {
  const float scaled = code_q * nested_absmax;
  return scaled + offset;
}

// Dequantizes into `out` (numel elements of dtype `out_dtype`: f32, bf16 or f16), each element
// computed in fp32 and rounded once. REQUIRES: ValidateNf4(w) is OK.
void DequantizeNf4(const Nf4Host& w, DType out_dtype, void* out);

}  // namespace ferry
