// BlockBase: what the decoder block families (decoder_block.cc, gpt2_block.cc) share — their
// saved-activation slots and workspace, allocated from the family's layouts; lookups of a block's
// parameters, gradients and LoRA groups by module name; and attention over saved q, k, v.
//
// `Workspace` must have the members du (LoRA, (N, Rmax)), scratch and sink (the gradient
// sink for frozen weights, 2 * max(C, head_dim) f32): LayoutWorkspace and BlockBase lay those out
// themselves. Activations
// and their gradients are in the weights' dtype (Act()); statistics and parameter gradients f32.
//
// Ownership and thread-safety as DecoderBlocks.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "engine/model/decoder_blocks.h"
#include "engine/model/model_stack.h"
#include "engine/model/projection.h"
#include "engine/model/tensor_carver.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/decode_attention.h"

namespace ferry {

// A family's layouts of one saved slot and of its own part of the workspace, and the modules
// whose LoRA groups the blocks look up (for du's width). Plain functions of BlockBufferArgs, so
// the blocks carve by them and BlockBuffersOf (model_stack.h) counts them: one layout, no mirror.
template <typename Saved, typename Workspace>
struct BlockLayouts {
  void (*saved)(const BlockBufferArgs&, TensorCarver&, Saved&) = nullptr;
  void (*workspace)(const BlockBufferArgs&, TensorCarver&, Workspace&) = nullptr;
  std::span<const char* const> lora_modules = {};
};

// u = x A^T (N, R) for the module's LoRA group, or an empty tensor when it has none.
inline Tensor TakeLoraU(const BlockBufferArgs& a, TensorCarver& cv, const char* module) {
  const int64_t r = a.lora_rank ? a.lora_rank(module) : 0;
  return r == 0 ? Tensor{} : cv.Take(a.act, {a.tokens, r});
}

// The whole workspace: the family's part, then LoRA's du (N, the widest group's rank, at least 1)
// and the sink.
template <typename Saved, typename Workspace>
void CarveWorkspace(const BlockLayouts<Saved, Workspace>& l, const BlockBufferArgs& a,
                    TensorCarver& cv, Workspace& w) {
  l.workspace(a, cv, w);
  int64_t rmax = 1;
  for (const char* m : l.lora_modules) {
    if (a.lora_rank) rmax = std::max(rmax, a.lora_rank(m));
  }
  const ModelConfig& c = *a.config;
  w.du = cv.Take(a.act, {a.tokens, rmax});
  w.sink = cv.Take(DType::kF32, {2 * std::max(c.hidden_size, c.head_dim)});
}

// The bytes the family's blocks allocate for one saved slot and the workspace.
template <typename Saved, typename Workspace>
BlockBufferBytes CountBlockBuffers(const BlockLayouts<Saved, Workspace>& l,
                                   const BlockBufferArgs& a) {
  Saved s;
  Workspace w;
  TensorCarver saved, workspace;
  l.saved(a, saved, s);
  CarveWorkspace(l, a, workspace, w);
  return {saved.bytes(), saved.unaligned_bytes(), workspace.bytes()};
}

template <typename Saved, typename Workspace>
class BlockBase : public DecoderBlocks {
 public:
  void SetRowLayout(Tensor positions, Tensor doc_ids) final {
    ctx_.positions = positions;
    ctx_.doc_ids = doc_ids;
  }

 protected:
  BlockBase(const BlocksContext& ctx, int64_t kv_heads)
      : ctx_(ctx), c_(*ctx.config), d_(*ctx.device), prefix_(NamesOf(c_).block_prefix) {
    attn_shape_ = {ctx.shape.batch, ctx.shape.seq_len, c_.num_heads,
                   kv_heads,        c_.head_dim,       ctx.shape.max_documents};
  }

  // What the layouts read for these blocks: the micro-batch, the weights' dtype and the first
  // block's LoRA groups.
  BlockBufferArgs LayoutArgs() const {
    return {.config = &c_,
            .tokens = ctx_.shape.tokens(),
            .act = Act(),
            .lora_rank = [this](std::string_view module) -> int64_t {
              const LoraPack* l = Lora(ctx_.first_block, std::string(module));
              return l == nullptr ? 0 : l->total_rank();
            }};
  }

  // Allocates every slot and the workspace by the family's layouts.
  Status AllocateBuffers(const BlockLayouts<Saved, Workspace>& layouts) {
    const BlockBufferArgs args = LayoutArgs();
    saved_.resize(size_t(ctx_.num_slots));
    for (int s = 0; s < ctx_.num_slots; ++s) {
      auto layout = [&](TensorCarver& cv) { layouts.saved(args, cv, saved_[size_t(s)]); };
      FERRY_ASSIGN_OR_RETURN(
          DeviceBuffer b,
          AllocateCarved(d_, ctx_.source, "blocks.saved." + std::to_string(s), layout));
      saved_buffers_.push_back(std::move(b));
    }
    // Attention's and the GEMMs' scratch, one buffer (the ops run one at a time): the figure the
    // memory model plans (BlockScratchBytes over this block's spec).
    const auto spec = std::find_if(
        ctx_.params->layers().begin(), ctx_.params->layers().end(), [&](const LayerSpec& l) {
          return l.kind == LayerKind::kBlock && l.block == ctx_.first_block;
        });
    if (spec == ctx_.params->layers().end()) {
      return Status::Internal("the device params hold no block " +
                              std::to_string(ctx_.first_block));
    }
    const size_t scratch_bytes =
        std::max<size_t>(BlockScratchBytes(c_, *spec, ctx_.shape, Act(), OpTargetOf(d_)), 4);
    auto layout = [&](TensorCarver& cv) { CarveWorkspace(layouts, args, cv, ws_); };
    FERRY_ASSIGN_OR_RETURN(workspace_buffer_,
                           AllocateCarved(d_, ctx_.source, "blocks.workspace", layout));
    // An NF4 weight dequantized for a product, then the ops' own scratch.
    const size_t dequant_bytes = BlockDequantBytes(*spec, Act());
    auto scratch = [&](TensorCarver& cv) {
      if (dequant_bytes > 0) dequant_ = cv.Take(DType::kU8, {int64_t(dequant_bytes)});
      ws_.scratch = cv.Take(DType::kF32, {int64_t((scratch_bytes - dequant_bytes + 3) / 4)});
    };
    FERRY_ASSIGN_OR_RETURN(scratch_buffer_,
                           AllocateCarved(d_, ctx_.source, "blocks.scratch", scratch));
    return Status::Ok();
  }

  // The activations' dtype: the weights' (DeviceParams::dtype). Norm statistics, log-sum-exps
  // and gradients of parameters stay f32.
  DType Act() const { return ctx_.params->dtype(); }

  std::string Prefix(int64_t block) const { return prefix_ + std::to_string(block) + "."; }
  const LoraPack* Lora(int64_t block, const std::string& module) const {
    return ctx_.params->lora(Prefix(block) + module);
  }
  Tensor W(const std::string& name) const { return ctx_.params->at(name).w; }
  // The gradient of a weight, or a view of the sink from `sink_offset` when it is frozen.
  Tensor G(const std::string& name, int64_t sink_offset = 0) const {
    const DeviceParam& p = ctx_.params->at(name);
    return p.grad.data.is_null() ? SinkView(ws_.sink, p.w.numel(), sink_offset) : p.grad;
  }
  // LoRA's du workspace shaped (N, R) for this module's group.
  Tensor Du(int64_t block, const std::string& module) const {
    const LoraPack* l = Lora(block, module);
    Tensor t = ws_.du;
    if (l != nullptr) t.shape = Shape{ctx_.shape.tokens(), l->total_rank()};
    return t;
  }
  // The single-part projection of `module` (weight, bias, LoRA group).
  Projection One(int64_t block, const std::string& module, Tensor y, Tensor dy) const {
    const std::string m = Prefix(block) + module;
    return {{PartOf(*ctx_.params, m, y, dy)}, ctx_.params->lora(m), ws_.scratch, dequant_};
  }
  // Attention over the saved q, k, v into o and lse (window: c_.sliding_window, documents:
  // ctx_.doc_ids); with a KV cache
  // in the context, over the cached keys and values of `block` followed by k and v.
  Status Attend(int64_t block, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse) {
    if (KvCache* kv = ctx_.kv_cache; kv != nullptr) {
      return DecodeAttention(d_, {.shape = {.new_tokens = ctx_.shape.tokens(),
                                            .past = kv->length,
                                            .capacity = kv->capacity,
                                            .q_heads = attn_shape_.q_heads,
                                            .kv_heads = attn_shape_.kv_heads,
                                            .head_dim = attn_shape_.head_dim},
                                  .q = q,
                                  .k_new = k,
                                  .v_new = v,
                                  .k_cache = kv->k[size_t(block)],
                                  .v_cache = kv->v[size_t(block)],
                                  .o = o,
                                  .lse = lse,
                                  .scale = Scale(),
                                  .window = c_.sliding_window});
    }
    return AttentionForward(d_, {.shape = attn_shape_,
                                 .q = q,
                                 .k = k,
                                 .v = v,
                                 .doc_ids = ctx_.doc_ids,  // packed documents (all one id: none)
                                 .o = o,
                                 .lse = lse,
                                 .scratch = ws_.scratch,
                                 .scale = Scale(),
                                 .window = c_.sliding_window});
  }
  // dq, dk, dv (=) from d_o, over the forward's q, k, v, o and lse.
  Status AttendBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor d_o, Tensor dq,
                        Tensor dk, Tensor dv) {
    return AttentionBackward(d_, {.shape = attn_shape_,
                                  .q = q,
                                  .k = k,
                                  .v = v,
                                  .doc_ids = ctx_.doc_ids,  // packed documents (all one id: none)
                                  .o = o,
                                  .lse = lse,
                                  .d_o = d_o,
                                  .dq = dq,
                                  .dk = dk,
                                  .dv = dv,
                                  .scratch = ws_.scratch,
                                  .scale = Scale(),
                                  .window = c_.sliding_window});
  }

  BlocksContext ctx_;
  const ModelConfig& c_;
  Device& d_;
  std::vector<Saved> saved_;
  Workspace ws_;

 private:
  float Scale() const { return float(1.0 / std::sqrt(double(c_.head_dim))); }

  std::string prefix_;
  AttentionShape attn_shape_;
  std::vector<DeviceBuffer> saved_buffers_;
  DeviceBuffer workspace_buffer_, scratch_buffer_;
  Tensor dequant_;  // the front of the scratch buffer: BlockDequantBytes (empty without NF4)
};

}  // namespace ferry
