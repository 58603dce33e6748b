// NF4 dequantization on a device: a frozen 4-bit weight (kernels/nf4.h: bitsandbytes' layout)
// expanded to f32, bf16 or f16 before a GEMM uses it.
//
//   out[i] = code[q_i] * absmax[i / block]                     (q_i: element i's 4-bit code)
//   nested: absmax[b] = nested_code[absmax_q[b]] * nested_absmax[b / nested_block] + nested_offset
//
// Math fp32 in that order (one product, then for nested absmax one product and one sum), one
// rounding to out's dtype: bit for bit the host DequantizeNf4 and bitsandbytes' dequantize_4bit.
// Element 2i is the high nibble of packed[i], element 2i + 1 the low one. No scratch.
// Thread-safety: pure; the caller owns the tensors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device.h"
#include "kernels/nf4.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct Nf4DequantizeArgs {
  Tensor packed;  // u8 ((numel + 1) / 2): two 4-bit codes a byte
  Tensor code;    // f32 (16): the 4-bit map
  // Not nested: f32 (blocks). Nested: u8 (blocks), the 8-bit indices into nested_code.
  Tensor absmax;
  Tensor nested_absmax;  // nested only: f32 (ceil(blocks / nested_block))
  Tensor nested_code;    // nested only: f32 (256)
  // Nested only: f32 (1), on the device with the rest, so a device copy is whole (finite: the
  // host codec's ValidateNf4 checks it before it is uploaded; the op does not read device data).
  Tensor nested_offset;
  int64_t nested_block = kNf4NestedBlock;
  int64_t block = kNf4Block;
  Tensor out;  // f32, bf16 or f16 (numel elements, any shape), written (=)

  bool nested() const { return absmax.dtype == DType::kU8; }
};

// Sizes from out's element count and the block sizes; block positive and even, nested_block
// positive; every tensor given with its dtype.
Status ValidateNf4Dequantize(const Nf4DequantizeArgs& a);
inline size_t Nf4DequantizeScratchBytes(const Device&) { return 0; }  // for uniformity
// Validate, then enqueue on d's compute stream.
Status Nf4Dequantize(Device& d, const Nf4DequantizeArgs& a);

}  // namespace ferry
