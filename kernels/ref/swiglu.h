// Reference SwiGLU over a fused (n, 2i) input, gate first (real type R = float or double):
//   gate = gu[:, :i], up = gu[:, i:],  h = silu(gate) * up,  silu(g) = g * sigmoid(g).
// Backward (activation gradients: =):
//   dgate = dh * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))),  dup = dh * silu(g).
#pragma once

#include <cstdint>

namespace ferry::ref {

template <typename R>
void SwiGluForward(int64_t n, int64_t i, const R* gu,  // (n, 2i)
                   R* h);                              // (n, i)
template <typename R>
void SwiGluBackward(int64_t n, int64_t i, const R* gu,  // (n, 2i)
                    const R* dh,                        // (n, i)
                    R* dgu);                            // (n, 2i), =

}  // namespace ferry::ref
