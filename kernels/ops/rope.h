// RoPE (rotary position embedding), forward and backward, in Hugging Face's
// rotate-half convention:
//   y = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x2, x1)
// over the two halves x1 = x[:R/2], x2 = x[R/2:R] of the first R (= rotary_dim)
// dims of every head; dims R..D-1 pass through unchanged (partial rotary, as
// GPT-NeoX/Phi; R = D for Llama, Qwen, Mistral). Angles for pair i of a token
// at position p are p * inv_freq[i] (see kernels/ops/rope_math.h for the exact
// fp32 arithmetic). The frequency table is either computed from `theta` or
// passed in (`inv_freq`), so scaled variants (Llama 3's frequency scaling,
// computed by the model layer) need nothing here.
//
// Applies to q (N, Hq*D) and k (N, Hkv*D) alike: call once per tensor with its
// head count. Backward is the inverse rotation (rotate by -angle): dx = dy*cos
// - rotate_half(dy)*sin, i.e. dx1 = dy1*cos + dy2*sin, dx2 = dy2*cos - dy1*sin.
// dx is an activation gradient: written (=).
//
// Storage f32 or bf16 (in and out share it), math in fp32. `out` may alias `in`
// (in place). No scratch. Thread-safety: the functions are pure; the caller
// owns the tensors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

// Largest head_dim the kernels accept (the per-token cos/sin table lives on the
// stack).
inline constexpr int64_t kRopeMaxHeadDim = 1024;

struct RopeArgs {
  Tensor in;               // (N, H*D) f32|bf16: x in forward, dy in backward
  Tensor out;              // (N, H*D) same dtype: y in forward, dx in backward (=); may
                           // alias `in`
  Tensor positions;        // i32 (N): position id of each token
  Tensor inv_freq;         // f32 (R/2), optional: null data means
                           // RopeInverseFrequencies(theta, R)
  int64_t num_heads = 0;   // H
  int64_t head_dim = 0;    // D: even, <= kRopeMaxHeadDim
  int64_t rotary_dim = 0;  // R: even, <= D; 0 means D
  float theta = 10000.0f;  // base, used only without inv_freq

  int64_t rotary() const { return rotary_dim == 0 ? head_dim : rotary_dim; }
};

// Shapes, dtypes and parameters; InvalidArgument naming the tensor and expected
// vs actual.
Status ValidateRope(const RopeArgs& a);

// RoPE needs no scratch (reported for the planner's uniformity).
inline size_t RopeScratchBytes(const Device&) { return 0; }

// out = rope(in). Validates, then enqueues on d's compute stream.
Status RopeForward(Device& d, const RopeArgs& a);
// out (= dx) = rope^-1(in (= dy)). Validates, then enqueues on d's compute
// stream.
Status RopeBackward(Device& d, const RopeArgs& a);

}  // namespace ferry
