// SwiGLU (the Llama/Qwen MLP activation), forward and backward:
//   h = silu(gate) * up,   silu(g) = g * sigmoid(g)
// The input is one (N, 2I) tensor, each row [gate (I) | up (I)]: the model fuses gate_proj and
// up_proj into one GEMM whose weight stacks gate_proj's rows first, then up_proj's, so the GEMM
// output is this tensor with no copy.
// Backward (activation gradients: written, =), one (N, 2I) result laid out like the input:
//   dgate = dh * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))),   dup = dh * silu(g)
// Storage f32, bf16 or f16 per tensor, math fp32, one rounding per output. No scratch; outputs
// must not overlap inputs. Thread-safety: pure; the caller owns the tensors.
#pragma once

#include <cstddef>

#include "kernels/device.h"
#include "kernels/status.h"
#include "kernels/tensor.h"

namespace ferry {

struct SwiGluForwardArgs {
  Tensor gate_up;  // (N, 2I): [gate | up] per row
  Tensor h;        // (N, I), written
};

struct SwiGluBackwardArgs {
  Tensor gate_up;   // (N, 2I), the forward's input
  Tensor dh;        // (N, I)
  Tensor dgate_up;  // (N, 2I), written (=): [dgate | dup] per row
};

Status ValidateSwiGluForward(const SwiGluForwardArgs& a);
Status ValidateSwiGluBackward(const SwiGluBackwardArgs& a);
inline size_t SwiGluScratchBytes(const Device&) { return 0; }  // for the planner's uniformity
// Validate, then enqueue on d's compute stream.
Status SwiGluForward(Device& d, const SwiGluForwardArgs& a);
Status SwiGluBackward(Device& d, const SwiGluBackwardArgs& a);

}  // namespace ferry
