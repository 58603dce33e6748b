// Projection: linear layers y = x W^T + b that share one input x, with an
// optional LoRA group (engine/model/device_params.h, LoraPack) adding s * (x
// A^T) B^T, forward and backward.
//
// A projection has one or more parts, each a base weight (out_k, in) with its
// output tensor; a LoRA group's B is split by rows over the parts in order (so
// GPT-2's fused c_attn can write q, k and v into three separate tensors, while
// its single adapter spans all three). u = x A^T (N, R) is computed once and
// saved for the backward.
//
// Backward accumulation: dx is written (=) or accumulated (+=, `accumulate_dx`,
// for inputs that feed several projections); parameter gradients dW, db, dA, dB
// are accumulated (+=); a frozen weight (null gradient tensor) gets no dW GEMM.
//
// Stateless functions over caller-owned device tensors; all work is enqueued on
// d's compute stream.
#pragma once

#include <vector>

#include "engine/model/device_params.h"
#include "kernels/device.h"

namespace ferry {

struct ProjectionPart {
  Tensor w;  // (out_k, in); null data when the weight is NF4 (`nf4`)
  // An NF4 weight's parts (DeviceParam::nf4), stacked by rows: each product dequantizes them
  // into Projection::dequant first.
  std::vector<DeviceParam::Nf4Part> nf4;
  Tensor dw;  // (out_k, in), null data when frozen
  Tensor b;   // (out_k) or null
  Tensor db;  // (out_k) or null (no bias, or frozen)
  Tensor y;   // (N, out_k): forward output (=)
  Tensor dy;  // (N, out_k): backward input
};

struct Projection {
  std::vector<ProjectionPart> parts;
  const LoraPack* lora = nullptr;  // rows of lora->b cover the parts' rows in order
  // Every GEMM's scratch (non-f32 operands on a CPU device are converted in panels there): at
  // least BlockScratchBytes (engine/model/param_spec.h) of the layer; may be absent in f32.
  Tensor scratch;
  // Room for the widest NF4 weight dequantized in the compute dtype (BlockDequantBytes); unused
  // without NF4.
  Tensor dequant;
};

// One part over the parameter `module` ("…q_proj") of `params`: weight,
// gradient, bias.
ProjectionPart PartOf(const DeviceParams& params, const std::string& module, Tensor y, Tensor dy);

// y_k = x W_k^T + b_k (+ s u B_k^T with u = x A^T, written to `u` (N, R)).
Status ProjectionForward(Device& d, const Projection& p, Tensor x, Tensor u);

// dx (= or +=) sum_k dy_k W_k (+ du A); dW_k += dy_k^T x; db_k += colsum(dy_k);
// dB_k += s dy_k^T u; du = s sum_k dy_k B_k (workspace (N, R)); dA += du^T x.
Status ProjectionBackward(Device& d, const Projection& p, Tensor x, Tensor u, Tensor du, Tensor dx,
                          bool accumulate_dx);

// c = alpha * op(a) op(b) + beta * c (+ bias), accumulated in fp32; `scratch` as GemmArgs's (none
// is needed when every operand is f32).
Status MatMul(Device& d, Tensor a, Tensor b, Tensor c, bool trans_a, bool trans_b, float alpha = 1,
              float beta = 0, Tensor bias = {}, Tensor scratch = {});

}  // namespace ferry
