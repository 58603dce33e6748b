// The GPT-2 decoder block. Positions are learned (added by the host embedding),
// so there is no RoPE; c_attn is one (3C, C) weight whose row thirds produce q,
// k and v.
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/block_base.h"
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
  Tensor branch;      // (N, C)
  Tensor d_act;       // (N, I)
  Tensor d_xn;        // (N, C)
  Tensor d_att;       // (N, C)
  Tensor dq, dk, dv;  // (N, C) each
  Tensor du;          // (N, Rmax)
  Tensor scratch;     // bytes: attention's and the GEMMs' (BlockScratchBytes)
  Tensor sink;        // f32 gradient sink for frozen LayerNorm weight (at 0) and bias (at C)
};

constexpr const char* kAttn = "attn.c_attn";
constexpr const char* kProj = "attn.c_proj";
constexpr const char* kFc = "mlp.c_fc";
constexpr const char* kMlpProj = "mlp.c_proj";

// One saved slot: what a block's backward needs beyond its input.
void SavedLayout(const BlockBufferArgs& a, TensorCarver& cv, Saved& s) {
  const ModelConfig& c = *a.config;
  const int64_t N = a.tokens, C = c.hidden_size, I = c.intermediate_size;
  const DType A = a.act;  // activations; statistics stay f32
  s.xn1 = cv.Take(A, {N, C});
  s.mean1 = cv.Take(DType::kF32, {N});
  s.rstd1 = cv.Take(DType::kF32, {N});
  s.q = cv.Take(A, {N, C});
  s.k = cv.Take(A, {N, C});
  s.v = cv.Take(A, {N, C});
  s.att = cv.Take(A, {N, C});
  s.lse = cv.Take(DType::kF32, {N, c.num_heads});
  s.x_mid = cv.Take(A, {N, C});
  s.xn2 = cv.Take(A, {N, C});
  s.mean2 = cv.Take(DType::kF32, {N});
  s.rstd2 = cv.Take(DType::kF32, {N});
  s.fc = cv.Take(A, {N, I});
  s.act = cv.Take(A, {N, I});
  s.u_attn = TakeLoraU(a, cv, kAttn);
  s.u_proj = TakeLoraU(a, cv, kProj);
  s.u_fc = TakeLoraU(a, cv, kFc);
  s.u_mlp_proj = TakeLoraU(a, cv, kMlpProj);
}

// The family's part of the workspace.
void WorkspaceLayout(const BlockBufferArgs& a, TensorCarver& cv, Workspace& w) {
  const ModelConfig& c = *a.config;
  const int64_t N = a.tokens, C = c.hidden_size, I = c.intermediate_size;
  const DType A = a.act;
  w.branch = cv.Take(A, {N, C});
  w.d_act = cv.Take(A, {N, I});
  w.d_xn = cv.Take(A, {N, C});
  w.d_att = cv.Take(A, {N, C});
  w.dq = cv.Take(A, {N, C});
  w.dk = cv.Take(A, {N, C});
  w.dv = cv.Take(A, {N, C});
}

constexpr const char* kLoraModules[] = {kAttn, kProj, kFc, kMlpProj};
constexpr BlockLayouts<Saved, Workspace> kLayouts{&SavedLayout, &WorkspaceLayout, kLoraModules};

class Gpt2Blocks final : public BlockBase<Saved, Workspace> {
 public:
  explicit Gpt2Blocks(const BlocksContext& ctx) : BlockBase(ctx, ctx.config->num_heads) {}

  Status Init() { return AllocateBuffers(kLayouts); }

  Status Forward(int64_t block, int slot, Tensor x, Tensor y) override {
    Saved& s = saved_[size_t(slot)];
    const std::string p = Prefix(block);
    const float eps = float(c_.norm_eps);
    FERRY_RETURN_IF_ERROR(LayerNormForward(
        d_, {x, W(p + "ln_1.weight"), W(p + "ln_1.bias"), s.xn1, s.mean1, s.rstd1, eps}));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, Qkv(block, s), s.xn1, s.u_attn));
    FERRY_RETURN_IF_ERROR(Attend(block, s.q, s.k, s.v, s.att, s.lse));
    FERRY_RETURN_IF_ERROR(
        ProjectionForward(d_, One(block, kProj, ws_.branch, {}), s.att, s.u_proj));
    FERRY_RETURN_IF_ERROR(ResidualAdd(d_, {x, ws_.branch, s.x_mid}));
    FERRY_RETURN_IF_ERROR(LayerNormForward(
        d_, {s.x_mid, W(p + "ln_2.weight"), W(p + "ln_2.bias"), s.xn2, s.mean2, s.rstd2, eps}));
    FERRY_RETURN_IF_ERROR(ProjectionForward(d_, One(block, kFc, s.fc, {}), s.xn2, s.u_fc));
    FERRY_RETURN_IF_ERROR(GeluForward(d_, {s.fc, s.act, GeluApprox::kTanh}));
    FERRY_RETURN_IF_ERROR(
        ProjectionForward(d_, One(block, kMlpProj, ws_.branch, {}), s.act, s.u_mlp_proj));
    return ResidualAdd(d_, {s.x_mid, ws_.branch, y});
  }

  Status Backward(int64_t block, int slot, Tensor x, Tensor dy, Tensor dx) override {
    Saved& s = saved_[size_t(slot)];
    const std::string p = Prefix(block);
    Workspace& w = ws_;
    // MLP: y = x_mid + c_proj(gelu(c_fc(ln_2(x_mid)))).
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, One(block, kMlpProj, {}, dy), s.act, s.u_mlp_proj,
                                             Du(block, kMlpProj), w.d_act, false));
    FERRY_RETURN_IF_ERROR(GeluBackward(d_, {s.fc, w.d_act, w.d_act, GeluApprox::kTanh}));
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, One(block, kFc, {}, w.d_act), s.xn2, s.u_fc,
                                             Du(block, kFc), w.d_xn, false));
    FERRY_RETURN_IF_ERROR(
        LayerNormBackward(d_, {w.d_xn, s.x_mid, W(p + "ln_2.weight"), s.mean2, s.rstd2, dx,
                               G(p + "ln_2.weight", 0), G(p + "ln_2.bias", c_.hidden_size)}));
    FERRY_RETURN_IF_ERROR(ResidualAccumulate(d_, {dy, dx}));  // dx = d loss / d x_mid
    // Attention: x_mid = x + c_proj(attention(c_attn(ln_1(x)))).
    FERRY_RETURN_IF_ERROR(ProjectionBackward(d_, One(block, kProj, {}, dx), s.att, s.u_proj,
                                             Du(block, kProj), w.d_att, false));
    FERRY_RETURN_IF_ERROR(AttendBackward(s.q, s.k, s.v, s.att, s.lse, w.d_att, w.dq, w.dk, w.dv));
    FERRY_RETURN_IF_ERROR(
        ProjectionBackward(d_, Qkv(block, s), s.xn1, s.u_attn, Du(block, kAttn), w.d_xn, false));
    FERRY_RETURN_IF_ERROR(
        LayerNormBackward(d_, {w.d_xn, x, W(p + "ln_1.weight"), s.mean1, s.rstd1, w.d_xn,
                               G(p + "ln_1.weight", 0), G(p + "ln_1.bias", c_.hidden_size)}));
    return ResidualAccumulate(d_, {w.d_xn, dx});
  }

 private:
  // c_attn as three parts over its row thirds, writing q, k and v.
  Projection Qkv(int64_t block, const Saved& s) const {
    const std::string m = Prefix(block) + kAttn;
    const ProjectionPart whole = PartOf(*ctx_.params, m, {}, {});
    const Tensor ys[] = {s.q, s.k, s.v};
    const Tensor dys[] = {ws_.dq, ws_.dk, ws_.dv};
    const int64_t C = c_.hidden_size;
    Projection p{{}, ctx_.params->lora(m), ws_.scratch, {}};  // GPT-2 is never NF4
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
};

Result<std::unique_ptr<DecoderBlocks>> CreateGpt2Blocks(const BlocksContext& ctx) {
  auto blocks = std::make_unique<Gpt2Blocks>(ctx);
  FERRY_RETURN_IF_ERROR(blocks->Init());
  return std::unique_ptr<DecoderBlocks>(std::move(blocks));
}

BlockParams Gpt2BlockParams(const ModelConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  BlockParams b;
  b.linears = {
      {kAttn, C, 3 * C, true, kLoraQ | kLoraK | kLoraV, true},
      {kProj, C, C, true, kLoraO, true},
      {kFc, C, I, true, kLoraUp, true},
      {kMlpProj, I, C, true, kLoraDown, true},
  };
  auto vector = [&](const char* name, int64_t n) { b.entries.push_back({name, n, 0}); };
  auto linear = [&](size_t i) { b.entries.push_back({"", 0, i}); };
  vector("ln_1.weight", C);
  vector("ln_1.bias", C);
  linear(0);
  linear(1);
  vector("ln_2.weight", C);
  vector("ln_2.bias", C);
  linear(2);
  linear(3);
  return b;
}

BlockBufferBytes Gpt2BlockBufferBytes(const BlockBufferArgs& a) {
  return CountBlockBuffers(kLayouts, a);
}

}  // namespace

const FamilyDescription& Gpt2Family() {
  static const FamilyDescription kGpt2{{.token_table = "transformer.wte.weight",
                                        .position_table = "transformer.wpe.weight",
                                        .final_norm_weight = "transformer.ln_f.weight",
                                        .final_norm_bias = "transformer.ln_f.bias",
                                        .block_prefix = "transformer.h.",
                                        .lm_head = "lm_head.weight",
                                        .bare_prefix = "transformer.",
                                        .ignored_buffers = {".attn.bias", ".attn.masked_bias"}},
                                       &CreateGpt2Blocks,
                                       &Gpt2BlockParams,
                                       &Gpt2BlockBufferBytes,
                                       "GPT-2's Conv1D weights are not quantized yet"};
  return kGpt2;
}

}  // namespace ferry
