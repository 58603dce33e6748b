// The family table and the stack builder (engine/model/model_stack.h has the contract).
#include "engine/model/model_stack.h"

#include <cassert>

namespace ferry {
namespace {

// One entry per family: its names, its blocks, and why its projections cannot be held in NF4
// (nullptr: they can).
struct Family {
  FamilyNames names;
  Result<std::unique_ptr<DecoderBlocks>> (*create_blocks)(const BlocksContext&);
  const char* no_nf4 = nullptr;
};

const Family& FamilyOf(ModelFamily f) {
  static const Family kLlama{{.token_table = "model.embed_tokens.weight",
                              .position_table = "",
                              .final_norm_weight = "model.norm.weight",
                              .final_norm_bias = "",
                              .block_prefix = "model.layers.",
                              .lm_head = "lm_head.weight"},
                             &CreateLlamaBlocks};
  static const Family kGpt2{{.token_table = "transformer.wte.weight",
                             .position_table = "transformer.wpe.weight",
                             .final_norm_weight = "transformer.ln_f.weight",
                             .final_norm_bias = "transformer.ln_f.bias",
                             .block_prefix = "transformer.h.",
                             .lm_head = "lm_head.weight"},
                            &CreateGpt2Blocks,
                            "GPT-2's Conv1D weights are not quantized yet"};
  switch (f) {
    case ModelFamily::kGpt2:
      return kGpt2;
    case ModelFamily::kLlama:
      break;
  }
  return kLlama;
}

// The table `name` of `rows` x C in `tensors`, or InvalidArgument naming what is missing.
template <typename Map>
auto FindTable(Map& tensors, const std::string& name, int64_t rows, int64_t cols, const char* what)
    -> Result<decltype(std::span(tensors.begin()->second))> {
  auto it = tensors.find(name);
  if (it == tensors.end() || int64_t(it->second.size()) != rows * cols) {
    return Status::InvalidArgument("the " + std::string(what) + " lack '" + name + "' of " +
                                   std::to_string(rows) + " x " + std::to_string(cols) + " values");
  }
  return std::span(it->second);
}

}  // namespace

const FamilyNames& NamesOf(ModelFamily family) { return FamilyOf(family).names; }

Status CheckBaseQuant(const ModelConfig& c, BaseQuant quantize) {
  const char* no_nf4 = FamilyOf(c.family).no_nf4;
  if (quantize == BaseQuant::kNone || no_nf4 == nullptr) return Status::Ok();
  return Status::InvalidArgument(
      "ferry holds NF4 projections for Llama-family models (Llama, Mistral, Qwen2, Qwen3) only; " +
      std::string(no_nf4));
}

std::string BlockPrefix(const ModelConfig& c, int64_t block) {
  return NamesOf(c).block_prefix + std::to_string(block) + ".";
}

EmbeddingShape EmbeddingShapeOf(const ModelConfig& c) {
  return {c.vocab_size, c.learned_positions ? c.max_position_embeddings : 0, c.hidden_size};
}

Result<HostEmbedding> FindHostEmbedding(const ModelConfig& c, const HostTensors& weights) {
  const FamilyNames& n = NamesOf(c);
  HostEmbedding e{.shape = EmbeddingShapeOf(c)};
  FERRY_ASSIGN_OR_RETURN(
      e.wte, FindTable(weights.tensors, n.token_table, c.vocab_size, c.hidden_size, "weights"));
  if (c.learned_positions) {
    FERRY_ASSIGN_OR_RETURN(e.wpe, FindTable(weights.tensors, n.position_table,
                                            c.max_position_embeddings, c.hidden_size, "weights"));
  }
  return e;
}

Status HostEmbedding::ForwardAs(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                DType dtype, std::span<std::byte> out, std::span<float> f32) const {
  assert(out.size() == f32.size() * DTypeSize(dtype) || dtype == DType::kF32);
  if (dtype == DType::kF32) {
    return Forward(tokens, positions,
                   {reinterpret_cast<float*>(out.data()), out.size() / sizeof(float)});
  }
  FERRY_RETURN_IF_ERROR(Forward(tokens, positions, f32));
  ConvertFromFloat(f32.data(), dtype, out.data(), f32.size());
  return Status::Ok();
}

void HostEmbeddingGrads::BackwardFrom(DType dtype, std::span<const std::byte> dout,
                                      std::span<float> f32, std::span<const int32_t> tokens,
                                      std::span<const int32_t> positions) const {
  assert(dout.size() == f32.size() * DTypeSize(dtype) || dtype == DType::kF32);
  if (dtype == DType::kF32) {
    Backward({reinterpret_cast<const float*>(dout.data()), dout.size() / sizeof(float)}, tokens,
             positions);
    return;
  }
  ConvertToFloat(dtype, dout.data(), f32.data(), f32.size());
  Backward(f32, tokens, positions);
}

Result<HostEmbeddingGrads> FindHostEmbeddingGrads(const ModelConfig& c, HostTensors& grads) {
  const FamilyNames& n = NamesOf(c);
  HostEmbeddingGrads g{.shape = EmbeddingShapeOf(c)};
  FERRY_ASSIGN_OR_RETURN(
      g.dwte, FindTable(grads.tensors, n.token_table, c.vocab_size, c.hidden_size, "gradients"));
  if (c.learned_positions) {
    FERRY_ASSIGN_OR_RETURN(
        g.dwpe, FindTable(grads.tensors, n.position_table, c.max_position_embeddings, c.hidden_size,
                          "gradients"));
  }
  return g;
}

Result<std::unique_ptr<DecoderBlocks>> CreateDecoderBlocks(const BlocksContext& ctx) {
  return FamilyOf(ctx.config->family).create_blocks(ctx);
}

Result<DeviceStack> BuildDeviceStack(Device& d, const ModelConfig& c, const DeviceParams& params,
                                     const StackOptions& o) {
  DeviceStack s;
  if (o.blocks) {
    BlocksContext ctx = MakeBlocksContext(d, c, params, o.shape, o.inputs);
    ctx.num_slots = o.num_slots;
    ctx.kv_cache = o.kv_cache;
    ctx.source = o.source;
    ctx.first_block = o.first_block;
    FERRY_ASSIGN_OR_RETURN(s.blocks, CreateDecoderBlocks(ctx));
  }
  if (o.head) {
    FERRY_ASSIGN_OR_RETURN(
        s.head, Head::Create(d, c, params, o.shape, o.loss_chunk_tokens, *o.head, o.source));
  }
  return s;
}

}  // namespace ferry
