// Reference RoPE (semantics in kernels/ops/rope.h): plain loops over host
// arrays in the real type R (float or double), for tests. Angles come from
// kernels/ops/rope_math.h (fp32, as HF); cos and sin are taken in R. Backward
// writes dx (activation gradient: =).
#pragma once

#include <cstdint>

namespace ferry::ref {

struct RopeDims {
  int64_t tokens = 0;      // N
  int64_t num_heads = 0;   // H
  int64_t head_dim = 0;    // D
  int64_t rotary_dim = 0;  // R (even, <= D)
};

// y = x*cos + rotate_half(x)*sin on the first R dims of each head; the rest
// copied.
template <typename R>
void RopeForward(const R* x,             // (N, H*D)
                 const int32_t* pos,     // (N)
                 const float* inv_freq,  // (R/2)
                 const RopeDims& dims,
                 R* y);  // (N, H*D)

// dx = the transpose (= inverse) of the forward rotation applied to dy.
template <typename R>
void RopeBackward(const R* dy, const int32_t* pos, const float* inv_freq, const RopeDims& dims,
                  R* dx);

}  // namespace ferry::ref
