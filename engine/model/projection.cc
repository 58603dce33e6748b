#include "engine/model/projection.h"

#include "kernels/ops/gemm.h"
#include "kernels/ops/gemm_bias_grad.h"
#include "kernels/ops/nf4_dequantize.h"

namespace ferry {

Status MatMul(Device& d, Tensor a, Tensor b, Tensor c, bool trans_a, bool trans_b, float alpha,
              float beta, Tensor bias, Tensor scratch) {
  return Gemm(d, {.a = a,
                  .b = b,
                  .c = c,
                  .bias = bias,
                  .scratch = scratch,
                  .trans_a = trans_a,
                  .trans_b = trans_b,
                  .alpha = alpha,
                  .beta = beta});
}

ProjectionPart PartOf(const DeviceParams& params, const std::string& module, Tensor y, Tensor dy) {
  ProjectionPart part;
  const DeviceParam& w = params.at(module + ".weight");
  part.w = w.w;
  part.nf4 = w.nf4;
  part.dw = w.grad;
  if (params.has(module + ".bias")) {
    const DeviceParam& b = params.at(module + ".bias");
    part.b = b.w;
    part.db = b.grad;
  }
  part.y = y;
  part.dy = dy;
  return part;
}

namespace {

// Rows [row, row + rows) of B (out, R) as an (rows, R) tensor.
Tensor LoraRows(const Tensor& b, int64_t row, int64_t rows) { return b.Rows(row, row + rows); }

// The part's weight as a GEMM operand: its own tensor, or its NF4 parts dequantized into
// p.dequant (each part's rows in turn; enqueued on d's compute stream before the product).
Result<Tensor> Weight(Device& d, const Projection& p, const ProjectionPart& part) {
  if (part.nf4.empty()) return part.w;
  if (p.dequant.bytes() < part.w.bytes()) {
    return Status::Internal("the blocks' dequantization buffer holds " +
                            std::to_string(p.dequant.bytes()) + " bytes, an NF4 weight of " +
                            part.w.shape.ToString() + " needs " + std::to_string(part.w.bytes()));
  }
  Tensor w = part.w;
  w.data = p.dequant.data;
  int64_t row = 0;
  for (const DeviceParam::Nf4Part& q : part.nf4) {
    Nf4DequantizeArgs a;  // the device copy, blocks of kNf4Block (nested: of kNf4NestedBlock)
    a.packed = q.t[Nf4Slot::kPacked];
    a.code = q.t[Nf4Slot::kCode];
    a.absmax = q.t[Nf4Slot::kAbsmax];
    if (q.nested()) {
      a.nested_absmax = q.t[Nf4Slot::kNestedAbsmax];
      a.nested_code = q.t[Nf4Slot::kNestedCode];
      a.nested_offset = q.t[Nf4Slot::kNestedOffset];
    }
    a.out = w.Rows(row, row + q.rows);
    FERRY_RETURN_IF_ERROR(Nf4Dequantize(d, a));
    row += q.rows;
  }
  return w;
}

}  // namespace

Status ProjectionForward(Device& d, const Projection& p, Tensor x, Tensor u) {
  for (const ProjectionPart& part : p.parts) {
    FERRY_ASSIGN_OR_RETURN(const Tensor w, Weight(d, p, part));
    FERRY_RETURN_IF_ERROR(MatMul(d, x, w, part.y, false, true, 1, 0, part.b, p.scratch));
  }
  if (p.lora == nullptr) return Status::Ok();
  const LoraPack& l = *p.lora;
  FERRY_RETURN_IF_ERROR(MatMul(d, x, l.a, u, false, true, 1, 0, {}, p.scratch));
  int64_t row = 0;
  for (const ProjectionPart& part : p.parts) {
    const int64_t rows = part.w.dim(0);
    FERRY_RETURN_IF_ERROR(
        MatMul(d, u, LoraRows(l.b, row, rows), part.y, false, true, l.scaling, 1, {}, p.scratch));
    row += rows;
  }
  return Status::Ok();
}

Status ProjectionBackward(Device& d, const Projection& p, Tensor x, Tensor u, Tensor du, Tensor dx,
                          bool accumulate_dx) {
  bool dx_written = accumulate_dx;
  for (const ProjectionPart& part : p.parts) {
    FERRY_ASSIGN_OR_RETURN(const Tensor w, Weight(d, p, part));
    FERRY_RETURN_IF_ERROR(
        MatMul(d, part.dy, w, dx, false, false, 1, dx_written ? 1 : 0, {}, p.scratch));
    dx_written = true;
    if (!part.dw.data.is_null()) {
      FERRY_RETURN_IF_ERROR(MatMul(d, part.dy, x, part.dw, true, false, 1, 1, {}, p.scratch));
    }
    if (!part.db.data.is_null()) FERRY_RETURN_IF_ERROR(BiasGrad(d, {part.dy, part.db}));
  }
  if (p.lora == nullptr) return Status::Ok();
  const LoraPack& l = *p.lora;
  int64_t row = 0;
  bool first = true;
  for (const ProjectionPart& part : p.parts) {
    const int64_t rows = part.w.dim(0);
    FERRY_RETURN_IF_ERROR(
        MatMul(d, part.dy, u, LoraRows(l.db, row, rows), true, false, l.scaling, 1, {}, p.scratch));
    FERRY_RETURN_IF_ERROR(MatMul(d, part.dy, LoraRows(l.b, row, rows), du, false, false, l.scaling,
                                 first ? 0 : 1, {}, p.scratch));
    first = false;
    row += rows;
  }
  FERRY_RETURN_IF_ERROR(MatMul(d, du, x, l.da, true, false, 1, 1, {}, p.scratch));
  return MatMul(d, du, l.a, dx, false, false, 1, 1, {}, p.scratch);
}

}  // namespace ferry
