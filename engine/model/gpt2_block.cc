// The GPT-2 decoder block. Positions are learned (added by the host embedding),
// so there is no RoPE; c_attn is one (3C, C) weight whose row thirds produce q,
// k and v.
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/decoder_blocks.h"
#include "engine/model/projection.h"
#include "engine/model/tensor_carver.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/gelu.h"
#include "kernels/ops/layernorm.h"
#include "kernels/ops/residual.h"

namespace ferry {
namespace {

// What one block keeps for its backward (beyond its input x).
struct Saved {
  Tensor xn1;                               // (N, C) ln_1(x)
  Tensor mean1, rstd1;                      // (N) f32
  Tensor q, k, v;                           // (N, C) each: the row thirds of c_attn
  Tensor att;                               // (N, C) attention output
  Tensor lse;                               // (N, H) f32
  Tensor x_mid;                             // (N, C) residual stream after attention
  Tensor xn2;                               // (N, C) ln_2(x_mid)
  Tensor mean2, rstd2;                      // (N) f32
  Tensor fc;                                // (N, I) c_fc output
  Tensor act;                               // (N, I) gelu(fc)
  Tensor u_attn, u_proj, u_fc, u_mlp_proj;  // LoRA x A^T (N, R), when adapted
};

struct Workspace {
  Tensor branch;        // (N, C)
  Tensor d_act;         // (N, I)
  Tensor d_xn;          // (N, C)
  Tensor d_att;         // (N, C)
  Tensor dq, dk, dv;    // (N, C) each
  Tensor du;            // (N, Rmax)
  Tensor attn_scratch;  // bytes
  Tensor sink;          // (2C) f32 gradient sink for frozen LayerNorm weight and bias
};

constexpr const char* kModules[] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};

class Gpt2Blocks final : public DecoderBlocks {
 public:
  explicit Gpt2Blocks(const BlocksContext& ctx) : ctx_(ctx), c_(*ctx.config), d_(*ctx.device) {}

  Status Init() {
    const int64_t N = ctx_.shape.tokens(), C = c_.hidden_size, I = c_.intermediate_size;
    attn_shape_ = {ctx_.shape.batch, ctx_.shape.seq_len, c_.num_heads, c_.num_heads, c_.head_dim};
    saved_.resize(size_t(ctx_.num_slots));
    for (int s = 0; s < ctx_.num_slots; ++s) {
      FERRY_ASSIGN_OR_RETURN(DeviceBuffer b, AllocateCarved(d_, "blocks.saved." + std::to_string(s),
                                                            [&](TensorCarver& cv) {
                                                              LayoutSaved(cv, saved_[size_t(s)]);
                                                            }));
      saved_buffers_.push_back(std::move(b));
    }
    int64_t rmax = 1;
    for (const char* m : kModules) {
      if (const LoraPack* p = Lora(0, m)) rmax = std::max(rmax, p->total_rank());
    }
    const size_t attn_bytes = std::max<size_t>(AttentionScratchBytes(d_, attn_shape_), 4);
    FERRY_ASSIGN_OR_RETURN(
        workspace_buffer_, AllocateCarved(d_, "blocks.workspace", [&](TensorCarver& cv) {
          ws_.branch = cv.Take(DType::kF32, {N, C});
          ws_.d_act = cv.Take(DType::kF32, {N, I});
          ws_.d_xn = cv.Take(DType::kF32, {N, C});
          ws_.d_att = cv.Take(DType::kF32, {N, C});
          ws_.dq = cv.Take(DType::kF32, {N, C});
          ws_.dk = cv.Take(DType::kF32, {N, C});
          ws_.dv = cv.Take(DType::kF32, {N, C});
          ws_.du = cv.Take(DType::kF32, {N, rmax});
          ws_.attn_scratch = cv.Take(DType::kF32, {int64_t((attn_bytes + 3) / 4)});
          ws_.sink = cv.Take(DType::kF32, {2 * C});
        }));
    return Status::Ok();
  }

  Status Forward(int64_t block, int slot, Tensor x, Tensor y) override {
    Saved& s = saved_[size_t(slot)];
    const std::string p = Prefix(block);
    const float eps = float(c_.norm_eps);
    FERRY_RETURN_IF_ERROR(LayerNormForward(
        d_, {x, W(p + "ln_1.weight"), W(p + "ln_1.bias"), s.xn1, s.mean1, s.rstd1, eps}));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, Qkv(block, s), s.xn1, s.u_attn));
    AttentionForwardArgs a;
    a.shape = attn_shape_;
    a.q = s.q;
    a.k = s.k;
    a.v = s.v;
    a.o = s.att;
    a.lse = s.lse;
    a.scratch = ws_.attn_scratch;
    a.scale = Scale();
    FERRY_RETURN_IF_ERROR(AttentionForward(d_, a));
    FERRY_RETURN_IF_ERROR(
        ProjectionForward(d_, One(block, "attn.c_proj", ws_.branch, {}), s.att, s.u_proj));
    FERRY_RETURN_IF_ERROR(ResidualAdd(d_, {x, ws_.branch, s.x_mid}));
    FERRY_RETURN_IF_ERROR(LayerNormForward(
        d_, {s.x_mid, W(p + "ln_2.weight"), W(p + "ln_2.bias"), s.xn2, s.mean2, s.rstd2, eps}));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, One(block, "mlp.c_fc", s.fc, {}), s.xn2, s.u_fc));
    FERRY_RETURN_IF_ERROR(GeluForward(d_, {s.fc, s.act, GeluApprox::kTanh}));
    FERRY_RETURN_IF_ERROR(
        ProjectionForward(d_, One(block, "mlp.c_proj", ws_.branch, {}), s.act, s.u_mlp_proj));
    return ResidualAdd(d_, {s.x_mid, ws_.branch, y});
  }

  Status Backward(int64_t block, int slot, Tensor x, Tensor dy, Tensor dx) override {
    Saved& s = saved_[size_t(slot)];
    const std::string p = Prefix(block);
    Workspace& w = ws_;
    // MLP: y = x_mid + c_proj(gelu(c_fc(ln_2(x_mid)))).
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, One(block, "mlp.c_proj", {}, dy), s.act,
                                             s.u_mlp_proj, Du(block, "mlp.c_proj"), w.d_act,
                                             false));
    FERRY_RETURN_IF_ERROR(GeluBackward(d_, {s.fc, w.d_act, w.d_act, GeluApprox::kTanh}));
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, One(block, "mlp.c_fc", {}, w.d_act), s.xn2, s.u_fc,
                                             Du(block, "mlp.c_fc"), w.d_xn, false));
    FERRY_RETURN_IF_ERROR(
        LayerNormBackward(d_, {w.d_xn, s.x_mid, W(p + "ln_2.weight"), s.mean2, s.rstd2, dx,
                               G(p + "ln_2.weight", 0), G(p + "ln_2.bias", c_.hidden_size)}));
    FERRY_RETURN_IF_ERROR(ResidualAccumulate(d_, {dy, dx}));  // dx = d loss / d x_mid
    // Attention: x_mid = x + c_proj(attention(c_attn(ln_1(x)))).
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, One(block, "attn.c_proj", {}, dx), s.att, s.u_proj,
                                             Du(block, "attn.c_proj"), w.d_att, false));
    AttentionBackwardArgs a;
    a.shape = attn_shape_;
    a.q = s.q;
    a.k = s.k;
    a.v = s.v;
    a.o = s.att;
    a.lse = s.lse;
    a.d_o = w.d_att;
    a.dq = w.dq;
    a.dk = w.dk;
    a.dv = w.dv;
    a.scratch = w.attn_scratch;
    a.scale = Scale();
    FERRY_RETURN_IF_ERROR(AttentionBackward(d_, a));
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, Qkv(block, s), s.xn1, s.u_attn,
                                             Du(block, "attn.c_attn"), w.d_xn, false));
    FERRY_RETURN_IF_ERROR(
        LayerNormBackward(d_, {w.d_xn, x, W(p + "ln_1.weight"), s.mean1, s.rstd1, w.d_xn,
                               G(p + "ln_1.weight", 0), G(p + "ln_1.bias", c_.hidden_size)}));
    return ResidualAccumulate(d_, {w.d_xn, dx});
  }

 private:
  std::string Prefix(int64_t block) const { return "transformer.h." + std::to_string(block) + "."; }
  const LoraPack* Lora(int64_t block, const std::string& module) const {
    return ctx_.params->lora(Prefix(block) + module);
  }
  Tensor W(const std::string& name) const { return ctx_.params->at(name).w; }
  Tensor G(const std::string& name, int64_t sink_offset) const {
    const DeviceParam& p = ctx_.params->at(name);
    return p.grad.data.is_null() ? SinkView(ws_.sink, p.w.numel(), sink_offset) : p.grad;
  }
  float Scale() const { return float(1.0 / std::sqrt(double(c_.head_dim))); }
  Tensor Du(int64_t block, const std::string& module) const {
    const LoraPack* l = Lora(block, module);
    Tensor t = ws_.du;
    if (l != nullptr) t.shape = Shape{ctx_.shape.tokens(), l->total_rank()};
    return t;
  }
  Projection One(int64_t block, const std::string& module, Tensor y, Tensor dy) const {
    const std::string m = Prefix(block) + module;
    return {{PartOf(*ctx_.params, m, y, dy)}, ctx_.params->lora(m)};
  }
  // c_attn as three parts over its row thirds, writing q, k and v.
  Projection Qkv(int64_t block, const Saved& s) const {
    const std::string m = Prefix(block) + "attn.c_attn";
    const ProjectionPart whole = PartOf(*ctx_.params, m, {}, {});
    const Tensor ys[] = {s.q, s.k, s.v};
    const Tensor dys[] = {ws_.dq, ws_.dk, ws_.dv};
    const int64_t C = c_.hidden_size;
    Projection p{{}, ctx_.params->lora(m)};
    for (int64_t i = 0; i < 3; ++i) {
      ProjectionPart part;
      part.w = whole.w.Rows(i * C, (i + 1) * C);
      if (!whole.dw.data.is_null()) part.dw = whole.dw.Rows(i * C, (i + 1) * C);
      part.b = whole.b.Rows(i * C, (i + 1) * C);
      if (!whole.db.data.is_null()) part.db = whole.db.Rows(i * C, (i + 1) * C);
      part.y = ys[i];
      part.dy = dys[i];
      p.parts.push_back(part);
    }
    return p;
  }

  void LayoutSaved(TensorCarver& cv, Saved& s) const {
    const int64_t N = ctx_.shape.tokens(), C = c_.hidden_size, I = c_.intermediate_size;
    s.xn1 = cv.Take(DType::kF32, {N, C});
    s.mean1 = cv.Take(DType::kF32, {N});
    s.rstd1 = cv.Take(DType::kF32, {N});
    s.q = cv.Take(DType::kF32, {N, C});
    s.k = cv.Take(DType::kF32, {N, C});
    s.v = cv.Take(DType::kF32, {N, C});
    s.att = cv.Take(DType::kF32, {N, C});
    s.lse = cv.Take(DType::kF32, {N, c_.num_heads});
    s.x_mid = cv.Take(DType::kF32, {N, C});
    s.xn2 = cv.Take(DType::kF32, {N, C});
    s.mean2 = cv.Take(DType::kF32, {N});
    s.rstd2 = cv.Take(DType::kF32, {N});
    s.fc = cv.Take(DType::kF32, {N, I});
    s.act = cv.Take(DType::kF32, {N, I});
    Tensor* us[] = {&s.u_attn, &s.u_proj, &s.u_fc, &s.u_mlp_proj};
    for (size_t i = 0; i < 4; ++i) {
      if (const LoraPack* l = Lora(0, kModules[i])) {
        *us[i] = cv.Take(DType::kF32, {N, l->total_rank()});
      }
    }
  }

  BlocksContext ctx_;
  const ModelConfig& c_;
  Device& d_;
  AttentionShape attn_shape_;
  std::vector<Saved> saved_;
  std::vector<DeviceBuffer> saved_buffers_;
  Workspace ws_;
  DeviceBuffer workspace_buffer_;
};

}  // namespace

Result<std::unique_ptr<DecoderBlocks>> CreateGpt2Blocks(const BlocksContext& ctx) {
  auto blocks = std::make_unique<Gpt2Blocks>(ctx);
  FERRY_RETURN_IF_ERROR(blocks->Init());
  return std::unique_ptr<DecoderBlocks>(std::move(blocks));
}

}  // namespace ferry
