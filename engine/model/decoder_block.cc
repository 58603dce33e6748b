// The Llama-family decoder block (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM).
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/block_base.h"
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
  Tensor branch;      // (N, C) output of o_proj / down_proj before the residual add
  Tensor d_h;         // (N, I)
  Tensor d_gate_up;   // (N, 2I)
  Tensor d_xn;        // (N, C)
  Tensor d_att;       // (N, Hq*D)
  Tensor dq, dk, dv;  // (N, Hq*D), (N, Hkv*D) x2
  Tensor du;          // (N, Rmax) LoRA
  Tensor scratch;     // bytes: attention's and the GEMMs' (BlockScratchBytes)
  Tensor sink;        // f32 gradient sink for frozen norm weights
};

constexpr const char* kQ = "self_attn.q_proj";
constexpr const char* kK = "self_attn.k_proj";
constexpr const char* kV = "self_attn.v_proj";
constexpr const char* kO = "self_attn.o_proj";
constexpr const char* kGateUp = "mlp.gate_up_proj";  // gate_proj and up_proj, fused
constexpr const char* kDown = "mlp.down_proj";

// One saved slot: what a block's backward needs beyond its input.
void SavedLayout(const BlockBufferArgs& a, TensorCarver& cv, Saved& s) {
  const ModelConfig& c = *a.config;
  const int64_t N = a.tokens, C = c.hidden_size, I = c.intermediate_size;
  const int64_t H = c.num_heads, Hkv = c.num_kv_heads;
  const DType A = a.act;  // activations; statistics stay f32
  s.xn1 = cv.Take(A, {N, C});
  s.rstd1 = cv.Take(DType::kF32, {N});
  if (c.qk_norm) {
    s.q_pre = cv.Take(A, {N, c.q_dim()});
    s.k_pre = cv.Take(A, {N, c.kv_dim()});
    s.rstd_q = cv.Take(DType::kF32, {N * H});
    s.rstd_k = cv.Take(DType::kF32, {N * Hkv});
  }
  s.q = cv.Take(A, {N, c.q_dim()});
  s.k = cv.Take(A, {N, c.kv_dim()});
  s.v = cv.Take(A, {N, c.kv_dim()});
  s.att = cv.Take(A, {N, c.q_dim()});
  s.lse = cv.Take(DType::kF32, {N, H});
  s.x_mid = cv.Take(A, {N, C});
  s.xn2 = cv.Take(A, {N, C});
  s.rstd2 = cv.Take(DType::kF32, {N});
  s.gate_up = cv.Take(A, {N, 2 * I});
  s.h = cv.Take(A, {N, I});
  s.u_q = TakeLoraU(a, cv, kQ);
  s.u_k = TakeLoraU(a, cv, kK);
  s.u_v = TakeLoraU(a, cv, kV);
  s.u_o = TakeLoraU(a, cv, kO);
  s.u_gu = TakeLoraU(a, cv, kGateUp);
  s.u_down = TakeLoraU(a, cv, kDown);
}

// The family's part of the workspace.
void WorkspaceLayout(const BlockBufferArgs& a, TensorCarver& cv, Workspace& w) {
  const ModelConfig& c = *a.config;
  const int64_t N = a.tokens, C = c.hidden_size, I = c.intermediate_size;
  const DType A = a.act;
  w.branch = cv.Take(A, {N, C});
  w.d_h = cv.Take(A, {N, I});
  w.d_gate_up = cv.Take(A, {N, 2 * I});
  w.d_xn = cv.Take(A, {N, C});
  w.d_att = cv.Take(A, {N, c.q_dim()});
  w.dq = cv.Take(A, {N, c.q_dim()});
  w.dk = cv.Take(A, {N, c.kv_dim()});
  w.dv = cv.Take(A, {N, c.kv_dim()});
}

constexpr const char* kLoraModules[] = {kQ, kK, kV, kO, kGateUp, kDown};
constexpr BlockLayouts<Saved, Workspace> kLayouts{&SavedLayout, &WorkspaceLayout, kLoraModules};

class LlamaBlocks final : public BlockBase<Saved, Workspace> {
 public:
  explicit LlamaBlocks(const BlocksContext& ctx) : BlockBase(ctx, ctx.config->num_kv_heads) {}

  Status Init() { return AllocateBuffers(kLayouts); }

  Status Forward(int64_t block, int slot, Tensor x, Tensor y) override {
    Saved& s = saved_[size_t(slot)];
    const std::string p = Prefix(block);
    const float eps = float(c_.norm_eps);
    FERRY_RETURN_IF_ERROR(
        RmsNormForward(d_, {x, W(p + "input_layernorm.weight"), s.xn1, s.rstd1, eps}));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, Attn(block, kQ, s), s.xn1, s.u_q));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, Attn(block, kK, s), s.xn1, s.u_k));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, Attn(block, kV, s), s.xn1, s.u_v));
    if (c_.qk_norm) {
      FERRY_RETURN_IF_ERROR(RmsNormForward(
          d_, {Heads(s.q_pre), W(p + "self_attn.q_norm.weight"), Heads(s.q), s.rstd_q, eps}));
      FERRY_RETURN_IF_ERROR(RmsNormForward(
          d_, {Heads(s.k_pre), W(p + "self_attn.k_norm.weight"), Heads(s.k), s.rstd_k, eps}));
    }
    FERRY_RETURN_IF_ERROR(RopeForward(d_, Rope(s.q, c_.num_heads)));
    FERRY_RETURN_IF_ERROR(RopeForward(d_, Rope(s.k, c_.num_kv_heads)));
    FERRY_RETURN_IF_ERROR(Attend(block, s.q, s.k, s.v, s.att, s.lse));
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
    FERRY_RETURN_IF_ERROR(
        ProjectionBackward(d_, Down(block, s, dy), s.h, s.u_down, Du(block, kDown), w.d_h, false));
    FERRY_RETURN_IF_ERROR(SwiGluBackward(d_, {s.gate_up, w.d_h, w.d_gate_up}));
    FERRY_RETURN_IF_ERROR(
        ProjectionBackward(d_, GateUp(block, s), s.xn2, s.u_gu, Du(block, kGateUp), w.d_xn, false));
    FERRY_RETURN_IF_ERROR(
        RmsNormBackward(d_, {w.d_xn, s.x_mid, W(p + "post_attention_layernorm.weight"), s.rstd2, dx,
                             G(p + "post_attention_layernorm.weight")}));
    FERRY_RETURN_IF_ERROR(ResidualAccumulate(d_, {dy, dx}));  // dx = d loss / d x_mid
    // Attention: x_mid = x + o(attention(rope(q), rope(k), v)).
    Projection o = O(block, s);
    o.parts[0].dy = dx;
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, o, s.att, s.u_o, Du(block, kO), w.d_att, false));
    FERRY_RETURN_IF_ERROR(AttendBackward(s.q, s.k, s.v, s.att, s.lse, w.d_att, w.dq, w.dk, w.dv));
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
    FERRY_RETURN_IF_ERROR(
        ProjectionBackward(d_, Attn(block, kQ, s), s.xn1, s.u_q, Du(block, kQ), w.d_xn, false));
    FERRY_RETURN_IF_ERROR(
        ProjectionBackward(d_, Attn(block, kK, s), s.xn1, s.u_k, Du(block, kK), w.d_xn, true));
    FERRY_RETURN_IF_ERROR(
        ProjectionBackward(d_, Attn(block, kV, s), s.xn1, s.u_v, Du(block, kV), w.d_xn, true));
    FERRY_RETURN_IF_ERROR(RmsNormBackward(d_, {w.d_xn, x, W(p + "input_layernorm.weight"), s.rstd1,
                                               w.d_xn, G(p + "input_layernorm.weight")}));
    return ResidualAccumulate(d_, {w.d_xn, dx});
  }

 private:
  // (N, H*D) as (N*H, D): the q/k norms run per head.
  Tensor Heads(const Tensor& t) const { return t.Reshape({t.numel() / c_.head_dim, c_.head_dim}); }
  RopeArgs Rope(Tensor t, int64_t heads) const {
    RopeArgs r;
    r.in = t;
    r.out = t;
    r.positions = ctx_.positions;
    r.inv_freq = ctx_.inv_freq;  // plain or Llama 3-scaled (RopeInvFreq)
    r.num_heads = heads;
    r.head_dim = c_.head_dim;
    r.theta = float(c_.rope_theta);
    return r;
  }
  // q, k or v: written before the q/k norms when there are some (Qwen3).
  Projection Attn(int64_t block, const char* module, const Saved& s) const {
    if (module == kQ) return One(block, kQ, c_.qk_norm ? s.q_pre : s.q, ws_.dq);
    if (module == kK) return One(block, kK, c_.qk_norm ? s.k_pre : s.k, ws_.dk);
    return One(block, kV, s.v, ws_.dv);
  }
  Projection O(int64_t block, const Saved&) const { return One(block, kO, ws_.branch, Tensor{}); }
  Projection GateUp(int64_t block, const Saved& s) const {
    return One(block, kGateUp, s.gate_up, ws_.d_gate_up);
  }
  Projection Down(int64_t block, const Saved&, Tensor dy) const {
    return One(block, kDown, ws_.branch, dy);
  }
};

Result<std::unique_ptr<DecoderBlocks>> CreateLlamaBlocks(const BlocksContext& ctx) {
  auto blocks = std::make_unique<LlamaBlocks>(ctx);
  FERRY_RETURN_IF_ERROR(blocks->Init());
  return std::unique_ptr<DecoderBlocks>(std::move(blocks));
}

BlockParams LlamaBlockParams(const ModelConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  BlockParams b;
  b.linears = {
      {kQ, C, c.q_dim(), c.qkv_bias, kLoraQ, false},
      {kK, C, c.kv_dim(), c.qkv_bias, kLoraK, false},
      {kV, C, c.kv_dim(), c.qkv_bias, kLoraV, false},
      {kO, c.q_dim(), C, c.o_bias, kLoraO, false},
      {"mlp.gate_proj", C, I, c.mlp_bias, kLoraGate, false, kGateUp},
      {"mlp.up_proj", C, I, c.mlp_bias, kLoraUp, false, kGateUp},
      {kDown, I, C, c.mlp_bias, kLoraDown, false},
  };
  auto vector = [&](const char* name, int64_t n) { b.entries.push_back({name, n, 0}); };
  auto linear = [&](size_t i) { b.entries.push_back({"", 0, i}); };
  vector("input_layernorm.weight", C);
  for (size_t k = 0; k < 3; ++k) linear(k);  // q, k, v
  if (c.qk_norm) {
    vector("self_attn.q_norm.weight", c.head_dim);
    vector("self_attn.k_norm.weight", c.head_dim);
  }
  linear(3);  // o
  vector("post_attention_layernorm.weight", C);
  for (size_t k = 4; k < 7; ++k) linear(k);  // gate, up, down
  return b;
}

BlockBufferBytes LlamaBlockBufferBytes(const BlockBufferArgs& a) {
  return CountBlockBuffers(kLayouts, a);
}

}  // namespace

const FamilyDescription& LlamaFamily() {
  static const FamilyDescription kLlama{{.token_table = "model.embed_tokens.weight",
                                         .position_table = "",
                                         .final_norm_weight = "model.norm.weight",
                                         .final_norm_bias = "",
                                         .block_prefix = "model.layers.",
                                         .lm_head = "lm_head.weight",
                                         .bare_prefix = "",
                                         .ignored_buffers = {".rotary_emb.inv_freq"}},
                                        &CreateLlamaBlocks,
                                        &LlamaBlockParams,
                                        &LlamaBlockBufferBytes};
  return kLlama;
}

}  // namespace ferry
