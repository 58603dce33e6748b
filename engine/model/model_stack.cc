// The family table and the stack builder (engine/model/model_stack.h has the contract).
#include "engine/model/model_stack.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <set>

namespace ferry {
namespace {

// The family's description, from its block file (decoder_blocks.h).
const FamilyDescription& FamilyOf(ModelFamily f) {
  switch (f) {
    case ModelFamily::kGpt2:
      return Gpt2Family();
    case ModelFamily::kLlama:
      break;
  }
  return LlamaFamily();
}

// Whether dotted path `path` ends with the whole components of `suffix` (or equals it).
bool PathEndsWith(std::string_view path, std::string_view suffix) {
  return path == suffix || (path.size() > suffix.size() && path.ends_with(suffix) &&
                            path[path.size() - suffix.size() - 1] == '.');
}

// PEFT's name of projection `module` of the block: its shortest path suffix no other of `linears`
// ends with.
std::string PeftName(const std::vector<BlockLinear>& linears, const std::string& module) {
  for (size_t dot = module.rfind('.'); dot != std::string::npos && dot > 0;
       dot = module.rfind('.', dot - 1)) {
    const std::string_view suffix = std::string_view(module).substr(dot + 1);
    int sharing = 0;
    for (const BlockLinear& l : linears) sharing += PathEndsWith(l.module, suffix) ? 1 : 0;
    if (sharing == 1) return std::string(suffix);
  }
  return module;
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
  return Status::InvalidArgument("ferry holds NF4 projections of " + Nf4ModelTypes() +
                                 " models only; " + std::string(no_nf4));
}

std::string Nf4ModelTypes() {
  std::vector<ModelFamily> able;
  for (ModelFamily f : ModelFamilies()) {
    if (FamilyOf(f).no_nf4 == nullptr) able.push_back(f);
  }
  return ModelTypesList(able);
}

std::string BlockPrefix(const ModelConfig& c, int64_t block) {
  return NamesOf(c).block_prefix + std::to_string(block) + ".";
}

BlockParams BlockParamsOf(const ModelConfig& c) { return FamilyOf(c.family).block_params(c); }

BlockBufferBytes BlockBuffersOf(const ModelConfig& c, const LayerSpec& layer, int64_t tokens,
                                DType act) {
  assert(layer.kind == LayerKind::kBlock);
  // Each LoRA group's rank, by its module under the block prefix ("mlp.gate_up_proj").
  const std::string prefix = BlockPrefix(c, layer.block);
  std::map<std::string, int64_t, std::less<>> ranks;
  for (const ParamSpec& p : layer.params) {
    if (!p.lora || !p.name.ends_with(".lora_A.weight")) continue;
    const std::string group = LoraGroupOf(p);
    if (group.starts_with(prefix)) ranks[group.substr(prefix.size())] += p.shape[0];
  }
  const BlockBufferArgs args{.config = &c,
                             .tokens = tokens,
                             .act = act,
                             .lora_rank = [&ranks](std::string_view module) -> int64_t {
                               auto it = ranks.find(module);
                               return it == ranks.end() ? 0 : it->second;
                             }};
  return FamilyOf(c.family).buffer_bytes(args);
}

std::vector<std::string> PeftTargetModules(const ModelConfig& c, uint32_t targets) {
  const BlockParams b = BlockParamsOf(c);
  std::set<std::string> modules;
  for (const BlockLinear& l : b.linears) {
    if ((l.lora_bits & targets) != 0) modules.insert(PeftName(b.linears, l.module));
  }
  return {modules.begin(), modules.end()};
}

bool PeftFanInFanOut(const ModelConfig& c) {
  const BlockParams b = BlockParamsOf(c);
  return std::any_of(b.linears.begin(), b.linears.end(),
                     [](const BlockLinear& l) { return l.transposed; });
}

Result<uint32_t> PeftTargetBits(const ModelConfig& c, std::string_view module) {
  uint32_t bits = 0;
  for (const BlockLinear& l : BlockParamsOf(c).linears) {
    if (PathEndsWith(l.module, module) || PathEndsWith(module, l.module)) bits |= l.lora_bits;
  }
  if (bits == 0) {
    return Status::InvalidArgument("target module '" + std::string(module) +
                                   "' is not a projection ferry can adapt in a " + c.model_type +
                                   " model");
  }
  return bits;
}

EmbeddingShape EmbeddingShapeOf(const ModelConfig& c) {
  return {c.vocab_size, c.learned_positions ? c.max_position_embeddings : 0, c.hidden_size};
}

Result<HostEmbedding> FindHostEmbedding(const ModelConfig& c, const HostTensors& weights) {
  const FamilyNames& n = NamesOf(c);
  HostEmbedding e{.shape = EmbeddingShapeOf(c)};
  // fp32 in RAM, or a frozen table served from its model file (HostTensors::files).
  auto table = [&](const std::string& name, int64_t rows) -> Result<EmbeddingTable> {
    if (auto f = weights.files.find(name); f != weights.files.end()) {
      if (f->second.transposed || f->second.numel() != rows * c.hidden_size) {
        return Status::InvalidArgument("the weights' table '" + name + "' in " + f->second.path +
                                       " is not " + std::to_string(rows) + " x " +
                                       std::to_string(c.hidden_size));
      }
      return EmbeddingTable(f->second.bytes, f->second.dtype);
    }
    FERRY_ASSIGN_OR_RETURN(std::span<const float> values,
                           FindTable(weights.tensors, name, rows, c.hidden_size, "weights"));
    return EmbeddingTable(values);
  };
  FERRY_ASSIGN_OR_RETURN(e.wte, table(n.token_table, c.vocab_size));
  if (c.learned_positions) {
    FERRY_ASSIGN_OR_RETURN(e.wpe, table(n.position_table, c.max_position_embeddings));
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
