#include "kernels/ops/kernel_work.h"

#include <initializer_list>

#include "kernels/ops/adamw.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/cast.h"
#include "kernels/ops/decode_attention.h"
#include "kernels/ops/gelu.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/gemm_bias_grad.h"
#include "kernels/ops/layernorm.h"
#include "kernels/ops/lm_head_loss.h"
#include "kernels/ops/nf4_dequantize.h"
#include "kernels/ops/residual.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"

namespace ferry {
namespace {

// The summed sizes of the given tensors; absent ones (null data) count 0.
double Bytes(std::initializer_list<const Tensor*> tensors) {
  double sum = 0;
  for (const Tensor* t : tensors) {
    if (!t->data.is_null()) sum += double(t->bytes());
  }
  return sum;
}

// Multiply-adds of causal attention over the shape: QK^T and PV, each (T x T x D) per head and
// sequence, half of it masked. Sliding windows and documents are not discounted.
double CausalAttentionFlops(const AttentionShape& s) {
  return 2.0 * 2.0 * double(s.batch) * double(s.q_heads) * double(s.seq_len) * double(s.seq_len) *
         double(s.head_dim) / 2;
}

}  // namespace

KernelWork WorkOf(const GemmArgs& a) {
  const GemmDims d = GemmDimsOf(a);
  const double c_reads = a.beta != 0 ? double(a.c.bytes()) : 0;
  return {2.0 * double(d.m) * double(d.n) * double(d.k),
          Bytes({&a.a, &a.b, &a.c, &a.bias}) + c_reads};
}
KernelWork WorkOf(const BiasGradArgs& a) { return {0, Bytes({&a.dy, &a.db})}; }
KernelWork WorkOf(const CastArgs& a) { return {0, Bytes({&a.src, &a.dst})}; }
KernelWork WorkOf(const ResidualAddArgs& a) { return {0, Bytes({&a.a, &a.b, &a.y})}; }
KernelWork WorkOf(const ResidualAccumulateArgs& a) { return {0, Bytes({&a.dy, &a.dx, &a.dx})}; }
KernelWork WorkOf(const RmsNormForwardArgs& a) {
  return {0, Bytes({&a.x, &a.weight, &a.y, &a.rstd})};
}
KernelWork WorkOf(const RmsNormBackwardArgs& a) {
  return {0, Bytes({&a.dy, &a.x, &a.weight, &a.rstd, &a.dx, &a.dweight})};
}
KernelWork WorkOf(const LayerNormForwardArgs& a) {
  return {0, Bytes({&a.x, &a.weight, &a.bias, &a.y, &a.mean, &a.rstd})};
}
KernelWork WorkOf(const LayerNormBackwardArgs& a) {
  return {0, Bytes({&a.dy, &a.x, &a.weight, &a.mean, &a.rstd, &a.dx, &a.dweight, &a.dbias})};
}
KernelWork WorkOf(const RopeArgs& a) { return {0, Bytes({&a.in, &a.out, &a.positions})}; }
KernelWork WorkOf(const AttentionForwardArgs& a) {
  return {CausalAttentionFlops(a.shape), Bytes({&a.q, &a.k, &a.v, &a.doc_ids, &a.o, &a.lse})};
}
// Backward recomputes the scores and forms dV, dP, dQ and dK: 2.5 times the forward's products.
KernelWork WorkOf(const AttentionBackwardArgs& a) {
  return {2.5 * CausalAttentionFlops(a.shape),
          Bytes({&a.q, &a.k, &a.v, &a.doc_ids, &a.o, &a.lse, &a.d_o, &a.dq, &a.dk, &a.dv})};
}
KernelWork WorkOf(const DecodeAttentionArgs& a) {
  const DecodeAttentionShape& s = a.shape;
  const double keys = double(s.past + s.new_tokens);
  return {2.0 * 2.0 * double(s.new_tokens) * double(s.q_heads) * keys * double(s.head_dim),
          Bytes({&a.q, &a.k_new, &a.v_new, &a.o, &a.lse}) +
              2.0 * keys * double(s.kv_heads * s.head_dim) * 4};
}
KernelWork WorkOf(const SwiGluForwardArgs& a) { return {0, Bytes({&a.gate_up, &a.h})}; }
KernelWork WorkOf(const SwiGluBackwardArgs& a) {
  return {0, Bytes({&a.gate_up, &a.dh, &a.dgate_up})};
}
KernelWork WorkOf(const GeluForwardArgs& a) { return {0, Bytes({&a.x, &a.y})}; }
KernelWork WorkOf(const GeluBackwardArgs& a) { return {0, Bytes({&a.x, &a.dy, &a.dx})}; }
// Logits (N x V x C); with a backward, dh and dW take as many again each.
KernelWork WorkOf(const LmHeadLossArgs& a) {
  const double n = double(a.h.dim(0)), c = double(a.h.dim(1)), v = double(a.w.dim(0));
  const double passes = a.dh.data.is_null() ? 1 : 3;
  return {passes * 2.0 * n * v * c,
          Bytes({&a.h, &a.w, &a.token_loss, &a.loss_sum, &a.dh, &a.dw}) + n * 4};
}
KernelWork WorkOf(const AdamWArgs& a) {
  return {0, Bytes({&a.p, &a.g, &a.m, &a.v, &a.p_bf16}) + Bytes({&a.p, &a.m, &a.v})};
}
KernelWork WorkOf(const Nf4DequantizeArgs& a) {
  return {0, Bytes({&a.packed, &a.code, &a.absmax, &a.nested_absmax, &a.nested_code,
                    &a.nested_offset, &a.out})};
}

}  // namespace ferry
