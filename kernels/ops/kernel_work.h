// KernelWork: the arithmetic and memory traffic of one kernel launch, worked out from the op's
// arguments. A virtual clock's cost function (kernels/cpu/virtual_clock.h) turns it into a
// kernel's duration, so a run on CPU devices can be timed deterministically.
//
// The figures are a model, not a count of what a kernel does: flops are the multiply-adds of the
// op's GEMM-like parts (2 per multiply-add, causal attention's masked half left out), and bytes
// are the sizes of the tensors it reads and writes, each once (scratch not counted). Elementwise
// ops have flops 0: their cost is their traffic.
//
// Pure functions of the arguments; thread-safe.
#pragma once

namespace ferry {

// The ops' argument structs (kernels/ops/<op>.h); declared here so that a device header can take a
// KernelWork without every op's header.
struct AdamWArgs;
struct AttentionBackwardArgs;
struct AttentionForwardArgs;
struct BiasGradArgs;
struct CastArgs;
struct DecodeAttentionArgs;
struct GeluBackwardArgs;
struct GeluForwardArgs;
struct GemmArgs;
struct LayerNormBackwardArgs;
struct LayerNormForwardArgs;
struct LmHeadLossArgs;
struct Nf4DequantizeArgs;
struct ResidualAccumulateArgs;
struct ResidualAddArgs;
struct RmsNormBackwardArgs;
struct RmsNormForwardArgs;
struct RopeArgs;
struct SwiGluBackwardArgs;
struct SwiGluForwardArgs;

struct KernelWork {
  double flops = 0;
  double bytes = 0;
};

KernelWork WorkOf(const GemmArgs& a);
KernelWork WorkOf(const BiasGradArgs& a);
KernelWork WorkOf(const CastArgs& a);
KernelWork WorkOf(const ResidualAddArgs& a);
KernelWork WorkOf(const ResidualAccumulateArgs& a);
KernelWork WorkOf(const RmsNormForwardArgs& a);
KernelWork WorkOf(const RmsNormBackwardArgs& a);
KernelWork WorkOf(const LayerNormForwardArgs& a);
KernelWork WorkOf(const LayerNormBackwardArgs& a);
KernelWork WorkOf(const RopeArgs& a);
KernelWork WorkOf(const AttentionForwardArgs& a);
KernelWork WorkOf(const AttentionBackwardArgs& a);
KernelWork WorkOf(const DecodeAttentionArgs& a);
KernelWork WorkOf(const SwiGluForwardArgs& a);
KernelWork WorkOf(const SwiGluBackwardArgs& a);
KernelWork WorkOf(const GeluForwardArgs& a);
KernelWork WorkOf(const GeluBackwardArgs& a);
// Forward only when a.dh is absent (null data), else forward and backward (dh and dW).
KernelWork WorkOf(const LmHeadLossArgs& a);
KernelWork WorkOf(const AdamWArgs& a);
KernelWork WorkOf(const Nf4DequantizeArgs& a);

}  // namespace ferry
