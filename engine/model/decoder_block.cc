// The Llama-family decoder block (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM).
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/decoder_blocks.h"
#include "engine/model/projection.h"
#include "engine/model/tensor_carver.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/residual.h"
#include "kernels/ops/rmsnorm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"

namespace ferry {
namespace {

// What one block keeps for its backward (beyond its input x).
struct Saved {
  Tensor xn1;    // (N, C) input_layernorm(x)
  Tensor rstd1;  // (N) f32
  Tensor q_pre,
      k_pre;       // (N, Hq*D), (N, Hkv*D): projections before the q/k norms (Qwen3)
  Tensor rstd_q;   // (N*Hq) f32 (Qwen3)
  Tensor rstd_k;   // (N*Hkv) f32 (Qwen3)
  Tensor q, k, v;  // (N, Hq*D), (N, Hkv*D) x2: after RoPE (q, k)
  Tensor att;      // (N, Hq*D) attention output
  Tensor lse;      // (N, Hq) f32
  Tensor x_mid;    // (N, C) residual stream after attention
  Tensor xn2;      // (N, C) post_attention_layernorm(x_mid)
  Tensor rstd2;    // (N) f32
  Tensor gate_up;  // (N, 2I)
  Tensor h;        // (N, I) SwiGLU output
  Tensor u_q, u_k, u_v, u_o, u_gu, u_down;  // LoRA x A^T (N, R), when adapted
};

// Temporaries of forward and backward, shared by all blocks.
struct Workspace {
  Tensor branch;        // (N, C) output of o_proj / down_proj before the residual add
  Tensor d_h;           // (N, I)
  Tensor d_gate_up;     // (N, 2I)
  Tensor d_xn;          // (N, C)
  Tensor d_att;         // (N, Hq*D)
  Tensor dq, dk, dv;    // (N, Hq*D), (N, Hkv*D) x2
  Tensor du;            // (N, Rmax) LoRA
  Tensor attn_scratch;  // bytes
  Tensor sink;          // (max(C, D)) f32 gradient sink for frozen norm weights
};

class LlamaBlocks final : public DecoderBlocks {
 public:
  explicit LlamaBlocks(const BlocksContext& ctx) : ctx_(ctx), c_(*ctx.config), d_(*ctx.device) {}

  Status Init() {
    const int64_t N = ctx_.shape.tokens();
    attn_shape_ = {ctx_.shape.batch, ctx_.shape.seq_len, c_.num_heads, c_.num_kv_heads,
                   c_.head_dim};
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
    const size_t attn_bytes = std::max<size_t>(AttentionScratchBytes(d_, attn_shape_), 1);
    FERRY_ASSIGN_OR_RETURN(workspace_buffer_,
                           AllocateCarved(d_, "blocks.workspace", [&](TensorCarver& cv) {
                             const int64_t C = c_.hidden_size, I = c_.intermediate_size;
                             Workspace& w = ws_;
                             w.branch = cv.Take(DType::kF32, {N, C});
                             w.d_h = cv.Take(DType::kF32, {N, I});
                             w.d_gate_up = cv.Take(DType::kF32, {N, 2 * I});
                             w.d_xn = cv.Take(DType::kF32, {N, C});
                             w.d_att = cv.Take(DType::kF32, {N, c_.q_dim()});
                             w.dq = cv.Take(DType::kF32, {N, c_.q_dim()});
                             w.dk = cv.Take(DType::kF32, {N, c_.kv_dim()});
                             w.dv = cv.Take(DType::kF32, {N, c_.kv_dim()});
                             w.du = cv.Take(DType::kF32, {N, rmax});
                             w.attn_scratch = cv.Take(DType::kF32, {int64_t((attn_bytes + 3) / 4)});
                             w.sink = cv.Take(DType::kF32, {std::max(C, c_.head_dim)});
                           }));
    return Status::Ok();
  }

  Status Forward(int64_t block, int slot, Tensor x, Tensor y) override {
    Saved& s = saved_[size_t(slot)];
    const std::string p = Prefix(block);
    const float eps = float(c_.norm_eps);
    FERRY_RETURN_IF_ERROR(
        RmsNormForward(d_, {x, W(p + "input_layernorm.weight"), s.xn1, s.rstd1, eps}));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, Attn(block, "q_proj", s), s.xn1, s.u_q));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, Attn(block, "k_proj", s), s.xn1, s.u_k));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, Attn(block, "v_proj", s), s.xn1, s.u_v));
    if (c_.qk_norm) {
      FERRY_RETURN_IF_ERROR(RmsNormForward(
          d_, {Heads(s.q_pre), W(p + "self_attn.q_norm.weight"), Heads(s.q), s.rstd_q, eps}));
      FERRY_RETURN_IF_ERROR(RmsNormForward(
          d_, {Heads(s.k_pre), W(p + "self_attn.k_norm.weight"), Heads(s.k), s.rstd_k, eps}));
    }
    FERRY_RETURN_IF_ERROR(RopeForward(d_, Rope(s.q, c_.num_heads)));
    FERRY_RETURN_IF_ERROR(RopeForward(d_, Rope(s.k, c_.num_kv_heads)));
    AttentionForwardArgs a;
    a.shape = attn_shape_;
    a.q = s.q;
    a.k = s.k;
    a.v = s.v;
    a.o = s.att;
    a.lse = s.lse;
    a.scratch = ws_.attn_scratch;
    a.scale = Scale();
    a.window = c_.sliding_window;
    FERRY_RETURN_IF_ERROR(AttentionForward(d_, a));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, O(block, s), s.att, s.u_o));
    FERRY_RETURN_IF_ERROR(ResidualAdd(d_, {x, ws_.branch, s.x_mid}));
    FERRY_RETURN_IF_ERROR(RmsNormForward(
        d_, {s.x_mid, W(p + "post_attention_layernorm.weight"), s.xn2, s.rstd2, eps}));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, GateUp(block, s), s.xn2, s.u_gu));
    FERRY_RETURN_IF_ERROR(SwiGluForward(d_, {s.gate_up, s.h}));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, Down(block, s, Tensor{}), s.h, s.u_down));
    return ResidualAdd(d_, {s.x_mid, ws_.branch, y});
  }

  Status Backward(int64_t block, int slot, Tensor x, Tensor dy, Tensor dx) override {
    Saved& s = saved_[size_t(slot)];
    const std::string p = Prefix(block);
    Workspace& w = ws_;
    // MLP: y = x_mid + down(swiglu(gate_up(norm2(x_mid)))).
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, Down(block, s, dy), s.h, s.u_down,
                                             Du(block, "mlp.down_proj"), w.d_h, false));
    FERRY_RETURN_IF_ERROR(SwiGluBackward(d_, {s.gate_up, w.d_h, w.d_gate_up}));
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, GateUp(block, s), s.xn2, s.u_gu,
                                             Du(block, "mlp.gate_up_proj"), w.d_xn, false));
    FERRY_RETURN_IF_ERROR(
        RmsNormBackward(d_, {w.d_xn, s.x_mid, W(p + "post_attention_layernorm.weight"), s.rstd2, dx,
                             G(p + "post_attention_layernorm.weight")}));
    FERRY_RETURN_IF_ERROR(ResidualAccumulate(d_, {dy, dx}));  // dx = d loss / d x_mid
    // Attention: x_mid = x + o(attention(rope(q), rope(k), v)).
    Projection o = O(block, s);
    o.parts[0].dy = dx;
    FERRY_RETURN_IF_ERROR(
        ProjectionBackward(d_, o, s.att, s.u_o, Du(block, "self_attn.o_proj"), w.d_att, false));
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
    a.window = c_.sliding_window;
    FERRY_RETURN_IF_ERROR(AttentionBackward(d_, a));
    FERRY_RETURN_IF_ERROR(RopeBackward(d_, Rope(w.dq, c_.num_heads)));
    FERRY_RETURN_IF_ERROR(RopeBackward(d_, Rope(w.dk, c_.num_kv_heads)));
    if (c_.qk_norm) {
      FERRY_RETURN_IF_ERROR(
          RmsNormBackward(d_, {Heads(w.dq), Heads(s.q_pre), W(p + "self_attn.q_norm.weight"),
                               s.rstd_q, Heads(w.dq), G(p + "self_attn.q_norm.weight")}));
      FERRY_RETURN_IF_ERROR(
          RmsNormBackward(d_, {Heads(w.dk), Heads(s.k_pre), W(p + "self_attn.k_norm.weight"),
                               s.rstd_k, Heads(w.dk), G(p + "self_attn.k_norm.weight")}));
    }
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, Attn(block, "q_proj", s), s.xn1, s.u_q,
                                             Du(block, "self_attn.q_proj"), w.d_xn, false));
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, Attn(block, "k_proj", s), s.xn1, s.u_k,
                                             Du(block, "self_attn.k_proj"), w.d_xn, true));
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, Attn(block, "v_proj", s), s.xn1, s.u_v,
                                             Du(block, "self_attn.v_proj"), w.d_xn, true));
    FERRY_RETURN_IF_ERROR(RmsNormBackward(d_, {w.d_xn, x, W(p + "input_layernorm.weight"), s.rstd1,
                                               w.d_xn, G(p + "input_layernorm.weight")}));
    return ResidualAccumulate(d_, {w.d_xn, dx});
  }

 private:
  static constexpr const char* kModules[] = {"self_attn.q_proj", "self_attn.k_proj",
                                             "self_attn.v_proj", "self_attn.o_proj",
                                             "mlp.gate_up_proj", "mlp.down_proj"};

  std::string Prefix(int64_t block) const { return "model.layers." + std::to_string(block) + "."; }
  const LoraPack* Lora(int64_t block, const std::string& module) const {
    return ctx_.params->lora(Prefix(block) + module);
  }
  Tensor W(const std::string& name) const { return ctx_.params->at(name).w; }
  // The gradient of a weight, or the sink when it is frozen.
  Tensor G(const std::string& name) const {
    const DeviceParam& p = ctx_.params->at(name);
    return p.grad.data.is_null() ? SinkView(ws_.sink, p.w.numel()) : p.grad;
  }
  float Scale() const { return float(1.0 / std::sqrt(double(c_.head_dim))); }
  // (N, H*D) as (N*H, D): the q/k norms run per head.
  Tensor Heads(const Tensor& t) const { return t.Reshape({t.numel() / c_.head_dim, c_.head_dim}); }
  RopeArgs Rope(Tensor t, int64_t heads) const {
    RopeArgs r;
    r.in = t;
    r.out = t;
    r.positions = ctx_.positions;
    r.num_heads = heads;
    r.head_dim = c_.head_dim;
    r.theta = float(c_.rope_theta);
    return r;
  }
  // LoRA's du workspace shaped (N, R) for this module's group.
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
  Projection Attn(int64_t block, const char* proj, const Saved& s) const {
    const std::string m = std::string("self_attn.") + proj;
    if (proj[0] == 'q') return One(block, m, c_.qk_norm ? s.q_pre : s.q, ws_.dq);
    if (proj[0] == 'k') return One(block, m, c_.qk_norm ? s.k_pre : s.k, ws_.dk);
    return One(block, m, s.v, ws_.dv);
  }
  Projection O(int64_t block, const Saved&) const {
    return One(block, "self_attn.o_proj", ws_.branch, Tensor{});
  }
  Projection GateUp(int64_t block, const Saved& s) const {
    return One(block, "mlp.gate_up_proj", s.gate_up, ws_.d_gate_up);
  }
  Projection Down(int64_t block, const Saved&, Tensor dy) const {
    return One(block, "mlp.down_proj", ws_.branch, dy);
  }

  void LayoutSaved(TensorCarver& cv, Saved& s) const {
    const int64_t N = ctx_.shape.tokens(), C = c_.hidden_size, I = c_.intermediate_size;
    const int64_t H = c_.num_heads, Hkv = c_.num_kv_heads;
    s.xn1 = cv.Take(DType::kF32, {N, C});
    s.rstd1 = cv.Take(DType::kF32, {N});
    if (c_.qk_norm) {
      s.q_pre = cv.Take(DType::kF32, {N, c_.q_dim()});
      s.k_pre = cv.Take(DType::kF32, {N, c_.kv_dim()});
      s.rstd_q = cv.Take(DType::kF32, {N * H});
      s.rstd_k = cv.Take(DType::kF32, {N * Hkv});
    }
    s.q = cv.Take(DType::kF32, {N, c_.q_dim()});
    s.k = cv.Take(DType::kF32, {N, c_.kv_dim()});
    s.v = cv.Take(DType::kF32, {N, c_.kv_dim()});
    s.att = cv.Take(DType::kF32, {N, c_.q_dim()});
    s.lse = cv.Take(DType::kF32, {N, H});
    s.x_mid = cv.Take(DType::kF32, {N, C});
    s.xn2 = cv.Take(DType::kF32, {N, C});
    s.rstd2 = cv.Take(DType::kF32, {N});
    s.gate_up = cv.Take(DType::kF32, {N, 2 * I});
    s.h = cv.Take(DType::kF32, {N, I});
    Tensor* us[] = {&s.u_q, &s.u_k, &s.u_v, &s.u_o, &s.u_gu, &s.u_down};
    for (size_t i = 0; i < 6; ++i) {
      if (const LoraPack* l = Lora(0, kModules[i]))
        *us[i] = cv.Take(DType::kF32, {N, l->total_rank()});
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

Result<std::unique_ptr<DecoderBlocks>> CreateLlamaBlocks(const BlocksContext& ctx) {
  auto blocks = std::make_unique<LlamaBlocks>(ctx);
  FERRY_RETURN_IF_ERROR(blocks->Init());
  return std::unique_ptr<DecoderBlocks>(std::move(blocks));
}

}  // namespace ferry
